// WordCache: pre-token bytes -> BPE ids, remembered across encode() calls
// (HF tokenizers keeps such a cache too). Flat open-addressing table over
// two pools, so a hit costs one hash, one probe and one copy. Bounded: when
// it is full it is emptied and starts again. Not thread-safe: the tokenizer
// keeps one per thread.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace coli {

class WordCache {
 public:
  explicit WordCache(std::size_t max_words = 1 << 17) : max_words_(max_words) { clear(); }

  // Appends the cached ids of `word` to out and returns true, or returns false.
  bool get(std::string_view word, std::vector<int>& out) const;
  void put(std::string_view word, const int* ids, std::size_t n);
  void clear();
  std::size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t hash;
    uint32_t key_off, key_len, ids_off, ids_len;
  };
  static uint64_t hash(std::string_view s);
  std::size_t max_words_, count_ = 0;
  std::vector<Slot> slots_;  // key_len == 0: empty (the empty word is never cached)
  std::string keys_;
  std::vector<int> ids_;
};

}  // namespace coli
