// Runtime bit width / codebook -> compile-time constant, for host code that launches kernels
// instantiated per K (src/cuda/mma_gemm_k.cu.in) or per codebook (src/cuda/moe_gemv_cb.cu.in).
#pragma once

#include <type_traits>
#include <utility>

#include "exl3/trellis/codebook.hpp"

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

// Calls f(std::integral_constant<Codebook, CB>{}) for the codebook `cb` and returns its result.
// Like the kernels' former per-site switches, a value outside the enum decodes as 3INST.
template <typename F>
decltype(auto) with_codebook(Codebook cb, F&& f) {
  switch (cb) {
    case Codebook::kMcg:
      return std::forward<F>(f)(std::integral_constant<Codebook, Codebook::kMcg>{});
    case Codebook::kMul1:
      return std::forward<F>(f)(std::integral_constant<Codebook, Codebook::kMul1>{});
    default:
      return std::forward<F>(f)(std::integral_constant<Codebook, Codebook::k3Inst>{});
  }
}

}  // namespace exl3::trellis
