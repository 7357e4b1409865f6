// The order of operations follows exllamav3's regularize(): output scales and signs, right
// Hadamard, input scales (measured after the right rotation), left Hadamard.
#include "quant/regularize.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include <tbb/parallel_for.h>

#include "exl3/trellis/codebook.hpp"
#include "quant/rotate.hpp"

namespace exl3::quant::detail {

namespace tr = exl3::trellis;

namespace {

// Scales below this count as zero channels (exllamav3's threshold).
constexpr double kZeroScale = 1e-30;
// Stand-in scale for an all-zero channel, so the division stays finite.
constexpr double kZeroChannelScale = 0.1;

}  // namespace

bool want_out_scales(OutScales mode, const std::vector<double>* h_diag) {
  if (mode != OutScales::kAuto) return mode == OutScales::kAlways;
  // Without a usable Hessian exllamav3 passes kAuto through as "not requested": no scales.
  if (h_diag == nullptr || h_diag->empty()) return false;
  // Skew: share of the largest 2% of sqrt(diag H) in the total.
  std::vector<double> d(h_diag->size());
  std::transform(h_diag->begin(), h_diag->end(), d.begin(),
                 [](double x) { return std::sqrt(std::max(x, 0.0)); });
  std::sort(d.begin(), d.end(), std::greater<>());
  const size_t cutoff = d.size() / 50;
  double top = 0.0, total = 0.0;
  for (size_t i = 0; i < d.size(); ++i) {
    total += d[i];
    if (i < cutoff) top += d[i];
  }
  return total > 0.0 && top / total < 0.15;
}

Regularized regularize(std::vector<float> w, int64_t rows, int64_t cols,
                       const std::vector<float>& su0, const std::vector<float>& sign_v,
                       bool out_scales) {
  Regularized r;
  r.out_scales_applied = out_scales;

  // Column RMS over all (padded) rows, normalised by its mean.
  std::vector<double> col_ss(static_cast<size_t>(cols), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = w.data() + i * cols;
    for (int64_t j = 0; j < cols; ++j) col_ss[j] += static_cast<double>(row[j]) * row[j];
  }
  std::vector<double> col_scale(static_cast<size_t>(cols));
  double mean = 0.0;
  for (int64_t j = 0; j < cols; ++j) {
    col_scale[j] = std::sqrt(col_ss[j] / static_cast<double>(rows));
    mean += col_scale[j];
  }
  mean /= static_cast<double>(cols);
  std::vector<bool> zero_col(static_cast<size_t>(cols));
  r.sv.resize(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    double s = mean > kZeroScale ? col_scale[j] / mean : col_scale[j];
    zero_col[j] = std::abs(s) < kZeroScale;
    if (zero_col[j]) s = kZeroChannelScale;
    r.sv[j] = out_scales ? static_cast<float>(sign_v[j] * s) : sign_v[j];
  }
  tbb::parallel_for(int64_t{0}, rows, [&](int64_t i) {
    float* row = w.data() + i * cols;
    for (int64_t j = 0; j < cols; ++j) row[j] /= r.sv[j];
  });
  for (int64_t j = 0; j < cols; ++j) {
    if (zero_col[j]) r.sv[j] = 0.0f;
  }

  had_right(w.data(), rows, cols);

  // Row RMS after the right rotation; su = su0 * rms / -codebook_scale.
  r.su.resize(static_cast<size_t>(rows));
  tbb::parallel_for(int64_t{0}, rows, [&](int64_t i) {
    float* row = w.data() + i * cols;
    double ss = 0.0;
    for (int64_t j = 0; j < cols; ++j) ss += static_cast<double>(row[j]) * row[j];
    double rms = std::sqrt(ss / static_cast<double>(cols));
    if (rms < kZeroScale) rms = kZeroChannelScale;
    r.su[i] = static_cast<float>(su0[i] * rms / -tr::kCodebookScale);
    const float inv = 1.0f / r.su[i];
    for (int64_t j = 0; j < cols; ++j) row[j] *= inv;
  });

  had_left(w.data(), rows, cols);
  r.w = std::move(w);
  return r;
}

}  // namespace exl3::quant::detail
