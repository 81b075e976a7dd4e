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
#include <vector>

#include "formats/dtype.h"
#include "model/layer_tensors.h"
#include "util/error.h"
#include "util/io.h"
#include "util/parallel.h"
#include "util/progress.h"
#include "util/publish.h"

namespace coli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr float kChannel0 = 64.0f;  // the routing-bias channel's constant

inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// Uniform in (0, 1) from 24 random bits.
inline float unit(uint64_t r) { return (static_cast<float>(r >> 40) + 0.5f) * (1.0f / 16777216.0f); }

enum class Init { Normal, Zeros, Ones, Uniform, ALog, Router, Embed, NormMasked };

struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
  float a = 0, b = 0;   // std, or [a, b)
  bool zero_row0 = false;  // output projections: channel 0 of the residual is never written
  int layer = -1;
  int shard = 0;
  uint64_t offset = 0;  // within its shard's data section
  uint64_t id = 0;      // stream id for the RNG
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

// Value i of a tensor: pure function of (seed, tensor id, i).
struct Generator {
  uint64_t seed;
  double skew;
  int hidden;
  const std::vector<std::vector<int>>* ranks;  // per layer: expert -> rank (1-based)

  void fill(const TensorPlan& t, int64_t i0, int64_t n, uint16_t* out) const {
    const int64_t cols = t.shape.back();
    const uint64_t base = splitmix(seed ^ splitmix(t.id));
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = i0 + k;
      const uint64_t r = splitmix(base + static_cast<uint64_t>(i));
      float v = 0;
      switch (t.init) {
        case Init::Normal:
        case Init::Embed:
        case Init::Router: {
          // Box-Muller; the second draw of the pair is not needed.
          const float u1 = unit(r), u2 = unit(splitmix(r));
          v = t.a * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
          break;
        }
        case Init::Zeros: v = 0; break;
        case Init::Ones: v = 1; break;
        case Init::Uniform: v = t.a + (t.b - t.a) * unit(r); break;
        case Init::ALog: v = std::log(t.a + (t.b - t.a) * unit(r)); break;
        case Init::NormMasked: v = 0; break;
      }
      const int64_t row = i / cols, col = i % cols;
      if (skew > 0) {
        if (t.init == Init::Embed && col == 0) v = kChannel0;
        if (t.init == Init::NormMasked && i == 0) v = -1.0f;
        if (t.init == Init::Router && col == 0) v = static_cast<float>(-skew * std::log(double((*ranks)[t.layer][row])) / std::sqrt(double(hidden)));
        if (t.zero_row0 && row == 0) v = 0;
      }
      out[k] = f32_to_bf16(v);
    }
  }
};

