#include "quant/format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"

namespace coli {

namespace {
constexpr FormatInfo kInfo[] = {
    {"f32", 0, false, false},          {"bf16", 0, false, false},        {"f16", 0, false, false},
    {"int8", 0, false, true},          {"int4", 0, false, true},         {"int4-g32", 32, false, true},
    {"int4-g64", 64, false, true},     {"int4-g128", 128, false, true},  {"int4-g32-asym", 32, true, true},
    {"int4-g64-asym", 64, true, true}, {"int4-g128-asym", 128, true, true}, {"fp8-e4m3-b128", 128, false, false},
};
constexpr std::size_t align_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }
}  // namespace

bool is_int4(QuantFormat f) { return f >= QuantFormat::I4 && f <= QuantFormat::I4_G128_ASYM; }

const FormatInfo& format_info(QuantFormat f) { return kInfo[static_cast<int>(f)]; }
const char* format_name(QuantFormat f) { return format_info(f).name; }

bool parse_format(const std::string& s, QuantFormat* out) {
  for (int i = 0; i < static_cast<int>(std::size(kInfo)); ++i)
    if (s == kInfo[i].name) {
      *out = static_cast<QuantFormat>(i);
      return true;
    }
  return false;
}

std::string container_format_names() {
  std::string s;
  for (int i = 0; i < static_cast<int>(QuantFormat::FP8_E4M3_B128); ++i) s += (i ? ", " : "") + std::string(kInfo[i].name);
  return s;
}

MatrixLayout layout_of(QuantFormat f, int64_t rows, int64_t cols) {
  MatrixLayout l;
  const auto R = static_cast<std::size_t>(rows), C = static_cast<std::size_t>(cols);
  switch (f) {
    case QuantFormat::F32: l.row_stride = C * 4; break;
    case QuantFormat::BF16:
    case QuantFormat::F16: l.row_stride = C * 2; break;
    case QuantFormat::FP8_E4M3_B128: l.row_stride = C; break;
    case QuantFormat::I8:
      l.row_stride = align_up(C, 16);
      l.groups = 1;
      l.scale_row_bytes = 4;
      break;
    default: {  // int4 family
      l.row_stride = align_up((C + 1) / 2, 16);
      const int g = format_info(f).group;
      l.groups = g ? static_cast<int64_t>((C + g - 1) / g) : 1;
      l.scale_row_bytes = g ? static_cast<std::size_t>(l.groups) * (format_info(f).asym ? 4 : 2) : 4;
    }
  }
  l.total = l.row_stride * R;
  if (l.scale_row_bytes) {
    l.scale_offset = align_up(l.total, 64);
    l.total = l.scale_offset + l.scale_row_bytes * R;
  }
  return l;
}

float fp8_e4m3_to_f32(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  float r;
  if (exp == 0xf && man == 7) r = NAN;  // e4m3fn: no infinities
  else if (exp == 0) r = std::ldexp(static_cast<float>(man), -9);  // man/8 * 2^-6
  else r = std::ldexp(1.0f + man / 8.0f, exp - 7);
  return sign ? -r : r;
}

void quantize_matrix(QuantFormat f, const float* src, int64_t rows, int64_t cols, uint8_t* dst) {
  const MatrixLayout l = layout_of(f, rows, cols);
  std::memset(dst, 0, l.total);
  quantize_rows(f, src, 0, rows, rows, cols, dst);
}

