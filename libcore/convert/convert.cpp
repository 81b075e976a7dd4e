#include "convert/convert.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "formats/container_writer.h"
#include "model/checkpoint_source.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/io.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace coli {

namespace fs = std::filesystem;
using nlohmann::json;

std::string ConvertOptions::settings_string() const {
  return std::string("experts=") + format_name(experts) + " down=" + format_name(down) + " shared=" + format_name(shared) +
         " trunk=" + format_name(trunk) + " router=" + format_name(router) + " lm_head=" + format_name(lm_head) + " embed=" + format_name(embed);
}

QuantFormat ConvertOptions::format_of(TensorClass c) const {
  switch (c) {
    case TensorClass::kEmbed: return embed;
    case TensorClass::kLmHead: return lm_head;
    case TensorClass::kTrunk: return trunk;
    case TensorClass::kRouter: return router;
    case TensorClass::kShared: return shared;
    case TensorClass::kExperts: return experts;
    case TensorClass::kDown: return down;
    case TensorClass::kF32: return QuantFormat::F32;
  }
  throw Error("convert: unknown tensor class (internal)");
}

const char* const kEmbeddedFiles[5] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
                                        "chat_template.jinja"};
const char* const kSyntheticSourceName = "coli-convert synth";

namespace {

uint64_t fingerprint_of(const std::string& config_text, std::vector<FingerprintSample> samples, const std::string& settings) {
  std::sort(samples.begin(), samples.end(), [](const FingerprintSample& a, const FingerprintSample& b) { return a.name < b.name; });
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, config_text.data(), config_text.size());
  for (const FingerprintSample& s : samples) {
    const std::string d = s.name + ":" + s.format + ":" + s.shape;
    XXH64_update(st, d.data(), d.size());
    XXH64_update(st, s.head.data(), s.head.size());
    XXH64_update(st, s.tail.data(), s.tail.size());
  }
  XXH64_update(st, settings.data(), settings.size());
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

// Every tensor of a checkpoint the model does not ignore, companions
// (fp8 *_scale_inv) included: its name, dtype, shape and a sample of its
// bytes, the first and last 256.
std::vector<FingerprintSample> checkpoint_samples(CheckpointSource& cs) {
  std::vector<FingerprintSample> out;
  for (const auto& n : cs.names()) {
    if (is_ignored_tensor(n)) continue;
    const SourceTensor* t = cs.find(n);
    if (!t) continue;
    const std::size_t k = std::min<std::size_t>(256, t->nbytes);
    out.push_back({n, format_name(t->format), t->shape_str(), std::string(reinterpret_cast<const char*>(t->data), k),
                   std::string(reinterpret_cast<const char*>(t->data + t->nbytes - k), k)});
  }
  return out;
}

// A checkpoint directory as a conversion input: bound as a Model, read
// through its matrices (any source format, dequantized row by row).
class CheckpointInput : public ConvertInput {
 public:
  explicit CheckpointInput(const std::string& src)
      : src_(src),
        spec_(load_model_spec(src)),
        config_(read_text_file(src + "/config.json")),
        source_(std::make_shared<CheckpointSource>(src, spec_.tensor_prefix)),
        model_(Model::bind(spec_, source_, src)) {}
  const std::string& config_text() const override { return config_; }
  const ModelSpec& spec() const override { return spec_; }
  std::vector<TensorDesc> tensors() const override { return tensors_of(*model_); }
  QuantFormat source_format(const TensorDesc& t) const override {
    return t.form == TensorForm::kVector ? QuantFormat::F32 : matrix_of(*model_, t).format;
  }
  void rows_f32(const TensorDesc& t, int64_t r0, int64_t r1, float* dst) const override {
    if (t.form == TensorForm::kVector) {
      const std::vector<float>& v = vector_of(*model_, t);
      std::memcpy(dst, v.data(), v.size() * 4);
      return;
    }
    const Matrix& m = matrix_of(*model_, t);
    for (int64_t r = r0; r < r1; ++r) m.row_f32(r, dst + (r - r0) * m.cols);
  }
  std::optional<std::string> file(const std::string& name) const override {
    if (!fs::exists(fs::path(src_) / name)) return std::nullopt;
    return read_text_file((fs::path(src_) / name).string());
  }
  std::vector<FingerprintSample> fingerprint_samples() const override { return checkpoint_samples(*source_); }
  // A synthetic checkpoint's values are fixed by its config, wherever it
  // lies: named as write_synthetic_container names them (convert.h).
  std::string source_name() const override {
    return nlohmann::json::parse(config_).contains("coli_synthetic") ? kSyntheticSourceName : fs::absolute(src_).string();
  }
  std::string where() const override { return src_; }

