// ExpertHandoff: the post and join kernels and the host thread that serves
// them (see expert_handoff.cuh).
#include "expert_handoff.cuh"

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

namespace {

constexpr std::size_t kPairsAt = 512;
constexpr int kPostThreads = 256;

std::size_t rows_at(int max_T, int K) { return (kPairsAt + sizeof(ExpertPair) * std::size_t(max_T) * K + 255) / 256 * 256; }

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One block: the misses in pair order (a per-thread count, an exclusive
// scan, then each thread writes its own range), the rows, then the flag.
__global__ void __launch_bounds__(kPostThreads) post_kernel(int layer, const int* idx, const float* w, int ks, int K, int T, const uint8_t* resident, int E,
                                                           const float* hn, int H, HandoffBox* box, ExpertPair* pairs, float* rows, unsigned* seq,
                                                           unsigned long long* post_ns) {
  griddep_wait();
  __shared__ int start[kPostThreads + 1];
  const int n = T * K, tid = threadIdx.x;
  const int per = (n + kPostThreads - 1) / kPostThreads, p0 = min(n, tid * per), p1 = min(n, p0 + per);
  auto missing = [&](int p, int* e) {
    *e = idx[(p / K) * ks + p % K];
    return *e < E && !resident[*e];  // column K may hold the shared expert as E: resident
  };
  int c = 0, e;
  for (int p = p0; p < p1; ++p) c += missing(p, &e);
  start[tid + 1] = c;
  __syncthreads();
  if (tid == 0) {
    start[0] = 0;
    for (int i = 1; i <= kPostThreads; ++i) start[i] += start[i - 1];
  }
  __syncthreads();
  int o = start[tid];
  for (int p = p0; p < p1; ++p)
    if (missing(p, &e)) pairs[o++] = ExpertPair{p / K, e, w[(p / K) * ks + p % K]};
  for (long long i = tid; i < static_cast<long long>(T) * H; i += kPostThreads) rows[i] = hn[i];
  __syncthreads();
  if (tid == 0) {
    box->layer = layer, box->n = start[kPostThreads], box->T = T;
    const unsigned s = *seq + 1;
    *seq = s;
    __threadfence_system();  // the pairs, rows and header before the flag
    box->posted = s;
    *post_ns = global_ns();
  }
}

// Waits for the host's done flag to reach the last posted number, then adds
// the host's partial sums (read past every cache: the same addresses carry
// a new layer's sums each time).
__global__ void join_kernel(HandoffBox* box, const float* part, const unsigned* seq, float* routed, long long n, unsigned long long* wait_ns,
                            const unsigned long long* post_ns, unsigned long long* work_ns, const float* dpart) {
  griddep_wait();
  __shared__ int any, dev;
  if (threadIdx.x == 0) {
    const unsigned s = *seq;
    const unsigned long long t0 = global_ns();
    if (blockIdx.x == 0) atomicAdd(work_ns, t0 - *post_ns);  // the device's own work since the post
    while (box->done != s) __nanosleep(100);
    if (blockIdx.x == 0) atomicAdd(wait_ns, global_ns() - t0);
    any = box->n > 0;
    dev = dpart && box->n_dev > 0;
  }
  __syncthreads();
  if (!any) return;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long long>(gridDim.x) * blockDim.x)
    routed[i] += __ldcv(part + i) + (dev ? __ldcv(dpart + i) : 0.0f);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ExpertHandoff::ExpertHandoff(ExpertHost& host, int max_T, int K, int H, int E) : host_(host), max_T_(max_T), K_(K), H_(H), E_(E) {
  const std::size_t rows = std::size_t(max_T) * H * sizeof(float);
  const std::size_t bytes = rows_at(max_T, K) + 2 * rows;
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes, cudaHostAllocMapped), "cudaHostAlloc (expert handoff)");
  std::memset(p, 0, bytes);
  box_ = static_cast<Box*>(p);
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_box_), p, 0), "cudaHostGetDevicePointer");
  h_ = arrays_at(box_), d_ = arrays_at(d_box_);
  // The sequence number, then the wait, the last post's time and the work, in ns.
  check(cudaMalloc(&d_seq_, 32), "cudaMalloc (expert handoff counters)");
  d_wait_ns_ = reinterpret_cast<unsigned long long*>(reinterpret_cast<char*>(d_seq_) + 8);
  d_post_ns_ = d_wait_ns_ + 1, d_work_ns_ = d_wait_ns_ + 2;
  check(cudaMemset(d_seq_, 0, 32), "cudaMemset");
  worker_ = std::thread([this] { serve(); });
}

ExpertHandoff::~ExpertHandoff() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (d_seq_) cudaFree(d_seq_);
  if (box_) cudaFreeHost(box_);
}

ExpertHandoff::Arrays ExpertHandoff::arrays_at(Box* base) const {
  auto* b = reinterpret_cast<char*>(base);
  const std::size_t rows = rows_at(max_T_, K_), row_bytes = std::size_t(max_T_) * H_ * sizeof(float);
  return {reinterpret_cast<ExpertPair*>(b + kPairsAt), reinterpret_cast<float*>(b + rows), reinterpret_cast<float*>(b + rows + row_bytes)};
}

void ExpertHandoff::post(int layer, const int* idx, const float* w, int ks, int T, const uint8_t* resident, const float* hn, cudaStream_t s) {
  if (T > max_T_) throw Error("CUDA backend: expert handoff of " + std::to_string(T) + " tokens exceeds " + std::to_string(max_T_) + " (internal)");
  launch(post_kernel, 1, kPostThreads, 0, s, layer, idx, w, ks, K_, T, resident, E_, hn, H_, d_box_, d_.pairs, d_.rows, d_seq_, d_post_ns_);
}

void ExpertHandoff::join(float* routed, int T, cudaStream_t s) {
  const long long n = static_cast<long long>(T) * H_;
  const int blocks = static_cast<int>(std::min<long long>((n + 1023) / 1024, 264));
  launch(join_kernel, blocks, 256, 0, s, d_box_, static_cast<const float*>(d_.part), d_seq_, routed, n, d_wait_ns_, d_post_ns_, d_work_ns_, dpart_);
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
    host_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    handoffs_ += 1, pairs_ += static_cast<long>(T) * K_, misses_ += n, device_misses_ += g;
    std::atomic_thread_fence(std::memory_order_release);
    box_->done = p;
  }
}

ExpertHandoff::Stats ExpertHandoff::stats() const {
  Stats s;
  s.handoffs = handoffs_, s.pairs = pairs_, s.misses = misses_, s.device_misses = device_misses_;
  s.host_ms = host_ns_ / 1e6;
  unsigned long long ns = 0;
  if (cudaMemcpy(&ns, d_wait_ns_, sizeof ns, cudaMemcpyDeviceToHost) == cudaSuccess) s.device_wait_ms = ns / 1e6;
  if (cudaMemcpy(&ns, d_work_ns_, sizeof ns, cudaMemcpyDeviceToHost) == cudaSuccess) s.device_work_ms = ns / 1e6;
  return s;
}

}  // namespace coli::cuda::detail
