// Weight formats: layouts computed by hand, round trips against values
// re-derived here from the format's definition, error bounds, odd sizes.
#include "quant/format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/dtype.h"

using namespace coli;

namespace {
const QuantFormat kAll[] = {QuantFormat::F32,    QuantFormat::BF16,   QuantFormat::F16,         QuantFormat::I8,
                            QuantFormat::I4,     QuantFormat::I4_G32, QuantFormat::I4_G64,      QuantFormat::I4_G128,
                            QuantFormat::I4_G32_ASYM, QuantFormat::I4_G64_ASYM, QuantFormat::I4_G128_ASYM};

// The value format f must give back for x, from the definition in format.h,
// given the group's values.
float expected(QuantFormat f, float x, const std::vector<float>& group) {
  const FormatInfo& fi = format_info(f);
  float amax = 0, lo = group[0], hi = group[0];
  for (float v : group) amax = std::max(amax, std::fabs(v)), lo = std::min(lo, v), hi = std::max(hi, v);
  switch (f) {
    case QuantFormat::F32: return x;
    case QuantFormat::BF16: return bf16_to_f32(f32_to_bf16(x));
    case QuantFormat::F16: return f16_to_f32(f32_to_f16(x));
    case QuantFormat::I8: {
      const float s = amax / 127;
      return s > 0 ? std::clamp(std::nearbyint(x / s), -127.0f, 127.0f) * s : 0.0f;
    }
    default: break;
  }
  if (fi.asym) {
    const float s = f16_to_f32(f32_to_f16((hi - lo) / 15)), m = f16_to_f32(f32_to_f16(lo));
    return (s > 0 ? std::clamp(std::nearbyint((x - m) / s), 0.0f, 15.0f) : 0.0f) * s + m;
  }
  const float s = fi.group ? f16_to_f32(f32_to_f16(amax / 7)) : amax / 7;
  return s > 0 ? std::clamp(std::nearbyint(x / s), -8.0f, 7.0f) * s : 0.0f;
}
}  // namespace

TEST(Quant, LayoutsByHand) {
  // int4-g64 of [512, 2048]: 1024 code bytes per row; 32 f16 scales per row.
  MatrixLayout l = layout_of(QuantFormat::I4_G64, 512, 2048);
  EXPECT_EQ(l.row_stride, 1024u);
  EXPECT_EQ(l.groups, 32);
  EXPECT_EQ(l.scale_offset, 512u * 1024);
  EXPECT_EQ(l.total, 512u * 1024 + 512 * 64);
  EXPECT_DOUBLE_EQ(l.total * 8.0 / (512 * 2048), 4.25);  // bits per weight
  // Odd sizes: int8 [3, 33] -> rows padded to 48 bytes; scales at 64-aligned 192.
  l = layout_of(QuantFormat::I8, 3, 33);
  EXPECT_EQ(l.row_stride, 48u);
  EXPECT_EQ(l.scale_offset, 192u);
  EXPECT_EQ(l.total, 192u + 12);
  // int4-g32-asym [2, 65]: 33 code bytes -> 48; 3 groups of (scale, min) f16.
  l = layout_of(QuantFormat::I4_G32_ASYM, 2, 65);
  EXPECT_EQ(l.row_stride, 48u);
  EXPECT_EQ(l.groups, 3);
  EXPECT_EQ(l.scale_row_bytes, 12u);
  EXPECT_EQ(l.total, 128u + 24);
  EXPECT_EQ(layout_of(QuantFormat::BF16, 3, 5).total, 30u);
}

TEST(Quant, Int8HandComputed) {
  const float row[4] = {1.0f, -2.0f, 3.5f, 0.0f};
  std::vector<uint8_t> buf(layout_of(QuantFormat::I8, 1, 4).total);
  quantize_matrix(QuantFormat::I8, row, 1, 4, buf.data());
  const float s = 3.5f / 127;
  EXPECT_EQ(static_cast<int8_t>(buf[0]), 36);   // 1 / s = 36.29
  EXPECT_EQ(static_cast<int8_t>(buf[1]), -73);  // -72.57
  EXPECT_EQ(static_cast<int8_t>(buf[2]), 127);
  EXPECT_EQ(static_cast<int8_t>(buf[3]), 0);
  float out[4];
  dequantize_row(QuantFormat::I8, buf.data(), 1, 4, 0, out);
  EXPECT_FLOAT_EQ(out[1], -73 * s);
}