 private:
  std::string src_;
  ModelSpec spec_;
  std::string config_;
  std::shared_ptr<CheckpointSource> source_;
  std::unique_ptr<Model> model_;
};

}  // namespace

uint64_t source_fingerprint(const std::string& src, const std::string& settings) {
  const ModelSpec spec = load_model_spec(src);
  CheckpointSource cs(src, spec.tensor_prefix);
  return fingerprint_of(read_text_file(src + "/config.json"), checkpoint_samples(cs), settings);
}

uint64_t source_fingerprint(const ConvertInput& in, const std::string& settings) {
  return fingerprint_of(in.config_text(), in.fingerprint_samples(), settings);
}

namespace {

// One unit of work: rows [r0, r1) of a table entry (a vector: its one
// row) into a part.
struct Job {
  int blob, part;
  std::size_t tensor;  // index into the input's tensors()
  int64_t r0 = 0, r1 = 0;
};

std::size_t shape_numel(const std::vector<int64_t>& shape) {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// A NaN or Inf weight would quantize to garbage (a NaN absmax poisons a
// whole row's scale) and only show up as NaN logits at run time: refuse it
// here, where every value passes through anyway.
void check_finite(const std::string& tensor, const float* v, int64_t row0, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows * cols; ++i)
    if (!std::isfinite(v[i]))
      throw Error("tensor " + tensor + ": non-finite value " + (std::isnan(v[i]) ? "nan" : v[i] > 0 ? "inf" : "-inf") + " at row " +
                  std::to_string(row0 + i / cols) + ", column " + std::to_string(i % cols));
}

}  // namespace

ConvertReport convert_checkpoint(const std::string& src, const std::string& out, const ConvertOptions& opt) {
  const CheckpointInput in(src);
  return convert_input(in, out, opt, "coli-convert");
}

