// ExpertHandoff: the routed experts the expert tier does not hold, computed
// on the host while the device computes the shared expert and the resident
// ones (hybrid decode), without leaving the stream or the decode graph.
//
// Per MoE layer with misses, the stream runs two small kernels around the
// experts' kernels:
//   post():  after the router: the misses' (token, expert, weight), in pair
//            order, and the T normed rows go to pinned host memory mapped
//            into the device; then a sequence number is written to a host
//            flag (the only signal: no host callback, no event).
//   join():  before the combine: waits until the host flag says the host's
//            partial sum for that sequence number is written, then adds it to
//            the routed output: routed += host part.
// A host thread (started here, owned here) spins on the flag while a chunk is
// in flight (begin() .. end()), hands each post to the ExpertHost, writes
// the partial sum and the done flag. Only the routing result and the normed
// rows cross the bus down, one partial row per token up. The device's
// resident experts meanwhile read, for a missing expert, a zero expert (all
// bytes 0: every format dequantizes it to 0), so their kernels are unchanged
// and a miss contributes exactly 0 on the device.
//
// The host thread is the only caller of the ExpertHost. Between end() and
// the next begin() it sleeps. Not copyable; destroy after the stream is idle.
//
// Served inline (serve_inline, for tools that serialise the device such as
// compute-sanitizer's racecheck, under which a kernel spinning on a host
// flag may never see it change): no host thread; post() waits for the
// stream after its kernel and computes the host's part on the calling
// thread, so the join finds it done. The same kernels and results; the
// stream cannot be captured into a graph then (the caller turns graphs off).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/expert_host.h"
#include "norm.cuh"
#include "route.cuh"

namespace coli::cuda::detail {

struct HandoffBox;       // pinned, mapped: flags, pairs, rows, partial sums (expert_handoff.cu)
struct HandoffCounters;  // device: sequence number, the last post's count, timers, counts

// A split post of T > 1 tokens: at most this many (token, column) entries
// and experts (ExpertHandoff::post checks; the tier asks for none past them).
constexpr int kSplitPostPairs = 1024, kSplitPostExperts = 1024;

class ExpertHandoff {
 public:
  // max_T tokens per chunk, K routed pairs per token, H hidden size, E
  // routed experts per layer.
  ExpertHandoff(ExpertHost& host, int max_T, int K, int H, int E, bool serve_inline = false);
  ~ExpertHandoff();
  ExpertHandoff(const ExpertHandoff&) = delete;
  ExpertHandoff& operator=(const ExpertHandoff&) = delete;

  // Enqueues the post of layer `layer`: idx and w are [T, ks] on the device
  // (the first K columns are routed experts; a column may hold the shared
  // expert as expert E, which is resident), resident [E] flags on the
  // device, hn [T, H] on the device. A post with no miss for the host
  // posts nothing (the host never sees it; the join adds nothing).
  // share > 0: a split post for the PCIe reads. Flags are then 1
  // resident, 2 readable by the device over PCIe, 0 neither; the first
  // round(share x (misses + offset)) misses flagged 2 stay the device's
  // (their ids untouched: its table points at their host bytes) and the
  // others' ids in idx become zero_entry (the table's zero expert) and go
  // to the host. Of T > 1 tokens (T x ks <= 1,024, E <= 1,024) misses
  // count distinct experts, those with one pair taken first, and every
  // pair of a device expert stays the device's. Otherwise flags are 0 or
  // 1 and idx is only read.
  // split_inter > 0 (one token; the experts' intermediate rows, a multiple of 128):
  // the device takes x = share x (misses + offset) experts as floor(x)
  // whole ones and the fraction of the next flagged one in rows (rounded
  // to 128): its rows [0, r) are the device's (row_limits()[k] = r, its id
  // kept) and the rest the host's (ExpertPair::first_row r); every other
  // column's limit is split_inter. The kernels that read row_limits() run
  // after this post and before the next.
  void post(int layer, int* idx, const float* w, int ks, int T, const uint8_t* resident, const float* hn, cudaStream_t s, float share = 0,
            float offset = 0, int zero_entry = 0, int split_inter = 0);
  // A decode step's router, routing and post in one launch (route.cuh's
  // router_route_kernel, its last block posting; router_route_supported
  // must hold): what matmul(router) + route_topk + post() enqueue, with
  // r.idx, r.w, r.hn as post's idx, w, hn (ks = r.K + r.with_shared).
  // ticket: router_route's word.
  void route_post(const DevMatrix& router, const RouteArgs& r, unsigned* ticket, int layer, const uint8_t* resident, cudaStream_t s, float share = 0,
                  float offset = 0, int zero_entry = 0, int split_inter = 0);
  // [K + 1] on the device: the last split post's rows per column (above).
  const int* row_limits() const { return d_lim_; }
  // Enqueues routed[T, H] += the host's partial sum of the last post.
  void join(float* routed, int T, cudaStream_t s);
  // One token: the join inside the residual add and norm that follow it
  // (norm.cuh's kernel with the join's wait as its hook; a.a is the routed
  // row, which is not written back): one launch instead of two.
  void join_norm(const NormArgs& a, cudaStream_t s);

