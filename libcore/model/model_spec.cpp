#include "model/model_spec.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.h"
#include "util/io.h"

namespace coli {

using nlohmann::json;

const char* family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kQwen35Moe: return "qwen3_5_moe";
    case ModelFamily::kQwen3Moe: return "qwen3_moe";
    case ModelFamily::kQwen3Next: return "qwen3_next";
  }
  return "?";
}

int ModelSpec::num_attention_layers() const {
  int n = 0;
  for (auto k : layer_kinds) n += k == LayerKind::kFullAttention;
  return n;
}

namespace {

struct Reader {
  const json& j;
  std::string where;  // "config.json" or "config.json: text_config"

  Error err(const std::string& key, const std::string& why) const { return Error(where + ": '" + key + "' " + why); }
  const json& need(const char* key) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) throw err(key, "is missing");
    return *it;
  }
  int pos_int(const char* key) const {
    const json& v = need(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 30)) throw err(key, "must be a positive integer");
    return v.get<int>();
  }
  int int_or(const char* key, int def) const { return j.contains(key) && !j[key].is_null() ? pos_int(key) : def; }
  // Finite: JSON has no NaN and the parser refuses literals that overflow.
  double num_or(const char* key, double def) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_number()) throw err(key, "must be a number");
    return it->get<double>();
  }
  // A positive finite float: a scale, a base or an epsilon.
  double pos_num_or(const char* key, double def) const {
    const double v = num_or(key, def);
    if (!(v > 0)) throw err(key, "must be a positive number, not " + j.find(key)->dump());
    return v;
  }
  bool bool_or(const char* key, bool def) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_boolean()) throw err(key, "must be true or false");
    return it->get<bool>();
  }
};

}  // namespace

