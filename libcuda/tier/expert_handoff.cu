// ExpertHandoff: the post and join kernels and the host thread that serves
// them (see expert_handoff.cuh).
#include "expert_handoff.cuh"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "cuda_util.cuh"

namespace coli::cuda::detail {

// Host flags on cache lines of their own (the host spins on posted, the
// device on done), then the posted layer; the arrays follow at kPairsAt.
struct HandoffBox {
  volatile unsigned posted;
  unsigned pad0[31];
  volatile unsigned done;
  unsigned pad1[31];
  volatile int layer, n, T;
  volatile int n_dev;  // misses the device part computed: join adds its row too
};

// The device-side words of a handoff (device memory): the sequence number,
// the last post's host miss count (the join reads it here, not over PCIe),
// the timers and the counts.
struct HandoffCounters {
  unsigned seq;
  int n;  // the last post's misses for the host (0: nothing posted, nothing to wait for)
  unsigned long long wait_ns, post_ns, work_ns;
  unsigned long long prompt_wait_ns;  // of wait_ns, prompt chunks' joins (T > 1)
  unsigned long long pairs, pcie;  // routed pairs posted; of the misses, read over PCIe by the device
  unsigned long long split, split_rows;  // split posts' experts split with the host, the device's rows of them
};

namespace {

constexpr std::size_t kPairsAt = 512;
// A split expert's rows go in 128s: the host's int4 kernels read 128-column
// superblocks, so neither side reads columns it does not use.
constexpr int kSplitRows = 128;
constexpr int kPostThreads = 256;

std::size_t rows_at(int max_T, int K) { return (kPairsAt + sizeof(ExpertPair) * std::size_t(max_T) * K + 255) / 256 * 256; }

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One block: the misses in pair order (a per-thread count, an exclusive
// scan, then each thread writes its own range), the rows, then the flag.
// A split post (share > 0, one token: the PCIe reads, see post()) takes the
// first round(share x (misses + offset)) misses flagged 2 for the device,
// leaves their ids, and points the host's ones at the zero entry. With no miss for the
// host nothing is posted and the join does not wait.
struct PostArgs {
  int layer;
  int* idx;
  const float* w;
  int ks, K, T;
  const uint8_t* resident;
  int E;
  float share, offset;
  int zero_entry, inter;
  int* lim;
  const float* hn;
  int H;
  HandoffBox* box;
  ExpertPair* pairs;
  float* rows;
  HandoffCounters* c;
};

// The post, by a block of kPostThreads threads.
__device__ void post_block(const PostArgs& a) {
  const int layer = a.layer, ks = a.ks, K = a.K, T = a.T, E = a.E, zero_entry = a.zero_entry, inter = a.inter, H = a.H;
  int* idx = a.idx;
  int* lim = a.lim;
  const float* w = a.w;
  const uint8_t* resident = a.resident;
  const float share = a.share, offset = a.offset;
  const float* hn = a.hn;
  HandoffBox* box = a.box;
  ExpertPair* pairs = a.pairs;
  float* rows = a.rows;
  HandoffCounters* c = a.c;
  __shared__ int start[kPostThreads + 1];
  const int n = T * K, tid = threadIdx.x;
  if (share > 0 && T == 1) {
    if (tid == 0) {
      int m = 0, cand = 0;
      for (int k = 0; k < K; ++k) {
        const int e = idx[k];
        if (e < E && resident[e] != 1) m += 1, cand += resident[e] == 2;
      }
      // x = share (misses + offset) experts for the device: whole ones,
      // and with lim the fraction of the next one in rows (a multiple of
      // kSplitRows; the host takes the rest of it); else x rounded.
      const float x = fminf(share * (static_cast<float>(m) + offset), static_cast<float>(cand));
      int g = 0, rows_dev = 0;
      if (lim) {
        g = static_cast<int>(floorf(x));
        rows_dev = static_cast<int>(floorf((x - static_cast<float>(g)) * static_cast<float>(inter / kSplitRows) + 0.5f)) * kSplitRows;
        if (rows_dev >= inter) ++g, rows_dev = 0;
        if (g >= cand) g = cand, rows_dev = 0;
      } else {
        g = min(cand, static_cast<int>(floorf(x + 0.5f)));
      }
      int taken = 0, o = 0;
      bool split = false;
      for (int k = 0; k < ks; ++k) {
        const int e = idx[k];
        if (lim) lim[k] = inter;
        if (k >= K || e >= E || resident[e] == 1) continue;
        if (resident[e] == 2 && taken < g) {
          ++taken;
          continue;
        }
        if (resident[e] == 2 && rows_dev > 0 && !split) {  // its rows [0, rows_dev) the device's, from PCIe; the rest the host's
          split = true;
          lim[k] = rows_dev;
          pairs[o++] = ExpertPair{0, e, w[k], rows_dev};
          continue;
        }
        pairs[o++] = ExpertPair{0, e, w[k]};
        idx[k] = zero_entry;
      }
      start[kPostThreads] = o;
      c->pcie += static_cast<unsigned long long>(taken);
      if (split) c->split += 1, c->split_rows += static_cast<unsigned long long>(rows_dev);
    }
  } else if (share > 0) {
    // A few tokens (a rows step, a verify window): the same split by
    // distinct experts, whole ones only. The device takes round(share x
    // (distinct misses + offset)) of the readable ones, those with one
    // pair first (a pair each read over PCIe; the host reads an expert
    // once for all its pairs), and computes all their pairs.
    __shared__ int sidx[kSplitPostPairs];
    __shared__ unsigned seen[kSplitPostExperts / 32], multi[kSplitPostExperts / 32], dev[kSplitPostExperts / 32];
    for (int i = tid; i < T * ks; i += kPostThreads) sidx[i] = idx[i];
    for (int i = tid; i < kSplitPostExperts / 32; i += kPostThreads) seen[i] = multi[i] = dev[i] = 0;
    __syncthreads();
    if (tid == 0) {
      auto bit = [](const unsigned* b, int e) { return (b[e >> 5] >> (e & 31)) & 1u; };
      auto set = [](unsigned* b, int e) { b[e >> 5] |= 1u << (e & 31); };
      int m = 0, cand = 0;
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
          const int e = sidx[t * ks + k];
          if (e >= E || resident[e] == 1) continue;
          if (bit(seen, e)) {
            set(multi, e);
            continue;
          }
          set(seen, e), m += 1, cand += resident[e] == 2;
        }
      const int g = min(cand, static_cast<int>(floorf(share * (static_cast<float>(m) + offset) + 0.5f)));
      int taken = 0;
      for (int pass = 0; pass < 2 && taken < g; ++pass)  // experts of one pair, then the others
        for (int p = 0; p < T * K && taken < g; ++p) {
          const int e = sidx[(p / K) * ks + p % K];
          if (e >= E || resident[e] != 2 || bit(dev, e) || bit(multi, e) != static_cast<unsigned>(pass)) continue;
          set(dev, e), taken += 1;
        }
      int o = 0, dev_pairs = 0;
      for (int p = 0; p < T * K; ++p) {
        const int i = (p / K) * ks + p % K, e = sidx[i];
        if (e >= E || resident[e] == 1) continue;
        if (bit(dev, e)) {
          dev_pairs += 1;
          continue;
        }
        pairs[o++] = ExpertPair{p / K, e, w[i]};
        idx[i] = zero_entry;
      }
      start[kPostThreads] = o;
      c->pcie += static_cast<unsigned long long>(dev_pairs);  // pairs, as the one-token split's (an expert read per pair)
    }
  } else {
    const int per = (n + kPostThreads - 1) / kPostThreads, p0 = min(n, tid * per), p1 = min(n, p0 + per);
    auto missing = [&](int p, int* e) {
      *e = idx[(p / K) * ks + p % K];
      return *e < E && !resident[*e];  // column K may hold the shared expert as E: resident
    };
    int cnt = 0, e;
    for (int p = p0; p < p1; ++p) cnt += missing(p, &e);
    start[tid + 1] = cnt;
    __syncthreads();
    if (tid == 0) {
      start[0] = 0;
      for (int i = 1; i <= kPostThreads; ++i) start[i] += start[i - 1];
    }
    __syncthreads();
    int o = start[tid];
    for (int p = p0; p < p1; ++p)
      if (missing(p, &e)) pairs[o++] = ExpertPair{p / K, e, w[(p / K) * ks + p % K]};
  }
  __syncthreads();
  const int misses = start[kPostThreads];
  if (misses > 0) {
    const long long n4 = static_cast<long long>(T) * H / 4;
    if (static_cast<long long>(T) * H % 4 == 0)
      for (long long i = tid; i < n4; i += kPostThreads) reinterpret_cast<float4*>(rows)[i] = reinterpret_cast<const float4*>(hn)[i];
    else
      for (long long i = tid; i < static_cast<long long>(T) * H; i += kPostThreads) rows[i] = hn[i];
  }
  __syncthreads();
  if (tid == 0) {
    c->n = misses;
    c->pairs += static_cast<unsigned long long>(n);
    if (misses > 0) {
      box->layer = layer, box->n = misses, box->T = T;
      const unsigned s = c->seq + 1;
      c->seq = s;
      __threadfence_system();  // the pairs, rows and header before the flag
      box->posted = s;
      c->post_ns = global_ns();
    }
  }
}

__global__ void __launch_bounds__(kPostThreads) post_kernel(PostArgs a) {
  griddep_wait();
  post_block(a);
}

// router_route_kernel's tail in route_post: the routing's last block posts.
struct PostTail {
  PostArgs a;
  __device__ void operator()() const { post_block(a); }
};
static_assert(kPostThreads == kRouteWarps * 32, "the routing block posts: one block size");

// The join's wait as norm_kernel's hook (join_norm): every block's thread 0
// waits for the host (block (0, 0) keeps the counts, as the join kernel's
// block 0); mode 0 nothing posted, 1 the host's part, 2 and the device part.
struct JoinHook {
  HandoffBox* box;
  const float* part;
  HandoffCounters* c;
  const float* dpart;
  __device__ int wait() const {
    __shared__ int mode;
    if (threadIdx.x == 0) {
      mode = 0;
      if (c->n > 0) {
        const unsigned s = c->seq;
        const bool first = blockIdx.x == 0 && blockIdx.y == 0;
        const unsigned long long t0 = global_ns();
        if (first) atomicAdd(&c->work_ns, t0 - c->post_ns);
        while (box->done != s) {
        }
        if (first) atomicAdd(&c->wait_ns, global_ns() - t0);
        mode = dpart && box->n_dev > 0 ? 2 : 1;
      }
    }
    __syncthreads();
    return mode;
  }
  __device__ float add(long long i, int mode) const { return __fadd_rn(__ldcv(part + i), mode == 2 ? __ldcv(dpart + i) : 0.0f); }
};

// Waits for the host's done flag to reach the last posted number, then adds
// the host's partial sums (read past every cache: the same addresses carry
// a new layer's sums each time). A post with no host misses posted nothing:
// no wait. Each thread's loads are issued together (one PCIe round trip).
__global__ void join_kernel(HandoffBox* box, const float* part, HandoffCounters* c, float* routed, long long n, const float* dpart, bool prompt) {
  griddep_wait();
  __shared__ int any, dev;
  if (threadIdx.x == 0) {
    any = c->n > 0;
    dev = 0;
    if (any) {
      const unsigned s = c->seq;
      const unsigned long long t0 = global_ns();
      if (blockIdx.x == 0) atomicAdd(&c->work_ns, t0 - c->post_ns);  // the device's own work since the post
      // One-token joins (a block or two) spin on the flag; a prompt chunk's
      // many blocks back off between reads, as before, to leave the bus be.
      const bool back_off = gridDim.x > 8;
      while (box->done != s)
        if (back_off) __nanosleep(100);
      if (blockIdx.x == 0) {
        const unsigned long long waited = global_ns() - t0;
        atomicAdd(&c->wait_ns, waited);
        if (prompt) atomicAdd(&c->prompt_wait_ns, waited);
      }
      dev = dpart && box->n_dev > 0;
    }
  }
  __syncthreads();
  if (!any) return;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  if (n % 4 == 0) {
    const long long n4 = n / 4;
    auto* r4 = reinterpret_cast<float4*>(routed);
    const auto* p4 = reinterpret_cast<const float4*>(part);
    const auto* d4 = reinterpret_cast<const float4*>(dpart);
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n4; i += stride) {
      const float4 a = __ldcv(p4 + i);
      const float4 b = dev ? __ldcv(d4 + i) : make_float4(0, 0, 0, 0);
      float4 r = r4[i];
      r.x += a.x + b.x, r.y += a.y + b.y, r.z += a.z + b.z, r.w += a.w + b.w;
      r4[i] = r;
    }
    return;
  }
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride)
    routed[i] += __ldcv(part + i) + (dev ? __ldcv(dpart + i) : 0.0f);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ExpertHandoff::ExpertHandoff(ExpertHost& host, int max_T, int K, int H, int E, bool serve_inline)
    : host_(host), max_T_(max_T), K_(K), H_(H), E_(E), inline_(serve_inline) {
  const std::size_t rows = std::size_t(max_T) * H * sizeof(float);
  const std::size_t bytes = rows_at(max_T, K) + 2 * rows;
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes, cudaHostAllocMapped), "cudaHostAlloc (expert handoff)");
  std::memset(p, 0, bytes);
  box_ = static_cast<Box*>(p);
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_box_), p, 0), "cudaHostGetDevicePointer");
  h_ = arrays_at(box_), d_ = arrays_at(d_box_);
  check(cudaMalloc(&d_counters_, sizeof(HandoffCounters)), "cudaMalloc (expert handoff counters)");
  check(cudaMemset(d_counters_, 0, sizeof(HandoffCounters)), "cudaMemset");
  check(cudaMalloc(&d_lim_, sizeof(int) * (K + 1)), "cudaMalloc (expert handoff row limits)");
  if (!inline_) worker_ = std::thread([this] { serve(); });
}

