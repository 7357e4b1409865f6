// Hessian finalisation for LDLQ (docs/format.md, Hessian).
#pragma once

#include <cstdint>
#include <vector>

#include "exl3/quant/quantize.hpp"

namespace exl3::quant::detail {

struct FinalHessian {
  bool usable = false;       // false: mean diag below 1e-20, quantize without feedback
  std::vector<double> diag;  // damped diagonal in the original basis [padded_in] (out_scales auto)
  std::vector<float> h_rot;  // damped, sign-flipped, rotated H [padded_in^2] (proxy error)
  std::vector<float> l;      // strictly block-lower LDL factor of h_rot [padded_in^2]
  int retries = 0;
};

// Throws exl3::Error for a wrong shape or a non-finite element. `su0` are the input sign flips
// (+-1, [padded_in]); padding rows/columns of H are zero before damping. `factor` = false skips
// the LDL factorisation (no feedback wanted, only the proxy error).
FinalHessian finalize_hessian(const HessianView& h, int64_t in_features, int64_t padded_in,
                              const std::vector<float>& su0, double sigma_reg, bool factor);

}  // namespace exl3::quant::detail
