#include "formats/dtype.h"

#include "util/error.h"

namespace coli {

namespace {
struct DTypeInfo {
  const char* name;
  DType t;
  std::size_t size;
};
constexpr DTypeInfo kTypes[] = {
    {"F32", DType::F32, 4},   {"F16", DType::F16, 2},         {"BF16", DType::BF16, 2},
    {"F64", DType::F64, 8},   {"I64", DType::I64, 8},         {"I32", DType::I32, 4},
    {"I16", DType::I16, 2},   {"I8", DType::I8, 1},           {"U8", DType::U8, 1},
    {"BOOL", DType::BOOL, 1}, {"F8_E4M3", DType::F8_E4M3, 1}, {"F8_E5M2", DType::F8_E5M2, 1},
};
}  // namespace

bool parse_dtype(const std::string& s, DType* out) {
  for (const auto& d : kTypes)
    if (s == d.name) {
      *out = d.t;
      return true;
    }
  return false;
}

const char* dtype_name(DType t) {
  for (const auto& d : kTypes)
    if (d.t == t) return d.name;
  return "?";
}

std::size_t dtype_size(DType t) {
  for (const auto& d : kTypes)
    if (d.t == t) return d.size;
  return 0;
}

void to_f32(DType t, const void* src, std::size_t n, float* dst) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (std::size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    default:
      throw Error(std::string("dtype ") + dtype_name(t) + " cannot be read as float here");
  }
}

}  // namespace coli
