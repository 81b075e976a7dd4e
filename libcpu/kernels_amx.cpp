#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,fma,f16c,amx-tile,amx-int8")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels_amx.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "cpu_features.h"
#include "formats/dtype.h"

namespace coli::cpu {

namespace {

bool cpu_has_vbmi() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vbmi");
}

// Linux hands out the (large) tile state only on request.
bool request_tile_permission() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Tiles 0-3 = C (16 x 16 int32 products of 2 row blocks x 2 token blocks),
// 4, 5 = A (16 weight rows x 32 codes), 6, 7 = B (8 rows of 16 tokens x 4
// codes). K = 32 per product: one 32-column block, one scale.
void configure_tiles() { amx::use_tiles(1, {{16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 32}, {16, 32}, {8, 64}, {8, 64}}); }

// The code offset the products must take off: weight = scale x (code -
// offset) for symmetric int4 (8) and int8 with its sign bit flipped (128).
float code_offset(const Matrix& W) {
  if (W.format == QuantFormat::I8) return 128.0f;
  return format_info(W.format).asym ? 0.0f : 8.0f;
}

// Rows of A for up to kPanels blocks of 16 weight rows, each in tile order
// [kb][row][32]: per 32-column block the 32 codes (even columns, then odd:
// the activations' order).
constexpr int kPanels = 8;
struct WeightPanels {
  std::vector<uint8_t> A;  // [panel][kb][16][32]
  std::vector<float> sw;   // [panel][group][16]: each row's scale per group
  std::vector<float> mg;   // [panel][group][16]: asym minimum per group
  int64_t nb = 0, ng = 0;

  void shape(int64_t nblocks, int64_t ngroups) {
    nb = nblocks;
    A.resize(static_cast<std::size_t>(kPanels) * nb * 512);
    ng = ngroups;
    sw.resize(static_cast<std::size_t>(kPanels) * ng * 16);
    mg.resize(static_cast<std::size_t>(kPanels) * ng * 16);
  }
  uint8_t* a(int p) { return A.data() + static_cast<std::size_t>(p) * nb * 512; }
  float* s(int p) { return sw.data() + static_cast<std::size_t>(p) * ng * 16; }
};

// Writes 32-column block kb0+j's 32 codes (j = 0..3) from lo/hi halves
// holding four blocks' even / odd codes in 16-byte lanes.
inline void store_four_blocks(uint8_t* A, int64_t kb0, int i, __m512i even, __m512i odd) {
  const __m512i idx01 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i idx23 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  const __m512i b01 = _mm512_permutex2var_epi64(even, idx01, odd), b23 = _mm512_permutex2var_epi64(even, idx23, odd);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(A + ((kb0 + 0) * 16 + i) * 32), _mm512_castsi512_si256(b01));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(A + ((kb0 + 1) * 16 + i) * 32), _mm512_extracti64x4_epi64(b01, 1));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(A + ((kb0 + 2) * 16 + i) * 32), _mm512_castsi512_si256(b23));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(A + ((kb0 + 3) * 16 + i) * 32), _mm512_extracti64x4_epi64(b23, 1));
}

