// Safetensors dtype names and element sizes.
#include "exl3/format/dtype.hpp"

#include <array>

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

}  // namespace exl3