ConvertReport convert_input(const ConvertInput& in, const std::string& out_arg, const ConvertOptions& opt, const std::string& label) {
  const auto t0 = std::chrono::steady_clock::now();
  const int threads = opt.threads > 0 ? opt.threads : default_threads();
  std::string out = out_arg;
  if (fs::is_directory(out)) out = (fs::path(out) / "model.coli").string();

  const ModelSpec& spec = in.spec();
  const uint64_t fp = source_fingerprint(in, opt.settings_string());

  ContainerWriter w(out, opt.overwrite);
  std::vector<Job> jobs;
  uint64_t bytes_in = 0;
  const std::vector<TensorDesc> tensors = in.tensors();
  for (std::size_t i = 0; i < tensors.size();) {
    const TensorDesc& t = tensors[i];
    if (t.expert < 0 && t.form == TensorForm::kVector) {
      const int b = w.add_tensor({t.name, QuantFormat::F32, t.shape});
      jobs.push_back({b, 0, i, 0, 1});
      bytes_in += layout_of(QuantFormat::F32, 1, static_cast<int64_t>(shape_numel(t.shape))).total;
      ++i;
      continue;
    }
    if (t.expert < 0) {
      const int64_t rows = t.shape.at(0), cols = t.shape.at(1);
      const int b = w.add_tensor({t.name, opt.format_of(t.cls), {rows, cols}});
      const int64_t step = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(1, cols));
      for (int64_t r = 0; r < rows; r += step) jobs.push_back({b, 0, i, r, std::min(rows, r + step)});
      bytes_in += layout_of(in.source_format(t), rows, cols).total;
      ++i;
      continue;
    }
    // One blob per routed expert, its parts in table order.
    std::size_t end = i;
    std::vector<PartSpec> parts;
    for (; end < tensors.size() && tensors[end].layer == t.layer && tensors[end].expert == t.expert; ++end)
      parts.push_back({tensors[end].name, opt.format_of(tensors[end].cls), tensors[end].shape});
    const int b = w.add_expert(t.layer, t.expert, parts);
    for (std::size_t k = i; k < end; ++k) {
      const int64_t rows = tensors[k].shape.at(0), cols = tensors[k].shape.at(1);
      jobs.push_back({b, static_cast<int>(k - i), k, 0, rows});
      bytes_in += layout_of(in.source_format(tensors[k]), rows, cols).total;
    }
    i = end;
  }
  for (const char* f : kEmbeddedFiles)
    if (auto text = in.file(f)) w.add_file(f, std::move(*text));

  w.allocate();
  Progress bar(label, w.data_bytes(), opt.progress);
  parallel_for(jobs.size(), threads, [&](std::size_t i) {
    const Job& j = jobs[i];
    const TensorDesc& t = tensors[j.tensor];
    const BlobPart& p = w.blob(j.blob).parts[j.part];
    uint8_t* dst = w.part_data(j.blob, j.part);
    if (t.form == TensorForm::kVector) {
      std::vector<float> v(shape_numel(t.shape));
      in.rows_f32(t, 0, 1, v.data());
      check_finite(p.name, v.data(), 0, 1, static_cast<int64_t>(v.size()));
      std::memcpy(dst, v.data(), v.size() * 4);
      bar.add(p.bytes);
      return;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<float> buf(static_cast<std::size_t>((j.r1 - j.r0) * cols));
    in.rows_f32(t, j.r0, j.r1, buf.data());
    check_finite(p.name, buf.data(), j.r0, j.r1 - j.r0, cols);
    quantize_rows(p.format, buf.data(), j.r0, j.r1 - j.r0, rows, cols, dst);
    bar.add(p.bytes * (j.r1 - j.r0) / rows);
  });
  bar.finish();

  json config = json::parse(in.config_text());
  json settings = {{"formats", {{"experts", format_name(opt.experts)}, {"down", format_name(opt.down)}, {"shared", format_name(opt.shared)},
                                {"trunk", format_name(opt.trunk)}, {"router", format_name(opt.router)}, {"lm_head", format_name(opt.lm_head)},
                                {"embed", format_name(opt.embed)}}},
                   {"source", in.source_name()},
                   {"source_layout", spec.multimodal ? "multimodal" : "text"},
                   {"tool", "coli-convert"}};
  // The container stores canonical (text-only) names: flatten a nested config.
  if (spec.multimodal) {
    json text = config["text_config"];
    for (const char* k : {"tie_word_embeddings", "eos_token_id"})
      if (!text.contains(k) && config.contains(k)) text[k] = config[k];
    text["model_type"] = "qwen3_5_moe_text";
    config = text;
  }
  // The size of the file this run wrote: the path may name another file
  // by the time we look (a --force run of someone else).
  const uint64_t bytes_out = w.finish(fp, config, settings, threads);

  ConvertReport rep;
  rep.out = out;
  rep.fingerprint = fp;
  rep.bytes_in = bytes_in;
  rep.blobs = w.num_blobs();
  const auto t1 = std::chrono::steady_clock::now();
  rep.seconds = std::chrono::duration<double>(t1 - t0).count();
  if (opt.verify) {
    Container c(out, fp);
    Progress vbar("verify      ", w.data_bytes(), opt.progress);
    uint64_t seen = 0;
    c.verify_checksums([&](uint64_t done, uint64_t) {
      vbar.add(done - seen);
      seen = done;
    });
    vbar.finish();
    // Every tensor binds, with the shapes the model needs.
    Model::load(out);
    rep.verify_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  rep.bytes_out = bytes_out;
  return rep;
}

}  // namespace coli
