// Hot host experts of a prompt chunk (CudaOptions::prefill_hot_pairs;
// expert_tier.cuh: PrefillUpload::host, host_at, hot). The third place's
// choice is made before the chunk's routing is known, so an expert chosen
// for the host may turn out to take many times the pairs it was planned
// for (a synthetic qwen3_moe prompt sends one expert of a layer 216-496 of
// its 512 tokens; real prompts have hot experts too), and the GPU would
// wait for the host. After the layer's router, before the handoff's post
// reads the flags and the grouped kernels read the tables, one block
// counts the chunk's pairs of each chosen expert and sets its flag and
// table entries anew: more than `hot` pairs and bytes the device can read
// in place, the GPU's over PCIe (the same kernels as for an uploaded
// expert, reading its pinned host bytes); else the host's (flag 0, null
// entries). Every chosen expert is set each chunk, both ways, so the
// host's copy of the tables (PrefillUpload::written) stays right for the
// others.
#include <climits>
#include <cmath>

#include "expert_tier.cuh"

namespace coli::cuda::detail {

namespace {

constexpr int kHotThreads = 256;

__global__ void __launch_bounds__(kHotThreads)
    hot_host_kernel(const int* idx, int ks, int K, int T, int E, const uint8_t* host, const uint8_t* const* at, int hot, uint8_t* flags,
                    const uint8_t** g, const uint8_t** u, const uint8_t** d, unsigned long long* moved) {
  extern __shared__ int cnt[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int n = T * K;
  for (int p = threadIdx.x; p < n; p += blockDim.x) {
    const int e = idx[(p / K) * ks + p % K];
    if (e >= 0 && e < E && host[e]) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  int mine = 0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    if (!host[e]) continue;
    const bool gpu = cnt[e] > hot && at[3 * e] != nullptr;
    flags[e] = gpu ? 1 : 0;
    g[e] = gpu ? at[3 * e] : nullptr, u[e] = gpu ? at[3 * e + 1] : nullptr, d[e] = gpu ? at[3 * e + 2] : nullptr;
    mine += gpu;
  }
  if (mine) atomicAdd(moved, static_cast<unsigned long long>(mine));
}

}  // namespace

void ExpertTier::read_hot_host_experts(int l, const int* idx, int ks, int T) {
  if (!hot_on() || static_cast<std::size_t>(l) >= pu_.host.size()) return;
  const int E = s_.num_experts, K = s_.num_experts_per_tok;
  // Auto: twice the layer's mean pairs an expert (the count planned the
  // host's experts at the mean).
  const int hot = opt_.prefill_hot_pairs >= 0 ? opt_.prefill_hot_pairs : static_cast<int>(std::ceil(2.0 * T * K / E));
  hot_host_kernel<<<1, kHotThreads, static_cast<std::size_t>(E) * sizeof(int), stream_>>>(
      idx, ks, K, T, E, pu_.host[l].get(), pu_.host_at[l].get(), hot, pu_.flags[l].get(), pu_.gate[l].get(), pu_.up[l].get(), pu_.down[l].get(),
      pu_.hot.get());
  check(cudaGetLastError(), "prefill hot experts");
}

}  // namespace coli::cuda::detail
