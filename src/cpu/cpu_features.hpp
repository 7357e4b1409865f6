// Run-time x86 feature checks for the vectorised CPU paths. F16C goes through cpuid because
// clang 14's __builtin_cpu_supports does not know the "f16c" feature string.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace exl3::cpu {

inline bool cpu_has_f16c() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
#else
  return false;
#endif
}

// AVX2 + FMA (+ F16C when asked): what the vector decode and MAC paths are compiled for.
inline bool cpu_has_avx2_fma(bool need_f16c = false) {
#if defined(__x86_64__) || defined(__i386__)
  static const bool base = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return base && (!need_f16c || cpu_has_f16c());
#else
  (void)need_f16c;
  return false;
#endif
}

}  // namespace exl3::cpu
