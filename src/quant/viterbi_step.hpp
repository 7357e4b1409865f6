// One Viterbi step over all 2^(16-K) trellis edges (internal to the tile encoder).
//
// For every out-edge e (the low 16-K bits of a state), the candidate states are
// s = (k << (16-K)) | e for k = 0..2^K-1, whose in-edge is s >> K. The step computes
//   cur[e] = min_k prev[s >> K] + (lut[s] - w)^2
// with strict '<' and k ascending, so the smallest k wins a tie, and records the winning k.
//
// Back-pointers are stored as K bit planes of 2^(16-K) bits: byte (b * E/8 + e/8), bit e%8 holds
// bit b of k for edge e. That is exactly K bits per edge (1 MiB per tile at K = 1 and 2), which
// keeps a whole tile's history in L2 instead of streaming 8 MiB per tile through memory.
#pragma once

#include <cstdint>

namespace exl3::quant::detail {

// bp may be null (the first pass only needs history for half of the tile).
using StepFn = void (*)(const float* lut, const float* prev, float w, float* cur, uint8_t* bp);

inline constexpr int edge_count(int K) {
  return 1 << (16 - K);
}
inline constexpr int64_t plane_bytes(int K) {
  return static_cast<int64_t>(K) * (edge_count(K) / 8);
}

// Winning k of edge e from one position's back-pointer planes.
inline uint32_t read_backpointer(const uint8_t* planes, int K, uint32_t e) {
  const int stride = edge_count(K) / 8;
  uint32_t k = 0;
  for (int b = 0; b < K; ++b) k |= ((planes[b * stride + (e >> 3)] >> (e & 7)) & 1u) << b;
  return k;
}

StepFn step_scalar(int K);
// Null when the build or the CPU has no AVX2+FMA.
StepFn step_avx2(int K);
bool cpu_has_avx2();

}  // namespace exl3::quant::detail
