// HostRegistry (see host_registry.cuh).
#include "host_registry.cuh"

#include "cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace coli::cuda::detail {

namespace {

bool inside(const void* base, std::size_t len, const void* p, std::size_t n) {
  const auto b = reinterpret_cast<std::uintptr_t>(base), s = reinterpret_cast<std::uintptr_t>(p);
  return s >= b && s - b <= len && n <= len - (s - b);
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

}  // namespace

HostRegistry& HostRegistry::instance() {
  static HostRegistry* r = new HostRegistry;  // never destroyed: leases may outlive static destruction order
  return *r;
}

HostRegistry::Lease& HostRegistry::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    pieces_ = std::move(o.pieces_);
    o.pieces_.clear();
  }
  return *this;
}

void HostRegistry::Lease::release() {
  for (auto [p, n] : pieces_) HostRegistry::instance().drop(p, n);
  pieces_.clear();
}

HostRegistry::Lease HostRegistry::lease(const void* p, std::size_t n, bool read_only) {
  Lease out;
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t o = 0; o < n; o += kPiece) {
    void* piece = const_cast<uint8_t*>(static_cast<const uint8_t*>(p)) + o;
    const std::size_t len = std::min(kPiece, n - o);
    // Registered already (the same piece, or one holding it): one more
    // reference on that registration. A piece that only overlaps registered
    // bytes cannot be registered (the driver refuses): left to the pageable
    // path.
    auto held = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return inside(e.base, e.len, piece, len); });
    if (held != entries_.end()) {
      ++held->refs;
      out.pieces_.push_back({held->base, held->len});
      continue;
    }
    if (std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return overlaps(e.base, e.len, piece, len); })) continue;
    if (refuse_ || cudaHostRegister(piece, len, read_only ? cudaHostRegisterReadOnly : cudaHostRegisterDefault) != cudaSuccess) {
      cudaGetLastError();  // not registrable: the pageable path
      continue;
    }
    entries_.push_back({piece, len, 1});
    out.pieces_.push_back({piece, len});
  }
  return out;
}

void HostRegistry::drop(void* base, std::size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.base == base && e.len == len; });
  if (it == entries_.end() || --it->refs > 0) return;
  cudaHostUnregister(it->base);
  entries_.erase(it);
}

std::size_t HostRegistry::registered_pieces() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace coli::cuda::detail

namespace coli::cuda {

std::size_t registered_host_ranges() { return detail::HostRegistry::instance().registered_pieces(); }

HostPin::HostPin(const void* p, std::size_t n, bool read_only) {
  if (device_count() == 0) return;
  auto* lease = new detail::HostRegistry::Lease(detail::HostRegistry::instance().lease(p, n, read_only));
  for (auto piece : lease->pieces()) bytes_ += piece.second;
  bytes_ = std::min(bytes_, n);  // a piece registered already may hold more than was asked
  lease_ = std::shared_ptr<void>(lease, [](void* l) { delete static_cast<detail::HostRegistry::Lease*>(l); });
}

void refuse_host_registrations(bool on) { detail::HostRegistry::instance().refuse(on); }

}  // namespace coli::cuda
