// Weight regularisation (docs/format.md, Regularisation), up to but excluding the global scale.
#pragma once

#include <cstdint>
#include <vector>

#include "exl3/quant/quantize.hpp"

namespace exl3::quant::detail {

struct Regularized {
  std::vector<float> w;   // W_r = B_k diag(1/su) W diag(1/sv) B_n, [rows, cols]
  std::vector<float> su;  // [rows], includes su0, the input RMS scales and -1/codebook_scale
  std::vector<float> sv;  // [cols], includes the output signs and scales; 0 for all-zero columns
  bool out_scales_applied = false;
};

// Whether output scales apply: kAuto uses the skew of sqrt(diag H) (null diag = no usable
// Hessian, which means no output scales).
bool want_out_scales(OutScales mode, const std::vector<double>* h_diag);

// w: the padded weight [rows, cols] (both multiples of 128), taken by value and transformed in
// place. su0 and sign_v are +-1.
Regularized regularize(std::vector<float> w, int64_t rows, int64_t cols,
                       const std::vector<float>& su0, const std::vector<float>& sign_v,
                       bool out_scales);

}  // namespace exl3::quant::detail
