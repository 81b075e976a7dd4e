#include "tokenizer/bpe.h"

#include <algorithm>
#include <functional>

namespace coli {

namespace {
inline std::size_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return static_cast<std::size_t>(k);
}
}  // namespace

void Bpe::grow() {
  std::vector<Slot> old = std::move(table_);
  table_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
  count_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) add_merge(static_cast<int>(s.key >> 32), static_cast<int>(s.key & 0xffffffffu), s.m.id, s.m.rank);
}

// A later merge of the same pair replaces the earlier one, as in HF tokenizers.
void Bpe::add_merge(int left, int right, int merged, int rank) {
  if ((count_ + 1) * 2 > table_.size()) grow();
  const uint64_t k = key(left, right);
  const std::size_t mask = table_.size() - 1;
  for (std::size_t i = mix(k) & mask;; i = (i + 1) & mask) {
    if (table_[i].key == k) {
      table_[i].m = Merge{rank, merged};
      return;
    }
    if (table_[i].key == kEmpty) {
      table_[i] = Slot{k, Merge{rank, merged}};
      ++count_;
      return;
    }
  }
}

const Bpe::Merge* Bpe::find(int a, int b) const {
  if (table_.empty()) return nullptr;
  const uint64_t k = key(a, b);
  const std::size_t mask = table_.size() - 1;
  for (std::size_t i = mix(k) & mask;; i = (i + 1) & mask) {
    if (table_[i].key == k) return &table_[i].m;
    if (table_[i].key == kEmpty) return nullptr;
  }
}

bool Bpe::encode(std::string_view word, std::vector<int>& out) const {
  const int n = static_cast<int>(word.size());
  if (n == 0) return true;
  struct Cand {
    int rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  // Scratch reused across calls on this thread: encoding is allocation-free
  // once warm.
  thread_local std::vector<int> sym, prev, next;
  thread_local std::vector<Cand> heap;
  sym.resize(n);
  prev.resize(n);
  next.resize(n);
  for (int i = 0; i < n; ++i) {
    sym[i] = byte_ids_[static_cast<unsigned char>(word[i])];
    if (sym[i] < 0) return false;
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  if (n == 1) {
    out.push_back(sym[0]);
    return true;
  }
  heap.clear();
  const auto cmp = std::greater<Cand>();
  auto consider = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Merge* m = find(sym[pos], sym[next[pos]])) {
      heap.push_back({m->rank, pos, m->id});
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const Cand c = heap.back();
    heap.pop_back();
    if (sym[c.pos] < 0 || next[c.pos] < 0) continue;  // merged away meanwhile
    const Merge* m = find(sym[c.pos], sym[next[c.pos]]);
    if (!m || m->id != c.id || m->rank != c.rank) continue;  // stale
    const int r = next[c.pos];
    sym[c.pos] = c.id;
    sym[r] = -1;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
  return true;
}

}  // namespace coli
