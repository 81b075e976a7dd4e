#include "placement/plan_apply.h"

#include <sys/mman.h>
#include <unistd.h>

#include "util/error.h"

namespace coli {

uint64_t advise_plan_ram(const Model& model, const Plan& plan) {
  const ModelSpec& s = model.spec();
  if (plan.layers != s.num_layers || plan.experts != s.num_experts)
    throw Error("a plan of " + std::to_string(plan.layers) + " x " + std::to_string(plan.experts) + " experts for a model of " +
                std::to_string(s.num_layers) + " x " + std::to_string(s.num_experts));
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uint64_t advised = 0;
  auto advise = [&](const Matrix& m) {
    if (!m.data || m.bytes() == 0) return;
    const auto a = reinterpret_cast<uintptr_t>(m.data) & ~(page - 1);
    const auto b = reinterpret_cast<uintptr_t>(m.data) + m.bytes();
    if (::madvise(reinterpret_cast<void*>(a), b - a, MADV_WILLNEED) == 0) advised += m.bytes();  // anonymous or locked memory: nothing to do
  };
  for (int l = 0; l < s.num_layers; ++l)
    for (int e = 0; e < (s.is_sparse(l) ? s.num_experts : 0); ++e) {
      if (plan.at(l, e) == Tier::kDisk) continue;
      const ExpertWeights& x = model.layer(l).moe.experts[e];
      advise(x.gate), advise(x.up), advise(x.down);
    }
  return advised;
}

}  // namespace coli
