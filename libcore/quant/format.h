// Weight formats: how one [rows, cols] matrix is stored, with scalar
// reference quantize / dequantize. Fast kernels are tested against these.
//
// Every quantized format stores the integer codes first, row-major, each row
// padded to a multiple of 16 bytes (aligned vector loads on CPU and GPU), then
// at a 64-byte-aligned offset the scales:
//   int8        codes int8 [rows][stride]            scales f32 [rows]       w = q * s
//   int4        codes u4   [rows][stride]            scales f32 [rows]       w = (u - 8) * s
//   int4-gN     codes u4                             scales f16 [rows][ceil(cols/N)]
//   int4-gN-asym codes u4                            (scale, min) f16 pairs [rows][ceil(cols/N)]  w = u * s + m
// u4 codes: byte j of a row holds column 2j in its low nibble, 2j+1 in the high.
// Symmetric scales are absmax/127 (int8) or absmax/7 (int4); codes are
// round-to-nearest of w / s with s the stored (f16-rounded) scale.
// f32, bf16 and f16 are plain row-major. fp8-e4m3 (block 128x128, scale_inv
// f32 per block) exists only as a source format of checkpoints.
// man/coli-container.5 documents the same layouts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "quant/half.h"

namespace coli {

enum class QuantFormat : uint8_t {
  F32,
  BF16,
  F16,
  I8,
  I4,
  I4_G32,
  I4_G64,
  I4_G128,
  I4_G32_ASYM,
  I4_G64_ASYM,
  I4_G128_ASYM,
  FP8_E4M3_B128,  // source checkpoints only
};

struct FormatInfo {
  const char* name;
  int group;  // 0: one scale per row (or none for float formats)
  bool asym;
  bool quantized;
};
const FormatInfo& format_info(QuantFormat f);
bool is_int4(QuantFormat f);  // int4, int4-gN, int4-gN-asym
const char* format_name(QuantFormat f);
// Parses "f32", "bf16", "f16", "int8", "int4", "int4-g64", "int4-g64-asym", ...
bool parse_format(const std::string& s, QuantFormat* out);
// The formats a container may hold (not fp8), for --help texts.
std::string container_format_names();

struct MatrixLayout {
  std::size_t row_stride = 0;      // bytes per row of codes / values
  std::size_t scale_offset = 0;    // from the matrix start; 0 if no scales
  std::size_t scale_row_bytes = 0; // bytes of scales per row
  std::size_t total = 0;           // bytes of the whole matrix
  int64_t groups = 0;              // scale groups per row
};
MatrixLayout layout_of(QuantFormat f, int64_t rows, int64_t cols);

// Scalar reference: quantizes src [rows][cols] f32 into dst (layout_of(...).total
// bytes, padding zeroed). Not for FP8 (a source-only format).
void quantize_matrix(QuantFormat f, const float* src, int64_t rows, int64_t cols, uint8_t* dst);
// The same for rows [row0, row0 + n) only, src holding just those rows:
// writes their codes, padding and scales into the matrix at dst. Row ranges
// are independent, so a matrix can be quantized by several threads.
void quantize_rows(QuantFormat f, const float* src, int64_t row0, int64_t n, int64_t rows, int64_t cols, uint8_t* dst);
// Dequantizes row r of a matrix stored at base. For FP8_E4M3_B128, aux is the
// f32 scale_inv tensor [ceil(rows/128)][ceil(cols/128)]; unused otherwise.
void dequantize_row(QuantFormat f, const uint8_t* base, int64_t rows, int64_t cols, int64_t r, float* dst, const float* aux = nullptr);

float fp8_e4m3_to_f32(uint8_t v);

}  // namespace coli
