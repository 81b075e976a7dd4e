#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,amx-tile,amx-int8")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_features.h"
#include "formats/dtype.h"

namespace coli::cpu {

namespace {

bool cpu_has_amx_int8() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 24 & 1) && (d >> 25 & 1);  // AMX-TILE, AMX-INT8
}

// Linux hands out the (large) tile state only on request.
bool request_tile_permission() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

struct TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0 = C (16 rows x 16 int32), 1 = A (16 rows x 32 u8), 2 = B (8 rows x 64 s8).
void configure_tiles() {
  thread_local bool done = false;
  if (done) return;
  TileConfig cfg;
  cfg.colsb[0] = 64, cfg.rows[0] = 16;
  cfg.colsb[1] = 32, cfg.rows[1] = 16;
  cfg.colsb[2] = 64, cfg.rows[2] = 8;
  _tile_loadconfig(&cfg);
  done = true;
}

}  // namespace

bool amx_available() {
  static const bool ok = detected_level() == CpuLevel::kAvx512 && cpu_has_amx_int8() && request_tile_permission();
  return ok && active_level() == CpuLevel::kAvx512 && vnni_available();
}

bool amx_applies(const Matrix& W, int T) { return T >= 16 && vnni_applies_gemm(W) && amx_available(); }

void prepare_amx_acts(const QuantizedActs& qa, AmxActs* out) {
  const int64_t cols = qa.cols, nsb = cols / 128, nb = cols / 32;
  const int T = qa.T, ntb = (T + 15) / 16;
  out->T = T;
  out->cols = cols;
  // k order inside a 32-column block: the 16 even columns, then the 16 odd
  // ones (as in QuantizedActs, and as the weight nibbles come).
  out->B.assign(static_cast<std::size_t>(ntb) * nb * 512, 0);
  out->sx.assign(static_cast<std::size_t>(ntb) * nb * 16, 0.0f);
  out->bsum.assign(static_cast<std::size_t>(ntb) * nb * 16, 0.0f);
  for (int t = 0; t < T; ++t) {
    const int tb = t / 16, n = t % 16;
    for (int64_t kb = 0; kb < nb; ++kb) {
      const int64_t sb = kb / 4, k = kb % 4;
      const int8_t* even = qa.codes.data() + (t * nsb + sb) * 128 + k * 16;
      const int8_t* odd = even + 64;
      int8_t* dst = out->B.data() + (static_cast<std::size_t>(tb) * nb + kb) * 512;
      for (int i = 0; i < 4; ++i) {
        std::memcpy(dst + i * 64 + n * 4, even + 4 * i, 4);
        std::memcpy(dst + (i + 4) * 64 + n * 4, odd + 4 * i, 4);
      }
      out->sx[(static_cast<std::size_t>(tb) * nb + kb) * 16 + n] = qa.lanes[(t * nsb + sb) * 16 + k * 4];
      out->bsum[(static_cast<std::size_t>(tb) * nb + kb) * 16 + n] = qa.bsum[t * nb + kb];
    }
  }
}

