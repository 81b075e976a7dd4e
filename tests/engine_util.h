// Test helpers around an Engine: the tiny fixture's transformers goldens,
// greedy generation, the last-logit error against a golden prompt, and a
// checkpoint converted to one format for every matrix class.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "cpu_backend.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "model/weights.h"
#include "test_util.h"

namespace coli::test {

// Checkpoint directory src converted to out with the experts, shared expert,
// trunk and lm_head in format f (router and embedding at their defaults),
// on 2 threads, and loaded.
inline std::unique_ptr<Model> convert_all(const std::string& src, const std::string& out, QuantFormat f) {
  ConvertOptions o;
  o.experts = o.down = o.trunk = o.shared = o.lm_head = f;
  o.threads = 2;
  convert_checkpoint(src, out, o);
  return Model::load(out);
}

// tests/data/goldens/tiny-qwen35moe.json: per prompt its ids, last logits
// and greedy tokens (scripts/make_tiny_fixture.py).
inline const nlohmann::json& tiny_goldens() {
  static const nlohmann::json g = nlohmann::json::parse(read_file(data_dir() + "/goldens/tiny-qwen35moe.json"));
  return g;
}

inline std::vector<int> greedy_tokens(Engine& e, const std::vector<int>& prompt, int n = 16) {
  Session s = e.new_session();
  GenerateOptions o;
  o.n_predict = n;
  o.ignore_eos = true;
  o.sampling.temperature = 0;
  std::vector<int> out;
  generate(e, s, prompt, o, [&](const TokenEvent& ev) { out.push_back(ev.id); });
  return out;
}

// max |logit - golden| of the last logits of a golden prompt, fresh session.
inline float golden_logit_error(Engine& e, const nlohmann::json& prompt);

// The goldens of another fixture: tests/data/goldens/NAME.json.
inline const nlohmann::json& goldens_of(const std::string& name) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, nlohmann::json::parse(read_file(data_dir() + "/goldens/" + name + ".json"))).first;
  return it->second;
}

// Every fixture prompt: last logits within 1e-3 of the goldens and the
// golden greedy tokens; what prefixes the failure messages.
inline void expect_golden_prompts(Engine& e, const std::string& what = "", const nlohmann::json& goldens = tiny_goldens()) {
  for (const auto& p : goldens["prompts"]) {
    const std::vector<int> ids = p["ids"];
    EXPECT_LT(golden_logit_error(e, p), 1e-3f) << what << "prompt of " << ids.size();
    EXPECT_EQ(greedy_tokens(e, ids), p["greedy"].get<std::vector<int>>()) << what << "prompt of " << ids.size();
  }
}

inline float golden_logit_error(Engine& e, const nlohmann::json& prompt) {
  Session s = e.new_session();
  const auto logits = e.forward(s, prompt["ids"].get<std::vector<int>>());
  float err = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) err = std::max(err, std::fabs(logits[i] - prompt["last_logits"][i].get<float>()));
  return err;
}

// The error the CPU reference makes on a quantized model against the
// transformers goldens (max |dlogit| over the prompts): the scale of the
// differences a GPU's int8 activations (dp4a) may add on that model.
inline float cpu_quantization_error(const Model& m) {
  cpu::CpuBackend ref(m);
  Engine e(m.spec(), ref);
  float err = 0;
  for (const auto& p : tiny_goldens()["prompts"]) err = std::max(err, golden_logit_error(e, p));
  return err;
}

}  // namespace coli::test
