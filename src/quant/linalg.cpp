// Blocked right-looking Cholesky. Each 64-column panel is factored, then the trailing matrix is
// updated row by row in parallel; the panel is kept transposed so the update is a run of
// contiguous axpys, which the compiler vectorises without reassociating any sum.
#include "quant/linalg.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include <tbb/parallel_for.h>

namespace exl3::quant::detail {

namespace {

constexpr int64_t kPanel = 64;
constexpr int kBlock = 16;

}  // namespace

bool cholesky_lower(double* a, int64_t n) {
  std::vector<double> panel_t;  // panel_t[t * n + j] = a[j][kb + t]
  for (int64_t kb = 0; kb < n; kb += kPanel) {
    const int64_t m = std::min(kPanel, n - kb);
    // Diagonal block.
    for (int64_t j = kb; j < kb + m; ++j) {
      double d = a[j * n + j];
      for (int64_t t = kb; t < j; ++t) d -= a[j * n + t] * a[j * n + t];
      if (!(d > 0.0) || !std::isfinite(d)) return false;
      const double pivot = std::sqrt(d);
      a[j * n + j] = pivot;
      for (int64_t i = j + 1; i < kb + m; ++i) {
        double s = a[i * n + j];
        for (int64_t t = kb; t < j; ++t) s -= a[i * n + t] * a[j * n + t];
        a[i * n + j] = s / pivot;
      }
    }
    const int64_t rest = kb + m;
    if (rest == n) break;
    // Panel below the diagonal block: row i solves x . D^T = a[i, kb:kb+m].
    tbb::parallel_for(rest, n, [&](int64_t i) {
      double* row = a + i * n;
      for (int64_t j = kb; j < kb + m; ++j) {
        double s = row[j];
        for (int64_t t = kb; t < j; ++t) s -= row[t] * a[j * n + t];
        row[j] = s / a[j * n + j];
      }
    });
    // Trailing update of the lower triangle: a[i][j] -= sum_t a[i][t] a[j][t].
    panel_t.assign(static_cast<size_t>(m * n), 0.0);
    for (int64_t j = rest; j < n; ++j) {
      for (int64_t t = 0; t < m; ++t) panel_t[t * n + j] = a[j * n + kb + t];
    }
    tbb::parallel_for(rest, n, [&](int64_t i) {
      double* row = a + i * n;
      for (int64_t t = 0; t < m; ++t) {
        const double coef = row[kb + t];
        const double* p = panel_t.data() + t * n;
        for (int64_t j = rest; j <= i; ++j) row[j] -= coef * p[j];
      }
    });
  }
  for (int64_t i = 0; i < n; ++i) std::fill(a + i * n + i + 1, a + (i + 1) * n, 0.0);
  return true;
}

std::vector<float> block_ldl_from_cholesky(const double* c, int64_t n) {
  std::vector<float> l(static_cast<size_t>(n * n), 0.0f);
  const int64_t blocks = n / kBlock;
  tbb::parallel_for(int64_t{0}, blocks, [&](int64_t b) {
    const int64_t c0 = b * kBlock;
    // Inverse of the lower-triangular diagonal block, by forward substitution per unit vector.
    std::array<double, kBlock * kBlock> inv{};
    for (int col = 0; col < kBlock; ++col) {
      for (int r = col; r < kBlock; ++r) {
        double s = (r == col) ? 1.0 : 0.0;
        for (int t = col; t < r; ++t) s -= c[(c0 + r) * n + c0 + t] * inv[t * kBlock + col];
        inv[r * kBlock + col] = s / c[(c0 + r) * n + c0 + r];
      }
    }
    // Rows below the block: L[i, c0 + col] = sum_{t >= col} C[i, c0 + t] inv[t][col].
    for (int64_t i = c0 + kBlock; i < n; ++i) {
      const double* ci = c + i * n + c0;
      for (int col = 0; col < kBlock; ++col) {
        double s = 0.0;
        for (int t = col; t < kBlock; ++t) s += ci[t] * inv[t * kBlock + col];
        l[i * n + c0 + col] = static_cast<float>(s);
      }
    }
  });
  return l;
}

}  // namespace exl3::quant::detail
