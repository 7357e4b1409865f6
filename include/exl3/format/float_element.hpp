// One element of a float tensor's raw bytes, for code that walks a tensor element by element
// (conversions that pad, slice or re-lay weights). Bulk conversions use float_elements_to_f32.
#pragma once

#include <cstddef>

#include "exl3/format/dtype.hpp"

namespace exl3 {

// Element i of F16 / BF16 / F32 / F64 data at `data` (any alignment) as fp32; F64 is rounded.
float float_element(const std::byte* data, DType t, size_t i);

}  // namespace exl3