void quantize_rows(QuantFormat f, const float* src, int64_t row0, int64_t n, int64_t rows, int64_t cols, uint8_t* dst) {
  const MatrixLayout l = layout_of(f, rows, cols);
  const FormatInfo& fi = format_info(f);
  for (int64_t r = row0; r < row0 + n; ++r) {
    const float* x = src + (r - row0) * cols;
    uint8_t* row = dst + static_cast<std::size_t>(r) * l.row_stride;
    std::memset(row, 0, l.row_stride);
    uint8_t* sc = dst + l.scale_offset + static_cast<std::size_t>(r) * l.scale_row_bytes;
    switch (f) {
      case QuantFormat::F32: std::memcpy(row, x, cols * 4); continue;
      case QuantFormat::BF16:
        for (int64_t c = 0; c < cols; ++c) {
          const uint16_t h = f32_to_bf16(x[c]);
          std::memcpy(row + 2 * c, &h, 2);
        }
        continue;
      case QuantFormat::F16:
        for (int64_t c = 0; c < cols; ++c) {
          const uint16_t h = f32_to_f16(x[c]);
          std::memcpy(row + 2 * c, &h, 2);
        }
        continue;
      case QuantFormat::FP8_E4M3_B128: throw Error("fp8-e4m3-b128 is a source format; it cannot be written");
      case QuantFormat::I8: {
        float amax = 0;
        for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[c]));
        const float s = amax / 127.0f;
        std::memcpy(sc, &s, 4);
        for (int64_t c = 0; c < cols; ++c)
          row[c] = static_cast<uint8_t>(static_cast<int8_t>(s > 0 ? std::clamp(std::nearbyint(x[c] / s), -127.0f, 127.0f) : 0.0f));
        continue;
      }
      default: break;
    }
    // int4 family: one group per row (f32 scale) or groups of fi.group (f16).
    const int64_t g = fi.group ? fi.group : cols;
    for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += g, ++gi) {
      const int64_t g1 = std::min(cols, g0 + g);
      float s, m = 0;
      if (fi.asym) {
        float lo = x[g0], hi = x[g0];
        for (int64_t c = g0; c < g1; ++c) lo = std::min(lo, x[c]), hi = std::max(hi, x[c]);
        const uint16_t sh = f32_to_f16((hi - lo) / 15.0f), mh = f32_to_f16(lo);
        std::memcpy(sc + 4 * gi, &sh, 2);
        std::memcpy(sc + 4 * gi + 2, &mh, 2);
        s = f16_to_f32(sh);
        m = f16_to_f32(mh);
      } else {
        float amax = 0;
        for (int64_t c = g0; c < g1; ++c) amax = std::max(amax, std::fabs(x[c]));
        if (fi.group) {
          const uint16_t sh = f32_to_f16(amax / 7.0f);
          std::memcpy(sc + 2 * gi, &sh, 2);
          s = f16_to_f32(sh);
        } else {
          s = amax / 7.0f;
          std::memcpy(sc, &s, 4);
        }
      }
      for (int64_t c = g0; c < g1; ++c) {
        int q;
        if (fi.asym) q = s > 0 ? static_cast<int>(std::clamp(std::nearbyint((x[c] - m) / s), 0.0f, 15.0f)) : 0;
        else q = 8 + (s > 0 ? static_cast<int>(std::clamp(std::nearbyint(x[c] / s), -8.0f, 7.0f)) : 0);
        row[c / 2] |= static_cast<uint8_t>(q << (4 * (c & 1)));
      }
    }
  }
}

void dequantize_row(QuantFormat f, const uint8_t* base, int64_t rows, int64_t cols, int64_t r, float* dst, const float* aux) {
  const MatrixLayout l = layout_of(f, rows, cols);
  const uint8_t* row = base + static_cast<std::size_t>(r) * l.row_stride;
  const uint8_t* sc = base + l.scale_offset + static_cast<std::size_t>(r) * l.scale_row_bytes;
  const FormatInfo& fi = format_info(f);
  switch (f) {
    case QuantFormat::F32: std::memcpy(dst, row, cols * 4); return;
    case QuantFormat::BF16:
    case QuantFormat::F16:
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t h;
        std::memcpy(&h, row + 2 * c, 2);
        dst[c] = f == QuantFormat::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      return;
    case QuantFormat::FP8_E4M3_B128: {
      const int64_t bc = (cols + 127) / 128;
      const float* s = aux + (r / 128) * bc;
      for (int64_t c = 0; c < cols; ++c) dst[c] = fp8_e4m3_to_f32(row[c]) * s[c / 128];
      return;
    }
    case QuantFormat::I8: {
      float s;
      std::memcpy(&s, sc, 4);
      for (int64_t c = 0; c < cols; ++c) dst[c] = static_cast<int8_t>(row[c]) * s;
      return;
    }
    default: break;
  }
  if (!is_int4(f)) throw Error("dequantize_row: unknown format");
  const int64_t g = fi.group ? fi.group : cols;
  for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += g, ++gi) {
    float s, m = 0;
    if (fi.asym) {
      uint16_t sh, mh;
      std::memcpy(&sh, sc + 4 * gi, 2);
      std::memcpy(&mh, sc + 4 * gi + 2, 2);
      s = f16_to_f32(sh);
      m = f16_to_f32(mh);
    } else if (fi.group) {
      uint16_t sh;
      std::memcpy(&sh, sc + 2 * gi, 2);
      s = f16_to_f32(sh);
    } else {
      std::memcpy(&s, sc, 4);
    }
    const int64_t g1 = std::min(cols, g0 + g);
    for (int64_t c = g0; c < g1; ++c) {
      const int u = (row[c / 2] >> (4 * (c & 1))) & 0xf;
      dst[c] = fi.asym ? u * s + m : (u - 8) * s;
    }
  }
}

}  // namespace coli
