// Test helper: greedy generation through an Engine.
#pragma once
#include <vector>

#include "engine/engine.h"
#include "engine/generate.h"

namespace coli::test {

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

}  // namespace coli::test
