// HostRegistry: the process's registrations of host memory with the CUDA
// driver (cudaHostRegister), shared by every backend of the process.
//
// The driver refuses to register a range twice (two backends over one
// coli-pin mirror, say) and answers with an error every sanitizer reports.
// Here each range is registered once, in pieces of at most 256 GiB (a copy
// whose source spans two registrations is refused, and one call takes at
// most 512 GiB), and reference-counted: a second lease on the same bytes
// only counts, and the last lease to go unregisters them. So the normal
// path makes no CUDA call that fails.
//
// Contract: lease(p, n) returns the pieces of [p, p + n) that are pinned
// for the lease's life: registered now, or already registered through the
// registry (by this or another lease). A piece the driver refuses (not
// registrable memory, too little lockable memory) is left out and the
// caller copies it the pageable way; its error is cleared. Ranges that
// overlap a registered piece without matching it exactly are not
// registered again: the part inside a registered piece counts as pinned.
// Thread-safe. A Lease is movable, not copyable; destroy it before the
// device context goes (the backend's destructor does).
#pragma once
#include <atomic>
#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace coli::cuda::detail {

using HostRanges = std::vector<std::pair<void*, std::size_t>>;

class HostRegistry {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : pieces_(std::move(o.pieces_)) { o.pieces_.clear(); }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }
    // The pinned pieces this lease holds, in the order asked.
    const HostRanges& pieces() const { return pieces_; }
    // Takes over o's pieces (o is then empty).
    void adopt(Lease&& o) {
      pieces_.insert(pieces_.end(), o.pieces_.begin(), o.pieces_.end());
      o.pieces_.clear();
    }
    void release();

   private:
    friend class HostRegistry;
    HostRanges pieces_;
  };

  static HostRegistry& instance();
  // Pins [p, p + n) for the lease's life (see the contract above).
  // read_only: the bytes are mapped read-only (a container file's
  // PROT_READ mapping), which the driver registers only as read-only for
  // the device (cudaHostRegisterReadOnly): copies from them and kernels
  // reading them work, writes do not.
  Lease lease(const void* p, std::size_t n, bool read_only = false);
  // How many pieces the registry holds (tests).
  std::size_t registered_pieces() const;
  // While on, new registrations fail (refuse_host_registrations, tests).
  void refuse(bool on) { refuse_ = on; }

  static constexpr std::size_t kPiece = std::size_t(256) << 30;

 private:
  HostRegistry() = default;
  struct Entry {
    void* base;
    std::size_t len;
    int refs;
  };
  void drop(void* base, std::size_t len);
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::atomic<bool> refuse_{false};
};

}  // namespace coli::cuda::detail