// Panel pi of ps = rows rb .. rb+nr-1 of W (rows past nr: zero).
void load_panel(const Matrix& W, const MatrixLayout& l, int64_t rb, int nr, WeightPanels& ps, int pi) {
  const FormatInfo& fi = format_info(W.format);
  const bool grouped = W.format != QuantFormat::I8 && fi.group, asym = grouped && fi.asym;
  const int64_t cols = W.cols, nsb = cols / 128, nb = cols / 32;
  const int64_t ng = grouped ? cols / fi.group : 1;
  uint8_t* A = ps.a(pi);
  float* sw = ps.s(pi);
  float* mg = ps.mg.data() + static_cast<std::size_t>(pi) * ng * 16;
  const __m512i mask = _mm512_set1_epi8(0x0f);
  alignas(64) uint8_t ie[64], io[64];
  if (W.format == QuantFormat::I8)
    for (int k = 0; k < 4; ++k)
      for (int c = 0; c < 16; ++c) ie[k * 16 + c] = static_cast<uint8_t>(k * 32 + 2 * c), io[k * 16 + c] = static_cast<uint8_t>(k * 32 + 2 * c + 1);
  // Codes, row by row.
  for (int i = 0; i < 16; ++i) {
    if (i >= nr) {  // padding rows: zero codes (and zero scales below)
      for (int64_t kb = 0; kb < nb; ++kb) std::memset(A + (kb * 16 + i) * 32, 0, 32);
      continue;
    }
    const uint8_t* row = W.data + static_cast<std::size_t>(rb + i) * l.row_stride;
    if (W.format == QuantFormat::I8) {
      const __m512i ve = _mm512_load_si512(ie), vo = _mm512_load_si512(io), flip = _mm512_set1_epi8(static_cast<char>(0x80));
      for (int64_t sb = 0; sb < nsb; ++sb) {
        const __m512i w0 = _mm512_loadu_si512(row + sb * 128), w1 = _mm512_loadu_si512(row + sb * 128 + 64);
        store_four_blocks(A, sb * 4, i, _mm512_xor_si512(_mm512_permutex2var_epi8(w0, ve, w1), flip),
                          _mm512_xor_si512(_mm512_permutex2var_epi8(w0, vo, w1), flip));
      }
      continue;
    }
    for (int64_t sb = 0; sb < nsb; ++sb) {  // int4: low nibbles = even columns, high = odd
      const __m512i c = _mm512_loadu_si512(row + sb * 64);
      store_four_blocks(A, sb * 4, i, _mm512_and_si512(c, mask), _mm512_and_si512(_mm512_srli_epi16(c, 4), mask));
    }
  }
  // Scales (and asym minimums), [group][row]: one f32 per row, or f16 per
  // group converted 16 groups x 16 rows at a time and transposed.
  auto scales_of = [&](int i) { return W.data + l.scale_offset + static_cast<std::size_t>(rb + i) * l.scale_row_bytes; };
  if (!grouped) {
    for (int i = 0; i < 16; ++i) {
      float s = 0.0f;
      if (i < nr) std::memcpy(&s, scales_of(i), 4);
      sw[i] = s;
      mg[i] = 0.0f;
    }
    return;
  }
  const __m512i even16 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd16 = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t g0 = 0; g0 < ng; g0 += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, ng - g0));
    __m512 vs[16], vm[16];
    for (int i = 0; i < 16; ++i) {
      vs[i] = vm[i] = _mm512_setzero_ps();
      if (i >= nr) continue;
      const uint16_t* h = reinterpret_cast<const uint16_t*>(scales_of(i));
      if (!asym) {
        vs[i] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), h + g0));
      } else {  // (scale, min) pairs
        const __m512i raw = _mm512_maskz_loadu_epi16(static_cast<__mmask32>((uint64_t(1) << (2 * n)) - 1), h + 2 * g0);
        const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(raw)), hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(raw, 1));
        vs[i] = _mm512_permutex2var_ps(lo, even16, hi);
        vm[i] = _mm512_permutex2var_ps(lo, odd16, hi);
      }
    }
    amx::transpose16(vs);
    for (int g = 0; g < n; ++g) _mm512_storeu_ps(sw + (g0 + g) * 16, vs[g]);
    if (asym) {
      amx::transpose16(vm);
      for (int g = 0; g < n; ++g) _mm512_storeu_ps(mg + (g0 + g) * 16, vm[g]);
    }
  }
}