ExpertHandoff::~ExpertHandoff() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (d_counters_) cudaFree(d_counters_);
  if (d_lim_) cudaFree(d_lim_);
  if (box_) cudaFreeHost(box_);
}

ExpertHandoff::Arrays ExpertHandoff::arrays_at(Box* base) const {
  auto* b = reinterpret_cast<char*>(base);
  const std::size_t rows = rows_at(max_T_, K_), row_bytes = std::size_t(max_T_) * H_ * sizeof(float);
  return {reinterpret_cast<ExpertPair*>(b + kPairsAt), reinterpret_cast<float*>(b + rows), reinterpret_cast<float*>(b + rows + row_bytes)};
}

void ExpertHandoff::post(int layer, int* idx, const float* w, int ks, int T, const uint8_t* resident, const float* hn, cudaStream_t s, float share,
                         float offset, int zero_entry, int split_inter) {
  if (T > max_T_) throw Error("CUDA backend: expert handoff of " + std::to_string(T) + " tokens exceeds " + std::to_string(max_T_) + " (internal)");
  if (share > 0 && (ks > K_ + 1 || (T > 1 && (T * ks > kSplitPostPairs || E_ > kSplitPostExperts))))
    throw Error("CUDA backend: a split post of " + std::to_string(T) + " tokens x " + std::to_string(ks) + " pairs over " + std::to_string(E_) +
                " experts exceeds its arrays (internal)");
  if (split_inter > 0 && T != 1) throw Error("CUDA backend: an expert split is for one token (internal)");
  if (split_inter > 0 && (share <= 0 || split_inter % kSplitRows != 0)) throw Error("CUDA backend: an expert split needs a split post and rows in 128s (internal)");
  const PostArgs a{layer, idx, w, ks, K_, T, resident, E_, share, offset, zero_entry, split_inter, split_inter > 0 ? d_lim_ : nullptr,
                   hn, H_, d_box_, d_.pairs, d_.rows, d_counters_};
  launch(post_kernel, 1, kPostThreads, 0, s, a);
  if (!inline_) return;
  check(cudaStreamSynchronize(s), "expert handoff (inline)");
  const unsigned p = box_->posted;
  if (p != inline_last_) inline_last_ = p, serve_one(p);  // a post with no host miss posted nothing
}

