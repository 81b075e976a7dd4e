// Element types of checkpoint tensors and their conversion to float.
// The scalar bf16 / f16 conversions are quant/half.h's (included here for
// the callers that convert element by element).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "quant/half.h"

namespace coli {

enum class DType { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2 };

// Parses a safetensors dtype string ("BF16", "F32", ...). Returns false if unknown.
bool parse_dtype(const std::string& s, DType* out);
const char* dtype_name(DType t);
std::size_t dtype_size(DType t);

// Converts n elements of a float-like dtype (F32, F16, BF16) to float.
// Throws coli::Error for other dtypes.
void to_f32(DType t, const void* src, std::size_t n, float* dst);

}  // namespace coli
