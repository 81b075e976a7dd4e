#include "tokenizer/word_cache.h"

#include <cstring>

namespace coli {

uint64_t WordCache::hash(std::string_view s) {
  // FNV-1a over 8-byte chunks, then a final mix: words are short.
  uint64_t h = 1469598103934665603ULL ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 1099511628211ULL;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 1099511628211ULL;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 32);
}

void WordCache::clear() {
  std::size_t cap = 1;
  while (cap < max_words_ * 2) cap <<= 1;
  slots_.assign(cap, Slot{0, 0, 0, 0, 0});
  keys_.clear();
  ids_.clear();
  count_ = 0;
}

bool WordCache::get(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return false;
  const uint64_t h = hash(word);
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.key_len == 0) return false;
    if (s.hash == h && s.key_len == word.size() && std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0) {
      out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.ids_len);
      return true;
    }
  }
}

void WordCache::put(std::string_view word, const int* ids, std::size_t n) {
  if (word.empty() || word.size() > 256) return;  // long runs are rare: not worth the space
  if (count_ >= max_words_) clear();
  const uint64_t h = hash(word);
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = h & mask;
  while (slots_[i].key_len != 0) {
    const Slot& s = slots_[i];
    if (s.hash == h && s.key_len == word.size() && std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0) return;
    i = (i + 1) & mask;
  }
  slots_[i] = Slot{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(word.size()), static_cast<uint32_t>(ids_.size()),
                   static_cast<uint32_t>(n)};
  keys_.append(word);
  ids_.insert(ids_.end(), ids, ids + n);
  ++count_;
}

}  // namespace coli
