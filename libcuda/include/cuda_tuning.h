// CudaTuning: the launch shapes of the CUDA backend's decode kernels, a
// field of CudaOptions. Its own header so that the kernel sources read it
// without the backend's interface.
#pragma once
#include <cstddef>

namespace coli::cuda {

// Launch shapes of the decode kernels: for measuring other GPUs. Results
// change only by float summation order; on the H200 the defaults were the
// fastest (docs/perf/gpu.md).
struct CudaTuning {
  int norm_cluster = 8;  // largest thread block cluster a norm row spreads over (8, 4, 2; 1: none)
  int gemv_warps = 4;    // warps per block of the one-token int8-activation matmuls
  int float_warps = 4;   // the same for float-format matrices
  int gemv_lanes = 32;   // lanes per weight row there (32, 16 or 8)
  int up_rows = 2;       // rows per lane group of the experts' gate+up (1, 2 or 4)
  int down_rows = 4;     // the same for their down (2, 4 or 8)
  int moe_lanes = 32;    // most lanes per weight row in the experts' pair kernels (32, 16 or 8)
  int logit_parts = 4;   // column ranges the logits come back in (1 to 8)
  // int4 / int8 matmuls of chunks of mma_min_tokens or more tokens run on
  // tensor cores (mma_tile.cuh), fewer on dp4a row dots; of those, chunks
  // of up to mma_small tokens (coli-serve's decode rows, verify windows)
  // on tiles of 16 tokens with deeper cp.async pipelines (0: the prompt
  // chunk's tiles of 64 for every chunk). The same values either way: a
  // tile's token count changes no output's sum. At 64 a prompt chunk of
  // 17-64 tokens (a chat's next turn) takes them too, split over clusters
  // where the 64-token tiles had a block per 64 rows: pp24 / pp40 / pp64 on
  // the whole GPU 6,151-6,274 / 8,961-8,982 / 11,567-11,604 tok/s against
  // 5,201-5,224 / 7,582-7,609 / 10,050-10,108 at 16 (H100, session 26).
  int mma_min_tokens = 8;
  int mma_small = 64;
  // Such few-token tiles split their columns over a thread block cluster
  // (up to 8 blocks, sm_90) until the grid has mma_split blocks per SM
  // (0: never split): a 2,048-row matrix has 32 tiles of 64 rows for 132
  // SMs. Values change by float summation order only.
  int mma_split = 3;
  // Chunks of this many tokens or more run their routed experts grouped by
  // expert (moe_grouped: each expert's rows read once per tile of its
  // pairs); fewer take the decode kernels pair by pair (an expert shared
  // by two pairs read twice, from L2 the second time), faster while
  // experts have a pair or two each (measured on the H100 at the 35B
  // shapes, 8 uniform picks of 256: 16 tokens 110 us against 193-229, 32
  // tokens 208 against 284-298, 64 tokens 404 against 377). A prompt
  // chunk keeps 4: pair by pair its logits would stop being bit for bit
  // those of an uploading tier, which always groups. A prompt chunk that
  // uploads its experts in groups always groups (from kMoeGroupedMinTokens).
  int grouped_min_tokens = 4;
  // The same for a rows step's rows (coli-serve's slots, coli-bench
  // --n-parallel: one token per session, an expert a pair or two), which
  // never upload: 16 sessions stepped together 4,551 tok/s at 48 against
  // 3,804 at 4 (H100, session 23).
  int grouped_min_rows = 48;
  // Steps of up to this many tokens whose experts go pair by pair and do
  // not upload (a rows step, a verify window) split their misses between
  // the device's PCIe reads and the host as a one-token step does
  // (CudaOptions::pcie_read_share; 1: one-token steps only). At most 16.
  int pcie_rows_max = 16;
  // Those steps' share of their distinct misses read over PCIe, in percent
  // (0: the one-token share, CudaOptions::pcie_read_share); only where the
  // one-token share is on. Their misses are many experts of a pair or two,
  // the host's fixed cost a smaller part of its time than for one token's:
  // 16 rows at 1.75G ran 1,057 tok/s at 50 against 990 at the one-token
  // 35 (849 at 20, 861 at 65; H100, session 24, docs/perf/serve.md).
  int pcie_rows_share = 50;
  // Rows steps of up to this many rows launch their kernels with
  // programmatic dependent launch, as a one-token step does (each kernel's
  // blocks start while the one before drains; every kernel waits for it
  // before reading what it wrote: the same values, bit for bit). 0:
  // never. Prompt chunks never: their early blocks would only take SM
  // slots. 16 rows on the whole model: graph replay 2,097 us against
  // 2,132, coli-bench 16 sessions 142.0-142.5 ms against 144.6-144.7 for
  // 64 steps (H100, session 26).
  int pdl_rows = 16;
  // A segments step (coli-serve's decode rows with prompt chunks riding
  // along, Backend::step_segments) of up to this many tokens hands its
  // misses to the host as a rows step does; a longer one uploads them as
  // a prompt chunk (with the CPU as third place). Where each expert runs
  // changes no result beyond the placements' own rounding.
  int segments_host_max = 64;
  // Greedy decode steps (temperature 0, no penalties, no log-probabilities:
  // coli-run's and coli-serve's) take each row's id from the device
  // (Backend::greedy_only): no logits copied to the host, no host scan.
  // 0: the logits go to the host and the sampler scans them. The same ids.
  // coli-serve whole GPU, 16 clients 5,418-5,473 tok/s against 4,481-4,592,
  // one client 1,727-1,746 against 1,502-1,529 (H100, session 28).
  int device_greedy = 1;
  // The weights' staged uploads (staged_upload.cuh): piece size (a ring of
  // 8 pinned buffers of it; small copies are packed into pieces) and the
  // smallest copy staged (smaller ones go at once, synchronously).
  std::size_t upload_piece_bytes = std::size_t(16) << 20;
  std::size_t upload_min_bytes = 0;
};

}  // namespace coli::cuda
