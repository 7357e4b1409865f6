// Damp, rotate and factor H. The rotation uses the same sign flips su0 and block Hadamard as the
// weight's input side, so H lives in the basis LDLQ quantizes in (exllamav3 rotates H by su0 only;
// the per-row input scales are not folded into H, and neither are they here).
#include "quant/hessian.hpp"

#include <cmath>

#include <tbb/parallel_for.h>

#include "exl3/error.hpp"
#include "quant/linalg.hpp"
#include "quant/rotate.hpp"

namespace exl3::quant::detail {

namespace {

constexpr int kMaxRetries = 10;

double element(const HessianView& h, int64_t i, int64_t j) {
  return h.f64 != nullptr ? h.f64[i * h.cols + j] : static_cast<double>(h.f32[i * h.cols + j]);
}

}  // namespace

FinalHessian finalize_hessian(const HessianView& h, int64_t in_features, int64_t padded_in,
                              const std::vector<float>& su0, double sigma_reg, bool factor) {
  if ((h.f32 == nullptr) == (h.f64 == nullptr)) fail("Hessian: exactly one of f32/f64 must be set");
  if (h.rows != in_features || h.cols != in_features) {
    fail("Hessian shape [{}, {}] does not match the weight's in_features {} (expected [{}, {}])",
         h.rows, h.cols, in_features, in_features, in_features);
  }
  const int64_t n = padded_in;
  // Symmetrise from the lower triangle while padding; reject non-finite values by position.
  std::vector<double> a(static_cast<size_t>(n * n), 0.0);
  double diag_sum = 0.0;
  for (int64_t i = 0; i < in_features; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      const double v = element(h, i, j);
      if (!std::isfinite(v)) fail("Hessian element [{}, {}] is {} (must be finite)", i, j, v);
      a[i * n + j] = v;
      a[j * n + i] = v;
    }
    diag_sum += a[i * n + i];
  }
  FinalHessian out;
  const double diag_mean = diag_sum / static_cast<double>(in_features);
  if (!(diag_mean >= 1e-20)) return out;  // exllamav3 falls back to uncalibrated quantization
  out.usable = true;

  const double damp = sigma_reg * diag_mean;
  out.diag.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    a[i * n + i] += damp;
    out.diag[i] = a[i * n + i];
  }
  // H <- B . D . H . D . B with D = diag(su0).
  tbb::parallel_for(int64_t{0}, n, [&](int64_t i) {
    for (int64_t j = 0; j < n; ++j) a[i * n + j] *= static_cast<double>(su0[i]) * su0[j];
  });
  had_right(a.data(), n, n);
  had_left(a.data(), n, n);
  out.h_rot.assign(a.begin(), a.end());
  if (!factor) return out;

  // Factor the fp32-stored H (the matrix the proxy error uses); each retry adds another
  // 2 * sigma_reg * mean(diag) as exllamav3 does.
  const double retry_damp = 2.0 * sigma_reg * diag_mean;
  for (;;) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = out.h_rot[i];
    if (cholesky_lower(a.data(), n)) break;
    if (++out.retries > kMaxRetries) {
      fail("Hessian is not positive definite after {} damping retries (sigma_reg {})", kMaxRetries,
           sigma_reg);
    }
    for (int64_t i = 0; i < n; ++i) out.h_rot[i * n + i] += static_cast<float>(retry_damp);
  }
  out.l = block_ldl_from_cholesky(a.data(), n);
  return out;
}

}  // namespace exl3::quant::detail
