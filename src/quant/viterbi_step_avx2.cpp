// AVX2+FMA Viterbi step. Compiled with a function-level target attribute (the rest of the library
// stays baseline x86-64) and chosen at run time by __builtin_cpu_supports.
//
// Each iteration of the outer loop owns 32 consecutive out-edges in four independent 8-lane
// accumulators (so the min dependency chain over k does not serialise), and runs k over all 2^K
// candidates: one contiguous 8-float load of the codebook LUT per accumulator and k, plus the
// in-edge costs, loaded once per group of states that share an in-edge (see load_in_costs).
#include "quant/viterbi_step.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace exl3::quant::detail {

bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

#if defined(__x86_64__)

namespace {

// In-edge costs prev[s >> K] of the 32 states s0..s0+31 (s0 a multiple of 32), as four vectors
// of 8 lanes. States that share an in-edge share one load: 32 states span 2^(5-K) in-edges, so for
// K >= 5 one broadcast serves all four vectors, and for K = 1, 2 one wide load and lane permutes
// replace 16 or 8 separate broadcasts.
template <int K>
__attribute__((target("avx2,fma"))) inline void load_in_costs(const float* prev, int s0,
                                                              __m256 (&ic)[4]) {
  const float* p = prev + (s0 >> K);
  if constexpr (K == 1) {
    const __m256 lo = _mm256_loadu_ps(p);      // in-edges of states s0..s0+15
    const __m256 hi = _mm256_loadu_ps(p + 8);  // s0+16..s0+31
    const __m256i first = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256i second = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    ic[0] = _mm256_permutevar8x32_ps(lo, first);
    ic[1] = _mm256_permutevar8x32_ps(lo, second);
    ic[2] = _mm256_permutevar8x32_ps(hi, first);
    ic[3] = _mm256_permutevar8x32_ps(hi, second);
  } else if constexpr (K == 2) {
    const __m256 v = _mm256_loadu_ps(p);  // in-edges of all 32 states, 4 states each
    ic[0] = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    ic[1] = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3));
    ic[2] = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5));
    ic[3] = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7));
  } else if constexpr (K == 3) {
    for (int i = 0; i < 4; ++i) ic[i] = _mm256_broadcast_ss(p + i);
  } else if constexpr (K == 4) {
    ic[0] = ic[1] = _mm256_broadcast_ss(p);
    ic[2] = ic[3] = _mm256_broadcast_ss(p + 1);
  } else {
    ic[0] = ic[1] = ic[2] = ic[3] = _mm256_broadcast_ss(p);
  }
}

// Writes the K bit planes of 8 winning k values (lanes = edges e0..e0+7).
template <int K>
__attribute__((target("avx2,fma"))) inline void store_planes(__m256 best_k, uint8_t* bp, int e0) {
  constexpr int stride = (1 << (16 - K)) / 8;
  const __m256i k = _mm256_cvttps_epi32(best_k);
  for (int b = 0; b < K; ++b) {
    // Move bit b to the sign bit of each lane, then gather the 8 sign bits.
    const __m256i shifted = _mm256_sll_epi32(k, _mm_cvtsi32_si128(31 - b));
    bp[b * stride + (e0 >> 3)] =
        static_cast<uint8_t>(_mm256_movemask_ps(_mm256_castsi256_ps(shifted)));
  }
}

// One 8-edge accumulator: candidate cost, strict-less mask, keep the min and its k. Because k only
// grows, "take k where the candidate won" is max(best_k, lt & k): no blend needed.
__attribute__((target("avx2,fma"))) inline void relax(const float* lut, __m256 w, __m256 in_cost,
                                                      __m256 k, __m256& cost, __m256& best_k) {
  const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(lut), w);
  const __m256 cand = _mm256_fmadd_ps(d, d, in_cost);
  const __m256 lt = _mm256_cmp_ps(cand, cost, _CMP_LT_OQ);
  cost = _mm256_min_ps(cand, cost);  // = lt ? cand : cost
  best_k = _mm256_max_ps(best_k, _mm256_and_ps(lt, k));
}

template <int K>
__attribute__((target("avx2,fma"))) void avx2_step(const float* lut, const float* prev, float w,
                                                   float* cur, uint8_t* bp) {
  constexpr int E = 1 << (16 - K);
  constexpr int R = 1 << K;
  const __m256 wv = _mm256_set1_ps(w);
  const __m256 inf = _mm256_set1_ps(__builtin_inff());
  for (int e0 = 0; e0 < E; e0 += 32) {
    __m256 c0 = inf, c1 = inf, c2 = inf, c3 = inf;
    __m256 k0 = _mm256_setzero_ps(), k1 = k0, k2 = k0, k3 = k0;
    __m256 kv = k0;
    for (int k = 0; k < R; ++k) {
      const int s0 = k * E + e0;
      __m256 ic[4];
      load_in_costs<K>(prev, s0, ic);
      relax(lut + s0, wv, ic[0], kv, c0, k0);
      relax(lut + s0 + 8, wv, ic[1], kv, c1, k1);
      relax(lut + s0 + 16, wv, ic[2], kv, c2, k2);
      relax(lut + s0 + 24, wv, ic[3], kv, c3, k3);
      kv = _mm256_add_ps(kv, _mm256_set1_ps(1.0f));
    }
    _mm256_storeu_ps(cur + e0, c0);
    _mm256_storeu_ps(cur + e0 + 8, c1);
    _mm256_storeu_ps(cur + e0 + 16, c2);
    _mm256_storeu_ps(cur + e0 + 24, c3);
    if (bp != nullptr) {
      store_planes<K>(k0, bp, e0);
      store_planes<K>(k1, bp, e0 + 8);
      store_planes<K>(k2, bp, e0 + 16);
      store_planes<K>(k3, bp, e0 + 24);
    }
  }
}

}  // namespace

StepFn step_avx2(int K) {
  if (!cpu_has_avx2()) return nullptr;
  static constexpr StepFn table[8] = {avx2_step<1>, avx2_step<2>, avx2_step<3>, avx2_step<4>,
                                      avx2_step<5>, avx2_step<6>, avx2_step<7>, avx2_step<8>};
  return table[K - 1];
}

#else

StepFn step_avx2(int) {
  return nullptr;
}

#endif

}  // namespace exl3::quant::detail
