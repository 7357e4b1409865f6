// Safetensors dtype names and element sizes.
#include "exl3/format/dtype.hpp"
#include "exl3/format/float_element.hpp"

#include <array>
#include <cstring>

#include "exl3/trellis/half.hpp"

namespace exl3 {
namespace {

struct DTypeRow {
  DType type;
  std::string_view name;
  size_t size;
};

// Order matches the enum, so a row is found by index.
constexpr std::array<DTypeRow, 12> kDTypes{{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},
    {DType::kI32, "I32", 4},
    {DType::kI64, "I64", 8},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
}};

const DTypeRow& row(DType t) {
  const auto i = static_cast<size_t>(t);
  // An out-of-range enum value can only come from a cast bug; map it to the first row rather
  // than reading past the table.
  return i < kDTypes.size() ? kDTypes[i] : kDTypes[0];
}

}  // namespace

size_t dtype_size(DType t) {
  return row(t).size;
}

std::string_view dtype_name(DType t) {
  return row(t).name;
}

std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& r : kDTypes) {
    if (r.name == s) return r.type;
  }
  return std::nullopt;
}

bool is_float_matrix_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

void float_elements_to_f32(const std::byte* src, DType t, int64_t n, float* out) {
  if (t == DType::kF32) {
    if (n > 0) std::memcpy(out, src, static_cast<size_t>(n) * 4);  // n == 0 may come with null
    return;
  }
  // One loop per type, so the bf16 one (a shift) vectorizes.
  if (t == DType::kF16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      out[i] = trellis::half_to_float(b);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    out[i] = trellis::bf16_to_float(b);
  }
}

float float_element(const std::byte* data, DType t, size_t i) {
  switch (t) {
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return trellis::half_to_float(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return trellis::bf16_to_float(h);
    }
    case DType::kF32: {
      float f;
      std::memcpy(&f, data + 4 * i, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, data + 8 * i, 8);
      return static_cast<float>(d);
    }
  }
}

}  // namespace exl3
