// Host-to-device copy rate from pageable memory, a cudaMallocHost buffer and
// a coli-pin mirror's shared memory registered with the device (the uploads'
// roofline; issue 17's target: the mirror at >= 95 % of cudaMallocHost).
// The mirror: COLI_BENCH_MIRROR=NAME (a ready segment, e.g. coli-pin start);
// without it the registered case maps a fresh POSIX shared-memory segment.
// bytes_per_second is the best of 5 copies of 2 GiB.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "copy_probe.h"

namespace {

namespace bip = boost::interprocess;
using coli::cuda::HostMemory;

void BM_H2D(benchmark::State& st) {
  const auto kind = static_cast<HostMemory>(st.range(0));
  constexpr std::size_t kBytes = std::size_t(2) << 30;
  std::string name;
  bip::mapped_region region;
  if (kind == HostMemory::kRegistered) {
    const char* m = std::getenv("COLI_BENCH_MIRROR");
    name = m ? m : "coli-h2d-bench-" + std::to_string(::getpid());
    try {
      if (!m) {
        bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write);
        shm.truncate(kBytes);
        region = bip::mapped_region(shm, bip::read_write);
        std::memset(region.get_address(), 1, kBytes);
      } else {
        bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
        region = bip::mapped_region(shm, bip::read_write);
      }
    } catch (const std::exception& e) {
      st.SkipWithError(e.what());
      return;
    }
    if (region.get_size() < kBytes) {
      st.SkipWithError("the mirror is smaller than 2 GiB");
      return;
    }
  }
  coli::cuda::CopyRate r;
  try {
    for (auto _ : st) r = coli::cuda::measure_h2d(kind, region.get_address(), kBytes, 5);
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
  if (kind == HostMemory::kRegistered && !std::getenv("COLI_BENCH_MIRROR")) bip::shared_memory_object::remove(name.c_str());
  st.counters["GB/s"] = r.gb_per_s;
  st.counters["register_ms"] = r.register_ms;
  st.SetLabel(kind == HostMemory::kPageable ? "pageable" : kind == HostMemory::kPinned ? "cudaMallocHost" : name);
}
BENCHMARK(BM_H2D)->Arg(0)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
