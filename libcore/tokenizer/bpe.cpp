#include "tokenizer/bpe.h"

#include <queue>

namespace coli {

void Bpe::add_merge(int left, int right, int merged, int rank) { merges_.emplace(key(left, right), Merge{rank, merged}); }

bool Bpe::encode(std::string_view word, std::vector<int>& out) const {
  const int n = static_cast<int>(word.size());
  if (n == 0) return true;
  std::vector<int> sym(n), prev(n), next(n);
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
  struct Cand {
    int rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(key(sym[pos], sym[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (sym[c.pos] < 0 || next[c.pos] < 0) continue;  // merged away meanwhile
    auto it = merges_.find(key(sym[c.pos], sym[next[c.pos]]));
    if (it == merges_.end() || it->second.id != c.id || it->second.rank != c.rank) continue;  // stale
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
