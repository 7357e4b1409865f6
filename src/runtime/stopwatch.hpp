// Wall-clock helpers of the runtime's generation loops and benchmarks (internal).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace exl3::runtime {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The median of non-empty `v` (the mean of the middle two for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace exl3::runtime
