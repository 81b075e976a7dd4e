#include "convert/synth.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <vector>

#include "convert/convert.h"
#include "convert/convert_input.h"
#include "convert/synth_model.h"
#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "model/fused_projections.h"
#include "model/model_spec.h"
#include "util/error.h"
#include "util/io.h"
#include "util/parallel.h"
#include "util/progress.h"
#include "util/publish.h"

namespace coli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Placed {
  const SynthModel::Tensor* t;
  int shard = 0;
  uint64_t offset = 0;  // within its shard's data section
};

std::string safetensors_header(const std::vector<const Placed*>& ts) {
  json h = json::object();
  for (const Placed* p : ts) {
    const uint64_t nb = static_cast<uint64_t>(p->t->numel()) * 2;
    h[p->t->name] = {{"dtype", "BF16"}, {"shape", p->t->shape}, {"data_offsets", {p->offset, p->offset + nb}}};
  }
  h["__metadata__"] = {{"format", "pt"}};
  std::string s = h.dump();
  while ((s.size() + 8) % 64) s += ' ';  // data starts 64-byte aligned
  return s;
}

// pwrite until done; errors name the file and say why.
void write_all(int fd, const std::string& path, const void* data, std::size_t n, uint64_t off) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw Error(path + ": " + std::strerror(errno) + " (writing " + std::to_string(n) + " bytes at " + std::to_string(off) + ")");
    if (w == 0) throw Error(path + ": short write at " + std::to_string(off));
    p += w, n -= static_cast<std::size_t>(w), off += static_cast<uint64_t>(w);
  }
}

}  // namespace

SynthReport write_synthetic_checkpoint(const std::string& out, const SynthOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const SynthModel model(o);
  // DIR.tmp.PID, published at the end without replacing anything but an
  // empty directory or (with --force) a checkpoint; removed on failure.
  OutputDir dir(out, o.overwrite);
  const std::string& tmp = dir.temp_path();

  // Shards: tensors in order, a new shard when one would pass shard_bytes.
  std::vector<Placed> placed;
  placed.reserve(model.tensors().size());
  std::vector<std::vector<const Placed*>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& t : model.tensors()) {
    const uint64_t nb = static_cast<uint64_t>(t.numel()) * 2;
    if (in_shard > 0 && in_shard + nb > o.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    placed.push_back({&t, static_cast<int>(shards.size() - 1), in_shard});
    in_shard += nb;
    total += nb;
    shards.back().push_back(&placed.back());
  }
  const int ns = static_cast<int>(shards.size());
  auto shard_name = [&](int s) {
    char b[64];
    std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", s + 1, ns);
    return std::string(b);
  };
  struct Fds {
    std::vector<int> v;
    ~Fds() {
      for (int fd : v)
        if (fd >= 0) ::close(fd);
    }
  } open_fds{std::vector<int>(ns, -1)};
  std::vector<int>& fds = open_fds.v;
  std::vector<uint64_t> data_start(ns);
  json weight_map = json::object();
  for (int s = 0; s < ns; ++s) {
    const std::string hdr = safetensors_header(shards[s]);
    const std::string path = dir.file(shard_name(s));
    fds[s] = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fds[s] < 0) throw Error(path + ": " + std::strerror(errno) + " (cannot create)");
    std::string head(8, '\0');
    for (int i = 0; i < 8; ++i) head[i] = static_cast<char>(uint64_t(hdr.size()) >> (8 * i));
    head += hdr;
    uint64_t shard_bytes = head.size();
    for (const Placed* p : shards[s]) shard_bytes += static_cast<uint64_t>(p->t->numel()) * 2;
    // Every byte up front: a full disk fails here, before minutes of work.
    reserve_space(fds[s], path, shard_bytes);
    write_all(fds[s], path, head.data(), head.size(), 0);
    data_start[s] = head.size();
    for (const Placed* p : shards[s]) weight_map[p->t->name] = shard_name(s);
  }

  // Jobs: tensors split into chunks of at most 8M values.
  struct Job {
    const Placed* p;
    int64_t i0, n;
  };
  std::vector<Job> jobs;
  constexpr int64_t kChunk = 8 << 20;
  for (const auto& p : placed)
    for (int64_t i = 0; i < p.t->numel(); i += kChunk) jobs.push_back({&p, i, std::min(kChunk, p.t->numel() - i)});
  Progress bar("coli-convert synth", total, o.progress);
  parallel_for(jobs.size(), o.threads > 0 ? o.threads : default_threads(), [&](std::size_t k) {
    const Job& j = jobs[k];
    std::vector<uint16_t> buf(static_cast<std::size_t>(j.n));
    model.fill(*j.p->t, j.i0, j.n, buf.data());
    const uint64_t off = data_start[j.p->shard] + j.p->offset + static_cast<uint64_t>(j.i0) * 2;
    write_all(fds[j.p->shard], tmp + "/" + shard_name(j.p->shard), buf.data(), buf.size() * 2, off);
    bar.add(static_cast<uint64_t>(j.n) * 2);
  });
  bar.finish();
  for (int s = 0; s < ns; ++s) {
    if (::fsync(fds[s]) != 0) throw Error(tmp + "/" + shard_name(s) + ": " + std::strerror(errno) + " (fsync)");
    ::close(fds[s]);
    fds[s] = -1;
  }

  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir.file(name);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(path + ": " + std::strerror(errno) + " (cannot create)");
    try {
      write_all(fd, path, text.data(), text.size(), 0);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  };
  write("config.json", model.config_text());
  write("generation_config.json", model.generation_config_text());
  write("model.safetensors.index.json", json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(1) + "\n");
  if (!o.tokenizer_dir.empty())
    for (const std::string& f : SynthModel::tokenizer_files())
      if (fs::exists(fs::path(o.tokenizer_dir) / f)) fs::copy_file(fs::path(o.tokenizer_dir) / f, dir.file(f));

  dir.publish();
  SynthReport rep;
  rep.bytes = total;
  rep.params = model.params();
  rep.shards = ns;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