// F[i] += sw[i] * (float(C[i]) * sx - offset * bsum) for one stored 16x16
// product: sum(code * act) scaled, less the code offset times the block's
// sum of x (per token); F is a 16x16 float accumulator in memory (L1).
inline void scale_into(float* F, const int32_t* C, const float* sx, const float* bsum, __m512 offset, const float* sw) {
  const __m512 vsx = _mm512_loadu_ps(sx), vo = _mm512_mul_ps(offset, _mm512_loadu_ps(bsum));
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    const __m512 prod = _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_load_si512(C + i * 16)), vsx, vo);
    _mm512_store_ps(F + i * 16, _mm512_fmadd_ps(prod, _mm512_set1_ps(sw[i]), _mm512_load_ps(F + i * 16)));
  }
}

// The micro-kernels: two row blocks (A0, A1: panels) against two or one
// token blocks (B0, B1), all 32-column blocks. Block kb's tile products are
// stored to C[kb & 1] and scaled into F while the tile unit computes block
// kb+1 (software pipelined). F: [row block][token block][16][16].
// Tiles: C = 0..3, A = 4, 5, B = 6, 7 (the intrinsics take literal numbers).
struct KernelArgs {
  const uint8_t *A0, *A1;
  const int8_t *B0, *B1;
  const float *sw0, *sw1, *sx0, *sx1, *bs0, *bs1;
  __m512 offset;
  int64_t nb;
  int gshift;  // block kb's scale group: kb >> gshift
};

void block_2x2(const KernelArgs& k, float* F) {
  alignas(64) int32_t C[2][4][256];
  for (int64_t kb = 0; kb <= k.nb; ++kb) {
    if (kb < k.nb) {
      int32_t (*c)[256] = C[kb & 1];
      _tile_loadd(4, k.A0 + kb * 512, 32);
      _tile_loadd(5, k.A1 + kb * 512, 32);
      _tile_loadd(6, k.B0 + kb * 512, 64);
      _tile_loadd(7, k.B1 + kb * 512, 64);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
      _tile_stored(0, c[0], 64);
      _tile_stored(1, c[1], 64);
      _tile_stored(2, c[2], 64);
      _tile_stored(3, c[3], 64);
    }
    if (kb > 0) {
      const int64_t j = kb - 1;
      int32_t (*c)[256] = C[j & 1];
      scale_into(F + 0 * 256, c[0], k.sx0 + j * 16, k.bs0 + j * 16, k.offset, k.sw0 + (j >> k.gshift) * 16);
      scale_into(F + 1 * 256, c[1], k.sx1 + j * 16, k.bs1 + j * 16, k.offset, k.sw0 + (j >> k.gshift) * 16);
      scale_into(F + 2 * 256, c[2], k.sx0 + j * 16, k.bs0 + j * 16, k.offset, k.sw1 + (j >> k.gshift) * 16);
      scale_into(F + 3 * 256, c[3], k.sx1 + j * 16, k.bs1 + j * 16, k.offset, k.sw1 + (j >> k.gshift) * 16);
    }
  }
}

void block_2x1(const KernelArgs& k, float* F) {
  alignas(64) int32_t C[2][2][256];
  for (int64_t kb = 0; kb <= k.nb; ++kb) {
    if (kb < k.nb) {
      int32_t (*c)[256] = C[kb & 1];
      _tile_loadd(4, k.A0 + kb * 512, 32);
      _tile_loadd(5, k.A1 + kb * 512, 32);
      _tile_loadd(6, k.B0 + kb * 512, 64);
      _tile_zero(0);
      _tile_zero(2);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(2, 5, 6);
      _tile_stored(0, c[0], 64);
      _tile_stored(2, c[1], 64);
    }
    if (kb > 0) {
      const int64_t j = kb - 1;
      int32_t (*c)[256] = C[j & 1];
      scale_into(F + 0 * 256, c[0], k.sx0 + j * 16, k.bs0 + j * 16, k.offset, k.sw0 + (j >> k.gshift) * 16);
      scale_into(F + 2 * 256, c[1], k.sx0 + j * 16, k.bs0 + j * 16, k.offset, k.sw1 + (j >> k.gshift) * 16);
    }
  }
}

}  // namespace