TEST(Quant, Int4NibbleOrderByHand) {
  // Symmetric per-row int4: amax 7 -> s = 1, codes = value + 8.
  const float row[3] = {7.0f, -3.0f, 1.0f};
  std::vector<uint8_t> buf(layout_of(QuantFormat::I4, 1, 3).total);
  quantize_matrix(QuantFormat::I4, row, 1, 3, buf.data());
  EXPECT_EQ(buf[0], (5 << 4) | 15);  // col 0 low nibble (15), col 1 high nibble (5)
  EXPECT_EQ(buf[1], 9);              // col 2
}

TEST(Quant, RoundTripEveryFormatOddSizes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (QuantFormat f : kAll) {
    for (int64_t cols : {1, 7, 31, 33, 64, 65, 130, 257}) {
      const int64_t rows = 3;
      std::vector<float> w(rows * cols);
      for (auto& v : w) v = nd(rng);
      if (cols > 4) w[2] = 0.4f;  // an outlier
      std::vector<uint8_t> buf(layout_of(f, rows, cols).total, 0xAB);
      quantize_matrix(f, w.data(), rows, cols, buf.data());
      std::vector<float> out(cols);
      const int g = format_info(f).group ? format_info(f).group : static_cast<int>(cols);
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(f, buf.data(), rows, cols, r, out.data());
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t g0 = c / g * g;
          std::vector<float> group(w.begin() + r * cols + g0, w.begin() + r * cols + std::min(cols, g0 + g));
          ASSERT_EQ(out[c], expected(f, w[r * cols + c], group)) << format_name(f) << " cols=" << cols << " r=" << r << " c=" << c;
          // Error bound: half a step of the group's scale.
          float amax = 0;
          for (float v : group) amax = std::max(amax, std::fabs(v));
          const float step = f == QuantFormat::I8 ? amax / 127 : format_info(f).quantized ? 2 * amax / 7 : std::fabs(w[r * cols + c]) / 128;
          ASSERT_LE(std::fabs(out[c] - w[r * cols + c]), step * 0.51f + 1e-7f) << format_name(f);
        }
      }
    }
  }
}

TEST(Quant, ConstantAndZeroGroups) {
  for (QuantFormat f : kAll) {
    std::vector<float> zero(70, 0.0f), konst(70, -0.25f);
    std::vector<uint8_t> buf(layout_of(f, 1, 70).total);
    std::vector<float> out(70);
    quantize_matrix(f, zero.data(), 1, 70, buf.data());
    dequantize_row(f, buf.data(), 1, 70, 0, out.data());
    for (float v : out) ASSERT_EQ(v, 0.0f) << format_name(f);
    quantize_matrix(f, konst.data(), 1, 70, buf.data());
    dequantize_row(f, buf.data(), 1, 70, 0, out.data());
    for (float v : out) ASSERT_NEAR(v, -0.25f, 1e-3f) << format_name(f);
  }
}

TEST(Quant, Fp8E4M3ByHand) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);      // exp 7, man 0
  EXPECT_EQ(fp8_e4m3_to_f32(0x3c), 1.5f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);    // largest finite
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  // Block scales: a [2, 130] matrix has 2 column blocks.
  std::vector<uint8_t> codes(2 * 130, 0x38);  // all 1.0
  const float scale_inv[2] = {0.5f, 4.0f};
  std::vector<float> out(130);
  dequantize_row(QuantFormat::FP8_E4M3_B128, codes.data(), 2, 130, 1, out.data(), scale_inv);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[127], 0.5f);
  EXPECT_EQ(out[128], 4.0f);
}

TEST(Quant, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // halfway: even
  for (uint32_t h = 0; h < 0x7c00; h += 3) ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h);
}