  // A chunk that may post is in flight / has completed on the device.
  // end() rethrows what the ExpertHost threw during the chunk (the device
  // then got zeros for those misses: the chunk's results are void).
  void begin();
  void end();

  // A part of a one-token post's misses computed on the device instead,
  // their weights uploaded over PCIe while the host computes the others
  // (CudaOptions::decode_upload_max). Called on the host thread: take()
  // moves the misses it takes to the front (the rest keep their order),
  // enqueues their copies and kernels on a stream of its own, which write
  // dpart [H], and returns how many; wait() returns once they are done.
  class DevicePart {
   public:
    virtual ~DevicePart() = default;
    virtual int take(int layer, ExpertPair* misses, int n) = 0;
    virtual void wait() = 0;
  };
  // Before the first begin(); dpart: the device part's output row.
  void set_device_part(DevicePart* part, const float* dpart) { dev_ = part, dpart_ = dpart; }

  struct Stats {
    long handoffs = 0;        // posts served
    long pairs = 0;           // routed pairs of the posted layers
    long misses = 0;          // of them, computed off the tier by the host or the device part
    long pcie_misses = 0;     // not resident and read over PCIe by the device (split posts; not in misses)
    long device_misses = 0;   // of those, uploaded and computed by the device part
    double host_ms = 0;       // in ExpertHost::compute
    double device_wait_ms = 0;  // the device's join kernels waiting for the host
    double device_work_ms = 0;  // the device's own work from each post to its join (shared and resident experts)
    // Of the above, prompt chunks' posts (T > 1): the host's time, its pairs
    // and the distinct experts they went to (the prefill split's rates).
    double prompt_host_ms = 0;
    long prompt_misses = 0, prompt_experts = 0;
    double prompt_wait_ms = 0;  // of device_wait_ms, the prompt chunks' joins (device: stats() only)
    long split_misses = 0;      // of the misses, experts split with the device (split posts; device)
    long long split_rows = 0;   // the device's rows of those
  };
  Stats stats() const;
  // The prompt_* fields alone (host counters: no device read).
  Stats prompt_stats() const;

 private:
  void serve();
  // Serves the post numbered p (the box holds it): the host's part, the
  // device part's, the done flag.
  void serve_one(unsigned p);
  using Box = HandoffBox;
  const bool inline_;
  unsigned inline_last_ = 0;  // the last post served inline
  ExpertHost& host_;
  const int max_T_, K_, H_, E_;
  // The box's arrays after the flags, at its host and its device address.
  struct Arrays {
    ExpertPair* pairs = nullptr;  // [max_T * K] the misses
    float* rows = nullptr;        // [max_T, H] the normed rows
    float* part = nullptr;        // [max_T, H] the host's partial sums
  };
  Arrays arrays_at(Box* base) const;
  Box* box_ = nullptr;        // host address
  Box* d_box_ = nullptr;      // the same memory, device address
  Arrays h_, d_;
  HandoffCounters* d_counters_ = nullptr;
  int* d_lim_ = nullptr;  // [K + 1] row limits of the last split post (row_limits)
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> active_{false}, stop_{false};
  std::atomic<long> handoffs_{0}, misses_{0}, device_misses_{0};
  DevicePart* dev_ = nullptr;
  const float* dpart_ = nullptr;
  std::atomic<long long> host_ns_{0};
  std::atomic<long long> prompt_ns_{0};
  std::atomic<long> prompt_misses_{0}, prompt_experts_{0};
  std::vector<uint8_t> seen_;  // serve_one's distinct experts of a prompt post
  std::exception_ptr error_;  // from the ExpertHost, handed over by end()
};

}  // namespace coli::cuda::detail
