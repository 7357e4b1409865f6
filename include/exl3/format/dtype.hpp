// Safetensors element types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace exl3 {

enum class DType : uint8_t { kBool, kU8, kI8, kI16, kI32, kI64, kF16, kBF16, kF32, kF64, kF8E4M3, kF8E5M2 };

// Size of one element in bytes.
size_t dtype_size(DType t);
// The safetensors spelling ("F16", "BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; nullopt when unknown.
std::optional<DType> parse_dtype(std::string_view s);

// F32, F16 or BF16 (the types weight matrices come in).
bool is_float_matrix_dtype(DType t);
// out[n] = fp32 of n elements of F32 / F16 / BF16 at `src` (any alignment; exact).
void float_elements_to_f32(const std::byte* src, DType t, int64_t n, float* out);

}  // namespace exl3
