// Runtime bit width -> compile-time bit width, for host code that launches per-K kernels.
#pragma once

#include <type_traits>
#include <utility>

namespace exl3::trellis {

// Calls f(std::integral_constant<int, K>{}) for K in 1..8 and returns its result; returns
// `invalid` for any other K. One switch for every per-K dispatcher (kernels are instantiated
// per K so their bit offsets are compile-time constants).
template <typename R, typename F>
R with_bits(int K, R invalid, F&& f) {
  switch (K) {
    case 1:
      return std::forward<F>(f)(std::integral_constant<int, 1>{});
    case 2:
      return std::forward<F>(f)(std::integral_constant<int, 2>{});
    case 3:
      return std::forward<F>(f)(std::integral_constant<int, 3>{});
    case 4:
      return std::forward<F>(f)(std::integral_constant<int, 4>{});
    case 5:
      return std::forward<F>(f)(std::integral_constant<int, 5>{});
    case 6:
      return std::forward<F>(f)(std::integral_constant<int, 6>{});
    case 7:
      return std::forward<F>(f)(std::integral_constant<int, 7>{});
    case 8:
      return std::forward<F>(f)(std::integral_constant<int, 8>{});
    default:
      return invalid;
  }
}

}  // namespace exl3::trellis