std::string safetensors_header(const std::vector<const TensorPlan*>& ts) {
  json h = json::object();
  for (const TensorPlan* t : ts) {
    const uint64_t nb = static_cast<uint64_t>(t->numel()) * 2;
    h[t->name] = {{"dtype", "BF16"}, {"shape", t->shape}, {"data_offsets", {t->offset, t->offset + nb}}};
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
  if (o.layers < 1) throw Error("synth: --layers must be at least 1");
  if (o.routing_skew < 0) throw Error("synth: --routing-skew must be >= 0");
  // DIR.tmp.PID, published at the end without replacing anything but an
  // empty directory or (with --force) a checkpoint; removed on failure.
  OutputDir dir(out, o.overwrite);
  const std::string& tmp = dir.temp_path();

  const int H = o.hidden, I = o.moe_inter, SI = o.shared_inter, E = o.experts;
  const bool skew = o.routing_skew > 0;
  // Router columns other than channel 0: keep the token-dependent logits O(1)
  // though channel 0 dominates the norm (see synth.h).
  const float router_std = skew ? kChannel0 / (std::sqrt(float(H)) * 0.02f * std::sqrt(float(H - 1))) : 0.02f;

  std::vector<TensorPlan> plan;
  auto add = [&](std::string name, std::vector<int64_t> shape, Init init, float a = 0.02f, float b = 0, int layer = -1, bool zero_row0 = false) {
    TensorPlan t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.init = init;
    t.a = a;
    t.b = b;
    t.layer = layer;
    t.zero_row0 = zero_row0;
    t.id = plan.size();
    plan.push_back(std::move(t));
  };
  // The plan walks the tensor table. Its order numbers each tensor's random
  // stream, and predates the table: the final norm and lm_head follow the
  // layers, a DeltaNet's out_proj follows its vectors. Kept, so a seed
  // still writes the same checkpoint.
  ModelSpec spec;
  spec.vocab_size = o.vocab, spec.hidden_size = H, spec.num_layers = o.layers;
  spec.num_heads = o.heads, spec.num_kv_heads = o.kv_heads, spec.head_dim = o.head_dim;
  spec.linear_num_key_heads = o.lin_k_heads, spec.linear_num_value_heads = o.lin_v_heads;
  spec.linear_key_head_dim = o.lin_k_dim, spec.linear_value_head_dim = o.lin_v_dim, spec.linear_conv_kernel = o.conv;
  spec.num_experts = E, spec.num_experts_per_tok = o.top_k, spec.moe_intermediate_size = I, spec.shared_expert_intermediate_size = SI;
  std::vector<std::string> layer_types;
  for (int l = 0; l < o.layers; ++l) {
    const bool attn = (l + 1) % 4 == 0;
    spec.layer_kinds.push_back(attn ? LayerKind::kFullAttention : LayerKind::kLinearAttention);
    layer_types.push_back(attn ? "full_attention" : "linear_attention");
  }
  // transformers' init of each tensor (and the routing-bias twists, synth.h).
  auto add_entry = [&](const TensorDesc& t) {
    switch (t.role) {
      case TensorRole::kEmbed: return add(t.name, t.shape, Init::Embed);
      case TensorRole::kFinalNorm:
      case TensorRole::kInputNorm: return add(t.name, t.shape, skew ? Init::NormMasked : Init::Zeros);
      case TensorRole::kPostNorm:
      case TensorRole::kQNorm:
      case TensorRole::kKNorm: return add(t.name, t.shape, Init::Zeros);
      case TensorRole::kConv1d: return add(t.name, t.shape, Init::Uniform, -0.5f, 0.5f);
      case TensorRole::kDtBias:
      case TensorRole::kLinearNorm: return add(t.name, t.shape, Init::Ones);
      case TensorRole::kALog: return add(t.name, t.shape, Init::ALog, 0.5f, 16.0f);
      case TensorRole::kRouter: return add(t.name, t.shape, Init::Router, router_std, 0, t.layer);
      // Output projections: channel 0 of the residual is never written.
      case TensorRole::kOProj:
      case TensorRole::kOutProj:
      case TensorRole::kSharedDown:
      case TensorRole::kExpertDown: return add(t.name, t.shape, Init::Normal, 0.02f, 0, t.layer, true);
      default: return add(t.name, t.shape, Init::Normal);
    }
  };
  const std::vector<TensorDesc> outer = model_tensors(spec, true);
  for (const TensorDesc& t : outer)
    if (t.role == TensorRole::kEmbed) add_entry(t);
  for (int l = 0; l < o.layers; ++l) {
    std::vector<TensorDesc> ts = layer_tensors(spec, l);
    const auto is = [](TensorRole r) { return [r](const TensorDesc& t) { return t.role == r; }; };
    const auto out_proj = std::find_if(ts.begin(), ts.end(), is(TensorRole::kOutProj));
    if (out_proj != ts.end()) std::rotate(out_proj, out_proj + 1, std::find_if(ts.begin(), ts.end(), is(TensorRole::kRouter)));
    for (const TensorDesc& t : ts) add_entry(t);
  }
  for (const TensorDesc& t : outer)
    if (t.role != TensorRole::kEmbed) add_entry(t);

  // Per-layer expert ranking for the Zipf bias.
  std::vector<std::vector<int>> ranks(o.layers, std::vector<int>(E));
  for (int l = 0; l < o.layers; ++l) {
    std::iota(ranks[l].begin(), ranks[l].end(), 1);
    uint64_t r = splitmix(o.seed * 1000003 + l);
    for (int i = E - 1; i > 0; --i) {
      r = splitmix(r);
      std::swap(ranks[l][i], ranks[l][r % (i + 1)]);
    }
  }

  // Shards: tensors in order, a new shard when one would pass shard_bytes.
  std::vector<std::vector<const TensorPlan*>> shards(1);
  uint64_t in_shard = 0, total = 0, params = 0;
  for (auto& t : plan) {
    const uint64_t nb = static_cast<uint64_t>(t.numel()) * 2;
    if (in_shard > 0 && in_shard + nb > o.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    t.shard = static_cast<int>(shards.size() - 1);
    t.offset = in_shard;
    in_shard += nb;
    total += nb;
    params += static_cast<uint64_t>(t.numel());
    shards.back().push_back(&t);
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
    for (const TensorPlan* t : shards[s]) shard_bytes += static_cast<uint64_t>(t->numel()) * 2;
    // Every byte up front: a full disk fails here, before minutes of work.
    reserve_space(fds[s], path, shard_bytes);
    write_all(fds[s], path, head.data(), head.size(), 0);
    data_start[s] = head.size();
    for (const TensorPlan* t : shards[s]) weight_map[t->name] = shard_name(s);
  }

  // Jobs: tensors split into chunks of at most 8M values.
  struct Job {
    const TensorPlan* t;
    int64_t i0, n;
  };
  std::vector<Job> jobs;
  constexpr int64_t kChunk = 8 << 20;
  for (const auto& t : plan)
    for (int64_t i = 0; i < t.numel(); i += kChunk) jobs.push_back({&t, i, std::min(kChunk, t.numel() - i)});
  Generator gen{o.seed, o.routing_skew, H, &ranks};
  Progress bar("coli-convert synth", total, o.progress);
  parallel_for(jobs.size(), o.threads > 0 ? o.threads : default_threads(), [&](std::size_t k) {
    const Job& j = jobs[k];
    std::vector<uint16_t> buf(static_cast<std::size_t>(j.n));
    gen.fill(*j.t, j.i0, j.n, buf.data());
    const uint64_t off = data_start[j.t->shard] + j.t->offset + static_cast<uint64_t>(j.i0) * 2;
    write_all(fds[j.t->shard], tmp + "/" + shard_name(j.t->shard), buf.data(), buf.size() * 2, off);
    bar.add(static_cast<uint64_t>(j.n) * 2);
  });
  bar.finish();
  for (int s = 0; s < ns; ++s) {
    if (::fsync(fds[s]) != 0) throw Error(tmp + "/" + shard_name(s) + ": " + std::strerror(errno) + " (fsync)");
    ::close(fds[s]);
    fds[s] = -1;
  }

  json cfg = {
      {"architectures", {"Qwen3_5MoeForCausalLM"}},
      {"model_type", "qwen3_5_moe_text"},
      {"dtype", "bfloat16"},
      {"vocab_size", o.vocab},
      {"hidden_size", H},
      {"num_hidden_layers", o.layers},
      {"layer_types", layer_types},
      {"num_attention_heads", o.heads},
      {"num_key_value_heads", o.kv_heads},
      {"head_dim", o.head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", 262144},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25},
                           {"mrope_section", {11, 11, 10}}, {"mrope_interleaved", true}}},
      {"partial_rotary_factor", 0.25},
      {"linear_conv_kernel_dim", o.conv},
      {"linear_key_head_dim", o.lin_k_dim},
      {"linear_value_head_dim", o.lin_v_dim},
      {"linear_num_key_heads", o.lin_k_heads},
      {"linear_num_value_heads", o.lin_v_heads},
      {"num_experts", E},
      {"num_experts_per_tok", o.top_k},
      {"moe_intermediate_size", I},
      {"shared_expert_intermediate_size", SI},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", false},
      {"use_cache", true},
      {"bos_token_id", nullptr},
      {"eos_token_id", 248046},
      {"pad_token_id", 248044},
      {"coli_synthetic", {{"seed", o.seed}, {"routing_skew", o.routing_skew}, {"note", "random weights for benchmarks; see coli-convert(1)"}}},
  };
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
  write("config.json", cfg.dump(2) + "\n");
  write("generation_config.json", json{{"bos_token_id", nullptr}, {"eos_token_id", {248046, 248044}}, {"pad_token_id", 248044}}.dump(2) + "\n");
  write("model.safetensors.index.json", json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(1) + "\n");
  if (!o.tokenizer_dir.empty())
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "LICENSE"})
      if (fs::exists(fs::path(o.tokenizer_dir) / f)) fs::copy_file(fs::path(o.tokenizer_dir) / f, dir.file(f));

  dir.publish();
  SynthReport rep;
  rep.bytes = total;
  rep.params = params;
  rep.shards = ns;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace coli