bool amx_available() {
  static const bool ok = detected_level() == CpuLevel::kAvx512 && amx::cpuid7_edx(24) && amx::cpuid7_edx(25) && cpu_has_vbmi() && request_tile_permission();
  return ok && active_level() == CpuLevel::kAvx512 && vnni_available();
}

bool amx_applies(const Matrix& W, int T) {
  return T >= kAmxMinTokens && (is_int4(W.format) || W.format == QuantFormat::I8) && W.cols % 128 == 0 && amx_available();
}

void AmxActs::reset(const QuantizedActs& qa) {
  T = qa.T;
  cols = qa.cols;
  const std::size_t blocks = static_cast<std::size_t>(token_blocks()) * (cols / 32);
  B.resize(blocks * 512);
  sx.resize(blocks * 16);
  bsum.resize(blocks * 16);
}

void prepare_amx_acts_blocks(const QuantizedActs& qa, int tb0, int tb1, AmxActs* out) {
  const int64_t cols = qa.cols, nsb = cols / 128, nb = cols / 32;
  const int T = qa.T;
  // k order inside a block: the 16 even columns, then the 16 odd ones (as in
  // QuantizedActs and as the weight codes come); tile row r holds k = 4r ..
  // 4r+3 of each of the 16 tokens.
  for (int tb = tb0; tb < tb1; ++tb)
    for (int64_t kb = 0; kb < nb; ++kb) {
      const std::size_t blk = static_cast<std::size_t>(tb) * nb + kb;
      float* sx = out->sx.data() + blk * 16;
      float* bs = out->bsum.data() + blk * 16;
      const int64_t sb = kb / 4, k = kb % 4;
      alignas(64) int32_t w[8][16];
      for (int n = 0; n < 16; ++n) {
        const int t = tb * 16 + n;
        if (t >= T) {
          for (int r = 0; r < 8; ++r) w[r][n] = 0;
          sx[n] = bs[n] = 0.0f;
          continue;
        }
        const int8_t* even = qa.codes.data() + (t * nsb + sb) * 128 + k * 16;
        const int8_t* odd = even + 64;
        for (int r = 0; r < 4; ++r) {
          std::memcpy(&w[r][n], even + 4 * r, 4);
          std::memcpy(&w[r + 4][n], odd + 4 * r, 4);
        }
        sx[n] = qa.lanes[(t * nsb + sb) * 16 + k * 4];
        bs[n] = qa.bsum[t * nb + kb];
      }
      std::memcpy(out->B.data() + blk * 512, w, 512);
    }
}

void prepare_amx_acts(const QuantizedActs& qa, AmxActs* out) {
  out->reset(qa);
  prepare_amx_acts_blocks(qa, 0, out->token_blocks(), out);
}