namespace {

// The synthetic model as a conversion input: each range of values computed
// when the pipeline asks for it, from the same plan the checkpoint writer
// uses, so it reads as the checkpoint would (bf16 values, upcast exactly).
class SynthInput : public ConvertInput {
 public:
  explicit SynthInput(const SynthOptions& o)
      : model_(o), spec_(parse_model_spec(model_.config_text(), "synth: config")) {
    // The checkpoint path binds the model and keeps its own lm_head when
    // the checkpoint has one; synth always writes it.
    tensors_ = tensors_of(spec_, true);
    for (const TensorDesc& t : tensors_)
      if (!source_of(t, 0).first) throw Error("synth: the plan has no '" + t.name + "' (internal)");
  }
  // The plan's tensor holding row r of entry t, and the row there: itself,
  // or for qwen3_next's split DeltaNet projections a row of the fused ones
  // the checkpoint holds (model/fused_projections.h).
  std::pair<const SynthModel::Tensor*, int64_t> source_of(const TensorDesc& t, int64_t r) const {
    if (!spec_.fused_linear_projections || !is_split_projection(t.role)) return {model_.find(t.name), r};
    const FusedRow f = fused_row(spec_, t.role, r);
    return {model_.find(t.name.substr(0, t.name.find("linear_attn.")) + (f.ba ? kFusedBa : kFusedQkvz)), f.row};
  }
  const std::string& config_text() const override { return model_.config_text(); }
  const ModelSpec& spec() const override { return spec_; }
  std::vector<TensorDesc> tensors() const override { return tensors_; }
  QuantFormat source_format(const TensorDesc&) const override { return QuantFormat::BF16; }
  void rows_f32(const TensorDesc& t, int64_t r0, int64_t r1, float* dst) const override {
    if (spec_.fused_linear_projections && is_split_projection(t.role)) {  // row by row from the fused tensors
      const int64_t cols = t.shape.at(1);
      std::vector<uint16_t> buf(static_cast<std::size_t>(cols));
      for (int64_t r = r0; r < r1; ++r) {
        const auto [p, row] = source_of(t, r);
        model_.fill(*p, row * cols, cols, buf.data());
        for (int64_t i = 0; i < cols; ++i) dst[(r - r0) * cols + i] = bf16_to_f32(buf[i]);
      }
      return;
    }
    const SynthModel::Tensor& p = *model_.find(t.name);
    const int64_t cols = t.form == TensorForm::kVector ? p.numel() : p.shape.back();
    const int64_t n = (r1 - r0) * cols;
    std::vector<uint16_t> buf(static_cast<std::size_t>(n));
    model_.fill(p, r0 * cols, n, buf.data());
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(buf[i]);
  }
  std::optional<std::string> file(const std::string& name) const override {
    if (name == "generation_config.json") return model_.generation_config_text();
    const std::string& dir = model_.options().tokenizer_dir;
    const auto& tok = SynthModel::tokenizer_files();
    if (dir.empty() || std::find(tok.begin(), tok.end(), name) == tok.end() || !fs::exists(fs::path(dir) / name)) return std::nullopt;
    return read_text_file((fs::path(dir) / name).string());
  }
  std::vector<FingerprintSample> fingerprint_samples() const override {
    std::vector<FingerprintSample> out;
    for (const SynthModel::Tensor& t : model_.tensors()) {
      // The bytes a checkpoint would hold: first and last min(256, size).
      const int64_t k = std::min<int64_t>(128, t.numel());
      std::vector<uint16_t> head(k), tail(k);
      model_.fill(t, 0, k, head.data());
      model_.fill(t, t.numel() - k, k, tail.data());
      out.push_back({t.name, format_name(QuantFormat::BF16), shape_string(t.shape), std::string(reinterpret_cast<const char*>(head.data()), k * 2),
                     std::string(reinterpret_cast<const char*>(tail.data()), k * 2)});
    }
    return out;
  }
  std::string source_name() const override { return kSyntheticSourceName; }
  std::string where() const override { return "synth"; }

 private:
  SynthModel model_;
  ModelSpec spec_;
  std::vector<TensorDesc> tensors_;
};

}  // namespace

ConvertReport write_synthetic_container(const std::string& out, const SynthOptions& so, const ConvertOptions& co) {
  const SynthInput in(so);
  return convert_input(in, out, co, "coli-convert synth");
}

}  // namespace coli
