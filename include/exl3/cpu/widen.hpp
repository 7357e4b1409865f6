// Weights stored as fp16 / bf16 / fp32 widened to fp32 for the CPU reference matmuls, which
// widen a row per use rather than keep a second fp32 copy of every unquantized matrix. fp16 goes
// through F16C where the CPU has it (eight values per instruction): a decode step of a small
// fp16 model otherwise spends most of its time in the scalar conversion. Both give the exact
// fp32 value of every element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exl3/format/dtype.hpp"

namespace exl3::cpu {

// out[0..n) = the n elements of type t at src (F16, BF16 or F32; any alignment).
void widen_to_f32(const std::byte* src, DType t, int64_t n, float* out);

}  // namespace exl3::cpu
