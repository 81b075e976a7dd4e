// Test helpers around an Engine: the tiny fixture's transformers goldens,
// greedy generation, and the last-logit error against a golden prompt.
#pragma once
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/engine.h"
#include "engine/generate.h"
#include "test_util.h"

namespace coli::test {

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
inline float golden_logit_error(Engine& e, const nlohmann::json& prompt) {
  Session s = e.new_session();
  const auto logits = e.forward(s, prompt["ids"].get<std::vector<int>>());
  float err = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) err = std::max(err, std::fabs(logits[i] - prompt["last_logits"][i].get<float>()));
  return err;
}

}  // namespace coli::test
