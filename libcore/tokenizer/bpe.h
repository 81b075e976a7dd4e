// Byte-pair encoding over token ids: a word starts as one id per byte and
// adjacent pairs are merged lowest merge rank first (leftmost first among
// equal ranks), the order HF tokenizers uses. O(n log n) in the word length.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace coli {

class Bpe {
 public:
  // byte_ids[b]: id of the single-byte token for byte b (-1 if absent).
  void set_byte_ids(const std::vector<int>& byte_ids) { byte_ids_ = byte_ids; }
  // Merge of (left, right) into `merged` with priority `rank` (lower first).
  void add_merge(int left, int right, int merged, int rank);
  std::size_t num_merges() const { return count_; }

  // Appends the ids of `word` (raw bytes) to out. Returns false if a byte has
  // no single-byte token.
  bool encode(std::string_view word, std::vector<int>& out) const;

 private:
  struct Merge {
    int rank, id;
  };
  static uint64_t key(int a, int b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }
  // Open addressing, linear probing, power-of-two size: merge lookups are the
  // hot loop of encoding, and a flat table keeps them to one or two cache lines.
  struct Slot {
    uint64_t key = kEmpty;
    Merge m{};
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  const Merge* find(int a, int b) const;
  void grow();
  std::vector<Slot> table_;
  std::size_t count_ = 0;
  std::vector<int> byte_ids_;
};

}  // namespace coli