void ExpertHandoff::route_post(const DevMatrix& router, const RouteArgs& r, unsigned* ticket, int layer, const uint8_t* resident, cudaStream_t s,
                               float share, float offset, int zero_entry, int split_inter) {
  const int ks = r.K + (r.with_shared ? 1 : 0);
  if (ks > K_ + 1 || r.K != K_) throw Error("CUDA backend: route_post's pairs do not match the handoff's (internal)");
  if (split_inter > 0 && (share <= 0 || split_inter % kSplitRows != 0)) throw Error("CUDA backend: an expert split needs a split post and rows in 128s (internal)");
  const PostArgs a{layer, r.idx, r.w, ks, K_, 1, resident, E_, share, offset, zero_entry, split_inter, split_inter > 0 ? d_lim_ : nullptr,
                   r.hn, H_, d_box_, d_.pairs, d_.rows, d_counters_};
  router_route(router, r, ticket, PostTail{a}, s);
  if (!inline_) return;
  check(cudaStreamSynchronize(s), "expert handoff (inline)");
  const unsigned p = box_->posted;
  if (p != inline_last_) inline_last_ = p, serve_one(p);
}

void ExpertHandoff::join_norm(const NormArgs& a, cudaStream_t s) {
  launch_norm(a, 1, s, JoinHook{d_box_, d_.part, d_counters_, dpart_});
}

