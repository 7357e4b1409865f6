// Elementwise activations with one formula for both engines: the CPU reference (cpu_ops) and the
// CUDA kernels (src/cuda/model_ops.cu) call these, so each computes the same expression in the
// same order (float math: expf / tanhf on either side).
#pragma once

#include <cmath>

#include "exl3/trellis/hd.hpp"

namespace exl3::cpu {

// SiLU: x * sigmoid(x).
EXL3_HD float silu(float x) {
  return x / (1.0f + expf(-x));
}

// GELU with the tanh approximation (Gemma's GeGLU).
EXL3_HD float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// The logistic function (gates: DeltaNet's write strength, attention and shared-expert gates).
EXL3_HD float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// torch.nn.functional.softplus with beta 1 and threshold 20 (DeltaNet's decay step).
EXL3_HD float softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

// Soft-capping: cap * tanh(x / cap).
EXL3_HD float softcap(float x, float cap) {
  return cap * tanhf(x / cap);
}

}  // namespace exl3::cpu
