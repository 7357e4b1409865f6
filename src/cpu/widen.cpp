// widen_to_f32 (exl3/cpu/widen.hpp): F16C for fp16 when the CPU has it (the library is built for
// baseline x86-64, so the vector function carries its own target and is chosen at run time).
#include "exl3/cpu/widen.hpp"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu/cpu_features.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3::cpu {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const std::byte* src, int64_t n,
                                                         float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    out[i] = trellis::half_to_float(b);
  }
}
#endif

}  // namespace

void widen_to_f32(const std::byte* src, DType t, int64_t n, float* out) {
#if defined(__x86_64__)
  static const bool f16c = cpu_has_f16c();
  if (t == DType::kF16 && f16c) {
    f16_to_f32_f16c(src, n, out);
    return;
  }
#endif
  float_elements_to_f32(src, t, n, out);
}

}  // namespace exl3::cpu
