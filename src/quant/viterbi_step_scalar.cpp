// Portable Viterbi step (any x86-64 or other CPU). Loops are ordered so the compiler can vectorise
// the innermost one: for a fixed k, the states k*E + e are contiguous in e, and the 2^K edges
// e = j*R + r share one in-edge k*J + j.
#include <array>
#include <limits>

#include "quant/viterbi_step.hpp"

namespace exl3::quant::detail {

namespace {

template <int K>
void scalar_step(const float* lut, const float* prev, float w, float* cur, uint8_t* bp) {
  constexpr int E = 1 << (16 - K);  // edges
  constexpr int R = 1 << K;         // candidate states per edge
  constexpr int J = E / R;          // in-edges per k
  std::array<uint8_t, E> best_k{};
  for (int e = 0; e < E; ++e) cur[e] = std::numeric_limits<float>::infinity();
  for (int k = 0; k < R; ++k) {
    const float* l = lut + k * E;
    const float* pv = prev + k * J;
    for (int j = 0; j < J; ++j) {
      const float pc = pv[j];
      for (int r = 0; r < R; ++r) {
        const int e = j * R + r;
        const float d = l[e] - w;
        const float c = pc + d * d;
        const bool lt = c < cur[e];
        cur[e] = lt ? c : cur[e];
        best_k[e] = lt ? static_cast<uint8_t>(k) : best_k[e];
      }
    }
  }
  if (bp == nullptr) return;
  for (int b = 0; b < K; ++b) {
    uint8_t* plane = bp + b * (E / 8);
    for (int e0 = 0; e0 < E; e0 += 8) {
      uint32_t byte = 0;
      for (int i = 0; i < 8; ++i) byte |= ((best_k[e0 + i] >> b) & 1u) << i;
      plane[e0 / 8] = static_cast<uint8_t>(byte);
    }
  }
}

}  // namespace

StepFn step_scalar(int K) {
  static constexpr StepFn table[8] = {scalar_step<1>, scalar_step<2>, scalar_step<3>,
                                      scalar_step<4>, scalar_step<5>, scalar_step<6>,
                                      scalar_step<7>, scalar_step<8>};
  return table[K - 1];
}

}  // namespace exl3::quant::detail