void ExpertHandoff::join(float* routed, int T, cudaStream_t s) {
  const long long n = static_cast<long long>(T) * H_;
  const long long per_thread = n % 4 == 0 ? 4 : 1;  // one float4 or one float per thread and pass
  const int blocks = static_cast<int>(std::clamp<long long>((n / per_thread + 255) / 256, 1, 264));
  launch(join_kernel, blocks, 256, 0, s, d_box_, static_cast<const float*>(d_.part), d_counters_, routed, n, dpart_, T > 1);
}

void ExpertHandoff::begin() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_ = true;
  }
  cv_.notify_all();
}

void ExpertHandoff::end() {
  active_ = false;
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

void ExpertHandoff::serve() {
  unsigned last = 0;
  bool held = false;  // the host's threads kept spinning for this chunk
  while (!stop_) {  // also while a chunk is active: a backend destroyed mid-chunk must not hang here
    if (const bool a = active_; a != held) host_.hold(held = a);
    if (!active_) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return active_ || stop_; });
      if (stop_) return;
      continue;
    }
    const unsigned p = box_->posted;
    if (p == last) {
      cpu_relax();
      continue;
    }
    last = p;
    serve_one(p);
  }
}

void ExpertHandoff::serve_one(unsigned p) {
  std::atomic_thread_fence(std::memory_order_acquire);
  const int n = box_->n, T = box_->T, layer = box_->layer;
  const auto t0 = std::chrono::steady_clock::now();
  int g = 0;  // misses the device part took
  try {
    if (dev_ && T == 1 && n > 0) g = dev_->take(layer, h_.pairs, n);
    box_->n_dev = g;
    host_.compute(layer, h_.pairs + g, n - g, h_.rows, T, h_.part);
    if (g) dev_->wait();
  } catch (...) {
    // The device must not wait forever: it gets zeros, and end() throws.
    std::memset(h_.part, 0, std::size_t(T) * H_ * sizeof(float));
    box_->n_dev = 0;
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
  }
  const long long ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  host_ns_ += ns;
  handoffs_ += 1, misses_ += n, device_misses_ += g;
  if (T > 1) {
    seen_.assign(E_, 0);
    long experts = 0;
    for (int i = 0; i < n; ++i) {
      const int e = h_.pairs[i].expert;
      if (e >= 0 && e < E_ && !seen_[e]) seen_[e] = 1, ++experts;
    }
    prompt_ns_ += ns, prompt_misses_ += n, prompt_experts_ += experts;
  }
  std::atomic_thread_fence(std::memory_order_release);
  box_->done = p;
}

ExpertHandoff::Stats ExpertHandoff::prompt_stats() const {
  Stats s;
  s.prompt_host_ms = prompt_ns_ / 1e6, s.prompt_misses = prompt_misses_, s.prompt_experts = prompt_experts_;
  return s;
}

ExpertHandoff::Stats ExpertHandoff::stats() const {
  Stats s = prompt_stats();
  s.handoffs = handoffs_, s.misses = misses_, s.device_misses = device_misses_;
  s.host_ms = host_ns_ / 1e6;
  HandoffCounters c{};
  if (cudaMemcpy(&c, d_counters_, sizeof c, cudaMemcpyDeviceToHost) == cudaSuccess) {
    s.device_wait_ms = c.wait_ns / 1e6, s.device_work_ms = c.work_ns / 1e6, s.prompt_wait_ms = c.prompt_wait_ns / 1e6;
    s.pairs = static_cast<long>(c.pairs), s.pcie_misses = static_cast<long>(c.pcie);
    s.split_misses = static_cast<long>(c.split), s.split_rows = static_cast<long long>(c.split_rows);
  }
  return s;
}

}  // namespace coli::cuda::detail