void matmul_rows_amx(const Matrix& W, const AmxActs& acts, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  configure_tiles();
  const MatrixLayout l = layout_of(W.format, W.rows, W.cols);
  const FormatInfo& fi = format_info(W.format);
  const bool asym = W.format != QuantFormat::I8 && fi.asym;
  const int64_t cols = W.cols, nb = cols / 32;
  const int64_t G = fi.group ? fi.group : cols, ng = cols / G;
  const int T = acts.T, ntb = acts.token_blocks();
  const int8_t* B = acts.B.data();
  const float* sx = acts.sx.data();
  // asym: per 16-token block, the sum of x over each weight group.
  thread_local std::vector<float> xg;
  if (asym) {
    xg.assign(static_cast<std::size_t>(ntb) * ng * 16, 0.0f);
    for (int tb = 0; tb < ntb; ++tb)
      for (int64_t kb = 0; kb < nb; ++kb)
        for (int n = 0; n < 16; ++n)
          xg[(static_cast<std::size_t>(tb) * ng + kb * 32 / G) * 16 + n] += acts.bsum[(static_cast<std::size_t>(tb) * nb + kb) * 16 + n];
  }
  // Rows in chunks of up to kPanels row blocks, unpacked once; tokens in
  // groups of kTokenBlocks blocks (their B, 1 KB per 32 columns each, stays
  // in L2 while the chunk's row blocks pass over it).
  constexpr int kTokenBlocks = 8;
  thread_local WeightPanels panels;
  const bool grouped = W.format != QuantFormat::I8 && fi.group;
  const int gshift = !grouped ? 62 : fi.group == 32 ? 0 : fi.group == 64 ? 1 : 2;
  panels.shape(nb, grouped ? ng : 1);
  const __m512 offset = _mm512_set1_ps(code_offset(W));
  const float* bsum = acts.bsum.data();
  alignas(64) float F[4][256];
  for (int64_t c0 = r0; c0 < r1; c0 += kPanels * 16) {
    const int64_t c1 = std::min(r1, c0 + kPanels * 16);
    const int npanels = static_cast<int>((c1 - c0 + 31) / 32 * 2);  // pairs
    for (int p = 0; p < npanels; ++p) {
      const int64_t rb = c0 + p * 16;
      load_panel(W, l, rb, static_cast<int>(std::clamp<int64_t>(c1 - rb, 0, 16)), panels, p);
    }
    for (int g0 = 0; g0 < ntb; g0 += kTokenBlocks) {
      const int g1 = std::min(ntb, g0 + kTokenBlocks);
      for (int p = 0; p < npanels; p += 2)
        for (int tb = g0; tb < g1; tb += 2) {
          const int tt = std::min(2, g1 - tb);
          KernelArgs k{panels.a(p), panels.a(p + 1), B + static_cast<std::size_t>(tb) * nb * 512, nullptr, panels.s(p), panels.s(p + 1),
                       sx + static_cast<std::size_t>(tb) * nb * 16, nullptr, bsum + static_cast<std::size_t>(tb) * nb * 16, nullptr, offset, nb, gshift};
          std::memset(F, 0, sizeof F);
          if (tt == 2) {
            k.B1 = k.B0 + nb * 512;
            k.sx1 = k.sx0 + nb * 16;
            k.bs1 = k.bs0 + nb * 16;
            block_2x2(k, &F[0][0]);
          } else {
            block_2x1(k, &F[0][0]);
          }
          // F[r * 2 + t]: row block p + r, token block tb + t.
          for (int r = 0; r < 2; ++r)
            for (int t = 0; t < tt; ++t) {
              const int64_t rb = c0 + (p + r) * 16;
              const int nr = static_cast<int>(std::clamp<int64_t>(c1 - rb, 0, 16));
              if (nr == 0) continue;
              __m512 v[16];
              for (int i = 0; i < 16; ++i) v[i] = _mm512_load_ps(F[r * 2 + t] + i * 16);
              if (asym) {  // minimum times each group's sum of x
                const float* mg = panels.mg.data() + static_cast<std::size_t>(p + r) * ng * 16;
                for (int64_t g = 0; g < ng; ++g) {
                  const __m512 vx = _mm512_loadu_ps(xg.data() + (static_cast<std::size_t>(tb + t) * ng + g) * 16);
#pragma GCC unroll 16
                  for (int i = 0; i < 16; ++i) v[i] = _mm512_fmadd_ps(_mm512_set1_ps(mg[g * 16 + i]), vx, v[i]);
                }
              }
              amx::transpose16(v);  // v[n] = token n's 16 rows
              const __mmask16 rows_mask = static_cast<__mmask16>((1u << nr) - 1);
              for (int n = 0; n < 16 && (tb + t) * 16 + n < T; ++n)
                _mm512_mask_storeu_ps(y + static_cast<std::size_t>((tb + t) * 16 + n) * ldy + rb, rows_mask, v[n]);
            }
        }
    }
  }
}

}  // namespace coli::cpu