void matmul_rows_amx(const Matrix& W, const AmxActs& acts, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  configure_tiles();
  const MatrixLayout l = layout_of(W.format, W.rows, W.cols);
  const FormatInfo& fi = format_info(W.format);
  const int64_t cols = W.cols, nb = cols / 32;
  const int64_t G = fi.group ? fi.group : cols, ng = (cols + G - 1) / G;
  const int T = acts.T, ntb = (T + 15) / 16;
  const std::vector<int8_t>& B = acts.B;
  const std::vector<float>& sx = acts.sx;
  // Per 16-token block, the sum of x over each weight group.
  thread_local std::vector<float> xg;
  xg.assign(static_cast<std::size_t>(ntb) * ng * 16, 0.0f);
  for (int tb = 0; tb < ntb; ++tb)
    for (int64_t kb = 0; kb < nb; ++kb)
      for (int n = 0; n < 16; ++n)
        xg[(static_cast<std::size_t>(tb) * ng + kb * 32 / G) * 16 + n] += acts.bsum[(static_cast<std::size_t>(tb) * nb + kb) * 16 + n];

  thread_local std::vector<uint8_t> A;      // [16 rows][cols] unpacked codes of a row block
  thread_local std::vector<float> sw, kg;   // [16][ng]
  A.resize(16 * cols);
  sw.resize(16 * ng);
  kg.resize(16 * ng);
  alignas(64) int32_t C[16][16];
  const __m128i mask = _mm_set1_epi8(0x0f);
  for (int64_t rb = r0; rb < r1; rb += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, r1 - rb));
    for (int i = 0; i < 16; ++i) {
      uint8_t* dst = A.data() + i * cols;
      if (i >= nr) {
        std::memset(dst, 0, cols);
        std::fill(sw.begin() + i * ng, sw.begin() + (i + 1) * ng, 0.0f);
        std::fill(kg.begin() + i * ng, kg.begin() + (i + 1) * ng, 0.0f);
        continue;
      }
      const uint8_t* row = W.data + static_cast<std::size_t>(rb + i) * l.row_stride;
      for (int64_t kb = 0; kb < nb; ++kb) {  // [even16 | odd16] = [low nibbles | high nibbles]
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + kb * 16));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + kb * 32), _mm_and_si128(c, mask));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + kb * 32 + 16), _mm_and_si128(_mm_srli_epi16(c, 4), mask));
      }
      const uint8_t* sc = W.data + l.scale_offset + static_cast<std::size_t>(rb + i) * l.scale_row_bytes;
      for (int64_t g = 0; g < ng; ++g) {
        float s, m;
        if (!fi.group) {
          std::memcpy(&s, sc, 4);
          m = -8.0f * s;
        } else if (fi.asym) {
          s = f16_to_f32(reinterpret_cast<const uint16_t*>(sc)[2 * g]);
          m = f16_to_f32(reinterpret_cast<const uint16_t*>(sc)[2 * g + 1]);
        } else {
          s = f16_to_f32(reinterpret_cast<const uint16_t*>(sc)[g]);
          m = -8.0f * s;
        }
        sw[i * ng + g] = s;
        kg[i * ng + g] = m;
      }
    }
    for (int tb = 0; tb < ntb; ++tb) {
      __m512 F[16];
      for (int i = 0; i < 16; ++i) F[i] = _mm512_setzero_ps();
      for (int64_t kb = 0; kb < nb; ++kb) {
        _tile_zero(0);
        _tile_loadd(1, A.data() + kb * 32, static_cast<int>(cols));
        _tile_loadd(2, B.data() + (static_cast<std::size_t>(tb) * nb + kb) * 512, 64);
        _tile_dpbusd(0, 1, 2);
        _tile_stored(0, C, 64);
        const __m512 vsx = _mm512_loadu_ps(sx.data() + (static_cast<std::size_t>(tb) * nb + kb) * 16);
        const int64_t g = kb * 32 / G;
        for (int i = 0; i < 16; ++i)
          F[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(C[i])), _mm512_mul_ps(vsx, _mm512_set1_ps(sw[i * ng + g])), F[i]);
      }
      // Offset (sym) or minimum (asym) times each group's sum of x.
      for (int64_t g = 0; g < ng; ++g) {
        const __m512 vx = _mm512_loadu_ps(xg.data() + (static_cast<std::size_t>(tb) * ng + g) * 16);
        for (int i = 0; i < 16; ++i) F[i] = _mm512_fmadd_ps(_mm512_set1_ps(kg[i * ng + g]), vx, F[i]);
      }
      alignas(64) float out[16];
      for (int i = 0; i < nr; ++i) {
        _mm512_store_ps(out, F[i]);
        for (int n = 0; n < 16 && tb * 16 + n < T; ++n) y[static_cast<std::size_t>(tb * 16 + n) * ldy + rb + i] = out[n];
      }
    }
  }
}

}  // namespace coli::cpu
