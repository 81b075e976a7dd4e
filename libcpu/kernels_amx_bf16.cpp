#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels_amx_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "amx_tiles.h"
#include "cpu_features.h"
#include "kernels_amx.h"

namespace coli::cpu {

namespace {

// Every tile 16 rows x 64 bytes: 0-3 = C (16 x 16 float), 4, 5 = A (16
// weight rows x 32 bf16), 6, 7 = B (16 column pairs x 16 tokens x 2 bf16).
void configure_tiles_bf16() { amx::use_tiles(2, {{16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}}); }

// Round to nearest even bf16 (no NaNs here: activations are finite).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

bool amx_bf16_available() {
  static const bool ok = amx::cpuid7_edx(22) && amx_available();  // amx_available asks for the tile permission
  return ok && active_level() == CpuLevel::kAvx512;
}

bool amx_bf16_applies(const Matrix& W, int T) {
  return T >= kAmxBf16MinTokens && W.format == QuantFormat::BF16 && W.cols % 32 == 0 && amx_bf16_available();
}

void Bf16Acts::reset(int tokens, int64_t columns) {
  T = tokens;
  cols = columns;
  B.resize(static_cast<std::size_t>(token_blocks()) * (cols / 32) * 2 * 512);
}

void prepare_bf16_acts_blocks(const float* x, int tb0, int tb1, Bf16Acts* out) {
  const int64_t cols = out->cols, nb = cols / 32;
  for (int tb = tb0; tb < tb1; ++tb)
    for (int64_t kb = 0; kb < nb; ++kb) {
      uint16_t* hi = out->B.data() + (static_cast<std::size_t>(tb) * nb + kb) * 1024;
      uint16_t* lo = hi + 512;
      for (int n = 0; n < 16; ++n) {
        const int t = tb * 16 + n;
        for (int kk = 0; kk < 16; ++kk)
          for (int j = 0; j < 2; ++j) {
            const float v = t < out->T ? x[static_cast<std::size_t>(t) * cols + kb * 32 + 2 * kk + j] : 0.0f;
            const uint16_t h = to_bf16(v);
            hi[kk * 32 + n * 2 + j] = h;
            lo[kk * 32 + n * 2 + j] = to_bf16(v - from_bf16(h));
          }
      }
    }
}

void prepare_bf16_acts(const float* x, int T, int64_t cols, Bf16Acts* out) {
  out->reset(T, cols);
  prepare_bf16_acts_blocks(x, 0, out->token_blocks(), out);
}

void matmul_rows_amx_bf16(const Matrix& W, const Bf16Acts& acts, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  configure_tiles_bf16();
  const int64_t cols = W.cols, nb = cols / 32, stride = cols * 2;  // bf16 rows: 2 bytes per column
  const int T = acts.T, ntb = acts.token_blocks();
  // Rows of a block past r1 (or past the matrix) come from a zeroed copy.
  thread_local std::vector<uint16_t> pad;
  alignas(64) float C[4][256];
  for (int64_t rb = r0; rb < r1; rb += 32) {
    const uint8_t* A[2];
    int nr[2];
    nr[0] = static_cast<int>(std::clamp<int64_t>(r1 - rb, 0, 16));
    nr[1] = static_cast<int>(std::clamp<int64_t>(r1 - rb - 16, 0, 16));
    if (nr[1] < 16) pad.assign(static_cast<std::size_t>(32) * cols, 0);
    for (int p = 0; p < 2; ++p) {
      const int64_t b0 = rb + 16 * p;
      if (nr[p] == 16) {
        A[p] = W.data + static_cast<std::size_t>(b0) * stride;
      } else {  // a zeroed block with the rows that exist (results of the others are not stored)
        uint16_t* dst = pad.data() + static_cast<std::size_t>(16) * cols * p;
        if (nr[p]) std::memcpy(dst, W.data + static_cast<std::size_t>(b0) * stride, static_cast<std::size_t>(nr[p]) * stride);
        A[p] = reinterpret_cast<const uint8_t*>(dst);
      }
    }
    for (int tb = 0; tb < ntb; tb += 2) {
      const bool two = tb + 1 < ntb;
      const uint16_t* B0 = acts.B.data() + static_cast<std::size_t>(tb) * nb * 1024;
      const uint16_t* B1 = two ? B0 + nb * 1024 : B0;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < nb; ++kb) {
        _tile_loadd(4, A[0] + kb * 64, static_cast<int>(stride));
        _tile_loadd(5, A[1] + kb * 64, static_cast<int>(stride));
        for (int part = 0; part < 2; ++part) {  // hi, then lo
          _tile_loadd(6, B0 + kb * 1024 + part * 512, 64);
          _tile_loadd(7, B1 + kb * 1024 + part * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, C[0], 64);
      _tile_stored(1, C[1], 64);
      _tile_stored(2, C[2], 64);
      _tile_stored(3, C[3], 64);
      for (int p = 0; p < 2; ++p)
        for (int q = 0; q < (two ? 2 : 1); ++q) {
          if (nr[p] == 0) continue;
          __m512 v[16];
          for (int i = 0; i < 16; ++i) v[i] = _mm512_load_ps(C[p * 2 + q] + i * 16);
          amx::transpose16(v);  // v[n] = token n's 16 rows
          const __mmask16 mask = static_cast<__mmask16>((1u << nr[p]) - 1);
          for (int n = 0; n < 16 && (tb + q) * 16 + n < T; ++n)
            _mm512_mask_storeu_ps(y + static_cast<std::size_t>((tb + q) * 16 + n) * ldy + rb + 16 * p, mask, v[n]);
        }
    }
  }
}

}  // namespace coli::cpu
