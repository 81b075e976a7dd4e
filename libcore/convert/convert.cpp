#include "convert/convert.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

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

uint64_t source_fingerprint(const std::string& src, const std::string& settings) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  const std::string cfg = read_text_file(src + "/config.json");
  XXH64_update(st, cfg.data(), cfg.size());
  const ModelSpec spec = load_model_spec(src);
  CheckpointSource cs(src, spec.tensor_prefix);
  auto names = cs.names();
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    if (is_ignored_tensor(n)) continue;
    const SourceTensor* t = cs.find(n);
    if (!t) continue;
    const std::string d = n + ":" + format_name(t->format) + ":" + t->shape_str();
    XXH64_update(st, d.data(), d.size());
    // A sample of the bytes: the first and last 256 of every tensor.
    const std::size_t k = std::min<std::size_t>(256, t->nbytes);
    XXH64_update(st, t->data, k);
    XXH64_update(st, t->data + t->nbytes - k, k);
  }
  XXH64_update(st, settings.data(), settings.size());
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

namespace {

// One unit of work: rows [r0, r1) of a matrix (or a whole vector) into a part.
struct Job {
  int blob, part;
  const Matrix* m = nullptr;              // 2-D source
  const std::vector<float>* v = nullptr;  // vector source (f32)
  int64_t r0 = 0, r1 = 0;
};

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

ConvertReport convert_checkpoint(const std::string& src, const std::string& out_arg, const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const int threads = opt.threads > 0 ? opt.threads : default_threads();
  std::string out = out_arg;
  if (fs::is_directory(out)) out = (fs::path(out) / "model.coli").string();

  const ModelSpec spec = load_model_spec(src);
  auto source = std::make_shared<CheckpointSource>(src, spec.tensor_prefix);
  auto model = Model::bind(spec, source, src);
  const uint64_t fp = source_fingerprint(src, opt.settings_string());

  ContainerWriter w(out, opt.overwrite);
  std::vector<Job> jobs;
  std::deque<Matrix> keep;  // matrix views the jobs point to (a deque keeps them in place)
  uint64_t bytes_in = 0;
  auto add_matrix = [&](const std::string& name, const Matrix& m, QuantFormat f) {
    const int b = w.add_tensor({name, f, {m.rows, m.cols}});
    keep.push_back(m);
    const int64_t step = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(1, m.cols));
    for (int64_t r = 0; r < m.rows; r += step) jobs.push_back({b, 0, &keep.back(), nullptr, r, std::min(m.rows, r + step)});
    bytes_in += m.bytes();
  };
  auto add_vector = [&](const std::string& name, const std::vector<float>& v, std::vector<int64_t> shape) {
    const int b = w.add_tensor({name, QuantFormat::F32, shape});
    jobs.push_back({b, 0, nullptr, &v, 0, 0});
    bytes_in += v.size() * 4;
  };

  const std::vector<TensorDesc> tensors = tensors_of(*model);
  for (std::size_t i = 0; i < tensors.size();) {
    const TensorDesc& t = tensors[i];
    if (t.expert < 0) {
      if (t.form == TensorForm::kVector) add_vector(t.name, vector_of(*model, t), t.shape);
      else add_matrix(t.name, matrix_of(*model, t), opt.format_of(t.cls));
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
      keep.push_back(matrix_of(*model, tensors[k]));
      jobs.push_back({b, static_cast<int>(k - i), &keep.back(), nullptr, 0, keep.back().rows});
      bytes_in += keep.back().bytes();
    }
    i = end;
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json", "chat_template.jinja"})
    if (fs::exists(fs::path(src) / f)) w.add_file(f, read_text_file((fs::path(src) / f).string()));

  w.allocate();
  Progress bar("coli-convert", w.data_bytes(), opt.progress);
  parallel_for(jobs.size(), threads, [&](std::size_t i) {
    const Job& j = jobs[i];
    const BlobPart& p = w.blob(j.blob).parts[j.part];
    uint8_t* dst = w.part_data(j.blob, j.part);
    if (j.v) {
      check_finite(p.name, j.v->data(), 0, 1, static_cast<int64_t>(j.v->size()));
      std::memcpy(dst, j.v->data(), j.v->size() * 4);
      bar.add(p.bytes);
      return;
    }
    const Matrix& m = *j.m;
    std::vector<float> rows(static_cast<std::size_t>((j.r1 - j.r0) * m.cols));
    for (int64_t r = j.r0; r < j.r1; ++r) m.row_f32(r, rows.data() + (r - j.r0) * m.cols);
    check_finite(p.name, rows.data(), j.r0, j.r1 - j.r0, m.cols);
    quantize_rows(p.format, rows.data(), j.r0, j.r1 - j.r0, m.rows, m.cols, dst);
    bar.add(p.bytes * (j.r1 - j.r0) / m.rows);
  });
  bar.finish();

  json config = json::parse(read_text_file(src + "/config.json"));
  json settings = {{"formats", {{"experts", format_name(opt.experts)}, {"down", format_name(opt.down)}, {"shared", format_name(opt.shared)},
                                {"trunk", format_name(opt.trunk)}, {"router", format_name(opt.router)}, {"lm_head", format_name(opt.lm_head)},
                                {"embed", format_name(opt.embed)}}},
                   {"source", fs::absolute(src).string()},
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
