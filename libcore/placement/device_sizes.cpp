#include "placement/device_sizes.h"

#include <algorithm>

namespace coli {

bool attention_split_supported(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256; }

int attention_splits(int T, int cap, int* keys_per_split) {
  // Decode: up to 64 splits of at least 64 keys, so that a long context
  // keeps 64 x heads blocks busy. A prompt chunk already has T x heads
  // blocks: one split each (its partials are then T x heads x (hd + 2)).
  const int splits = T == 1 ? std::max(1, std::min(64, (cap + 63) / 64)) : 1;
  *keys_per_split = (cap + splits - 1) / splits;
  return splits;
}

int float_tiled_slices(int cols) { return (cols + kFloatTiledSlice - 1) / kFloatTiledSlice; }

std::size_t float_tiled_work_floats(int T, int rows, int cols) { return std::size_t(float_tiled_slices(cols)) * T * rows; }

std::size_t gdn_chunk_workspace_floats(int T, int value_heads, int key_dim, int value_dim) {
  return std::size_t(T) * value_heads * (key_dim + value_dim + kGdnChunk + 2);
}

}  // namespace coli
