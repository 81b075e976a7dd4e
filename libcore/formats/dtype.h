// Element types of checkpoint tensors and their conversion to float.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace coli {

enum class DType { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2 };

// Parses a safetensors dtype string ("BF16", "F32", ...). Returns false if unknown.
bool parse_dtype(const std::string& s, DType* out);
const char* dtype_name(DType t);
std::size_t dtype_size(DType t);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE half to float, exact for every input (subnormals, inf, NaN included).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do { ++e; man <<= 1; } while ((man & 0x400) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even float -> bf16 (NaN kept quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

// Converts n elements of a float-like dtype (F32, F16, BF16) to float.
// Throws coli::Error for other dtypes.
void to_f32(DType t, const void* src, std::size_t n, float* dst);

}  // namespace coli