ModelSpec parse_model_spec(const std::string& text, const std::string& path) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) throw Error(path + ": not a JSON object");
  ModelSpec s;
  if (!root.contains("model_type") || !root["model_type"].is_string()) throw Error(path + ": 'model_type' is missing");
  s.model_type = root["model_type"].get<std::string>();
  if (s.model_type == "qwen3_5_moe" || s.model_type == "qwen3_5_moe_text") s.family = ModelFamily::kQwen35Moe;
  else if (s.model_type == "qwen3_moe") s.family = ModelFamily::kQwen3Moe;
  else if (s.model_type == "qwen3_next") s.family = ModelFamily::kQwen3Next;
  else throw Error(path + ": model_type '" + s.model_type + "' is not supported (coli runs qwen3_5_moe, qwen3_5_moe_text, qwen3_moe and qwen3_next)");
  const bool q35 = s.family == ModelFamily::kQwen35Moe, moe_only = s.family == ModelFamily::kQwen3Moe;
  s.norm_plus_one = !moe_only, s.attention_output_gate = !moe_only, s.fused_linear_projections = s.family == ModelFamily::kQwen3Next;

  const json* tc = &root;
  std::string where = path;
  if (q35 && root.contains("text_config") && root["text_config"].is_object()) {
    tc = &root["text_config"];
    where = path + ": text_config";
    s.multimodal = true;
    if (tc->contains("model_type") && (*tc)["model_type"] != "qwen3_5_moe_text" && (*tc)["model_type"] != "qwen3_5_moe")
      throw Error(where + ": model_type '" + (*tc)["model_type"].dump() + "' is not supported (expected qwen3_5_moe_text)");
  }
  s.tensor_prefix = s.multimodal ? "model.language_model." : "model.";
  Reader r{*tc, where};

  s.vocab_size = r.pos_int("vocab_size");
  s.hidden_size = r.pos_int("hidden_size");
  s.num_layers = r.pos_int("num_hidden_layers");
  s.rms_norm_eps = static_cast<float>(r.pos_num_or("rms_norm_eps", 1e-6));
  if (!(s.rms_norm_eps > 0)) throw r.err("rms_norm_eps", "underflows float32");
  s.max_position_embeddings = r.int_or("max_position_embeddings", 0);
  // tie_word_embeddings may sit at the top level of a multimodal config.
  s.tie_word_embeddings = r.bool_or("tie_word_embeddings", Reader{root, path}.bool_or("tie_word_embeddings", false));
  if (r.bool_or("attention_bias", false)) throw r.err("attention_bias", "= true is not supported");
  if (r.bool_or("use_sliding_window", false)) throw r.err("use_sliding_window", "= true is not supported");

  s.num_heads = r.pos_int("num_attention_heads");
  s.num_kv_heads = r.pos_int("num_key_value_heads");
  s.head_dim = r.int_or("head_dim", s.hidden_size / s.num_heads);
  if (s.num_heads % s.num_kv_heads) throw r.err("num_key_value_heads", "must divide num_attention_heads");

  // Rotary embedding: rope_parameters (transformers >= 5) or the older flat
  // keys. qwen3_next's config defaults the partial factor to 0.25.
  double factor = r.num_or("partial_rotary_factor", s.family == ModelFamily::kQwen3Next ? 0.25 : 1.0);
  s.rope_theta = r.pos_num_or("rope_theta", 10000.0);
  if (tc->contains("rope_parameters") && (*tc)["rope_parameters"].is_object()) {
    Reader rp{(*tc)["rope_parameters"], where + ": rope_parameters"};
    s.rope_theta = rp.pos_num_or("rope_theta", s.rope_theta);
    factor = rp.num_or("partial_rotary_factor", factor);
    auto rt = rp.j.find("rope_type");
    if (rt != rp.j.end() && *rt != "default") throw rp.err("rope_type", rt->dump() + " is not supported (only \"default\")");
  }
  if (tc->contains("rope_scaling") && !(*tc)["rope_scaling"].is_null()) {
    const json& rs = (*tc)["rope_scaling"];
    if (!rs.is_object() || (rs.contains("rope_type") && rs["rope_type"] != "default") || (rs.contains("type") && rs["type"] != "default"))
      throw r.err("rope_scaling", "is not supported");
  }
  if (!(factor > 0 && factor <= 1)) throw r.err("partial_rotary_factor", "must be in (0, 1]");
  s.rotary_dim = static_cast<int>(s.head_dim * factor);
  if (s.rotary_dim % 2) throw r.err("partial_rotary_factor", "gives an odd rotary dimension");

  if (!moe_only) {  // Gated DeltaNet (qwen3_moe has none)
    s.linear_num_key_heads = r.pos_int("linear_num_key_heads");
    s.linear_num_value_heads = r.pos_int("linear_num_value_heads");
    s.linear_key_head_dim = r.pos_int("linear_key_head_dim");
    s.linear_value_head_dim = r.pos_int("linear_value_head_dim");
    s.linear_conv_kernel = r.pos_int("linear_conv_kernel_dim");
    if (s.linear_num_value_heads % s.linear_num_key_heads) throw r.err("linear_num_key_heads", "must divide linear_num_value_heads");
  }

  // transformers 5 writes qwen3_moe's expert count as num_local_experts
  // (its attribute map); released config.json files say num_experts.
  s.num_experts = !tc->contains("num_experts") && tc->contains("num_local_experts") ? r.pos_int("num_local_experts") : r.pos_int("num_experts");
  s.num_experts_per_tok = r.pos_int("num_experts_per_tok");
  s.moe_intermediate_size = r.pos_int("moe_intermediate_size");
  if (!moe_only) s.shared_expert_intermediate_size = r.pos_int("shared_expert_intermediate_size");
  if (s.num_experts_per_tok > s.num_experts) throw r.err("num_experts_per_tok", "exceeds num_experts");
  // Renormalised top-k weights: qwen3_5_moe always; the others when
  // norm_topk_prob says so (Qwen3MoeConfig's default is false, every
  // released config sets true). coli renormalises.
  if (!r.bool_or("norm_topk_prob", !moe_only)) throw r.err("norm_topk_prob", moe_only && !tc->contains("norm_topk_prob") ? "is missing (its default, false, is not supported)" : "= false is not supported");

  // Dense MLP layers (qwen3_moe, qwen3_next): layer i has routed experts
  // unless it is in mlp_only_layers or (i + 1) % decoder_sparse_step != 0.
  s.sparse_layers.assign(s.num_layers, 1);
  if (!q35) {
    const int step = r.int_or("decoder_sparse_step", 1);
    for (int i = 0; i < s.num_layers; ++i) s.sparse_layers[i] = (i + 1) % step == 0;
    if (tc->contains("mlp_only_layers") && !(*tc)["mlp_only_layers"].is_null()) {
      const json& ml = (*tc)["mlp_only_layers"];
      if (!ml.is_array()) throw r.err("mlp_only_layers", "must be a list of layer indices");
      for (const auto& i : ml) {
        if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= s.num_layers)
          throw r.err("mlp_only_layers", "has " + i.dump() + ", not a layer index below num_hidden_layers");
        s.sparse_layers[i.get<int>()] = 0;
      }
    }
    if (std::count(s.sparse_layers.begin(), s.sparse_layers.end(), 1) == 0)
      throw r.err("decoder_sparse_step", "and mlp_only_layers leave no layer with routed experts");
    if (std::count(s.sparse_layers.begin(), s.sparse_layers.end(), 0) > 0) s.intermediate_size = r.pos_int("intermediate_size");
  }

  if (moe_only) {
    s.layer_kinds.assign(s.num_layers, LayerKind::kFullAttention);
  } else if (tc->contains("layer_types") && !(*tc)["layer_types"].is_null()) {
    const json& lt = (*tc)["layer_types"];
    if (!lt.is_array() || static_cast<int>(lt.size()) != s.num_layers) throw r.err("layer_types", "must list num_hidden_layers entries");
    for (const auto& k : lt) {
      if (k == "linear_attention") s.layer_kinds.push_back(LayerKind::kLinearAttention);
      else if (k == "full_attention") s.layer_kinds.push_back(LayerKind::kFullAttention);
      else throw r.err("layer_types", "has unknown kind " + k.dump());
    }
  } else {
    const int interval = r.int_or("full_attention_interval", 4);
    for (int i = 0; i < s.num_layers; ++i)
      s.layer_kinds.push_back((i + 1) % interval ? LayerKind::kLinearAttention : LayerKind::kFullAttention);
  }

  // The multi-token-prediction module (Qwen3.5/3.6 and Qwen3-Next
  // checkpoints: mtp.*): its decoder layers, full attention with routed and
  // shared experts, after the main ones. qwen3_moe has none. Model::bind
  // keeps it only where the checkpoint has its tensors.
  if (!moe_only) {
    const char* key = tc->contains("mtp_num_hidden_layers") ? "mtp_num_hidden_layers" : "num_nextn_predict_layers";
    const auto it = tc->find(key);
    if (it != tc->end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0) throw r.err(key, "must be a non-negative integer");
      if (it->get<int64_t>() > 1) throw r.err(key, "= " + it->dump() + " is not supported (0 or 1 MTP layer)");
      s.mtp_layers = it->get<int>();
    }
    if (s.mtp_layers && r.bool_or("mtp_use_dedicated_embeddings", false))
      throw r.err("mtp_use_dedicated_embeddings", "= true is not supported (the MTP layer shares the model's embedding)");
  }

  for (const json* src : std::initializer_list<const json*>{tc, &root}) {
    auto e = src->find("eos_token_id");
    if (e == src->end() || e->is_null() || !s.eos_token_ids.empty()) continue;
    if (e->is_number_integer()) s.eos_token_ids.push_back(e->get<int>());
    else if (e->is_array())
      for (const auto& x : *e)
        if (x.is_number_integer()) s.eos_token_ids.push_back(x.get<int>());
  }
  return s;
}

ModelSpec load_model_spec(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  const char* want = "expected a Hugging Face checkpoint directory (config.json + *.safetensors)";
  if (!fs::exists(st)) throw Error(dir + ": no such file or directory; " + want);
  if (fs::is_regular_file(st)) {
    std::ifstream f(dir, std::ios::binary);
    char magic[8] = {};
    f.read(magic, 8);
    const bool container = f.gcount() == 8 && std::string(magic, 8) == "COLICNT1";
    throw Error(dir + (container ? ": is a coli container, not a checkpoint directory; " : ": is a file, not a checkpoint directory; ") + want);
  }
  if (!fs::is_directory(st)) throw Error(dir + ": is not a directory; " + want);
  const std::string path = dir + "/config.json";
  if (!fs::exists(path)) throw Error(dir + ": has no config.json; " + want);
  return parse_model_spec(read_text_file(path), path);
}

}  // namespace coli
