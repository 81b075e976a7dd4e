// What the AMX kernels share (kernels_amx.cpp, kernels_amx_bf16.cpp): the
// CPUID check, the tile configuration (each kernel has its own tile shapes;
// a thread reloads them only when it switches kernels) and a 16x16 float
// transpose for storing tile results token-major. Include only from files
// compiled for AVX-512 and AMX.
#pragma once
#include <cpuid.h>
#include <immintrin.h>

#include <cstdint>

namespace coli::cpu::amx {

// CPUID leaf 7 EDX bit (22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8).
inline bool cpuid7_edx(int bit) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return d >> bit & 1;
}

struct TileShape {
  uint8_t rows;
  uint16_t colsb;
};

// Loads the shapes of tiles 0-7 unless this thread already has layout id.
inline void use_tiles(int id, const TileShape (&shapes)[8]) {
  thread_local int loaded = 0;
  if (loaded == id) return;
  struct {
    uint8_t palette_id = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = shapes[t].colsb, cfg.rows[t] = shapes[t].rows;
  _tile_loadconfig(&cfg);
  loaded = id;
}

// 16x16 float transpose: in r[i] = row i; out r[n] = column n.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

}  // namespace coli::cpu::amx
