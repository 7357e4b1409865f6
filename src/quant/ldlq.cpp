// The feedback is accumulated eagerly: after block j is quantized, its error E_j is pushed into a
// running compensation F for every earlier row (F[r] += sum_{t in j} L[t, r] E[t]), which is the
// same sum exllamav3 builds from its span-wise prod_cache, in a different association order.
#include "quant/ldlq.hpp"

#include <algorithm>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include "exl3/quant/viterbi.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "quant/tiles.hpp"

namespace exl3::quant::detail {

namespace tr = exl3::trellis;

namespace {

// Encodes one 16-row block (given as a [16, cols] target) and writes its states and values.
void encode_block(const float* target, int64_t cols, int64_t block, int K, tr::Codebook cb, Device device,
                  uint16_t* states, float* q) {
  const int64_t tn = cols / 16;
  std::vector<float> seq(static_cast<size_t>(tn * tr::kTileSize)), dec(seq.size());
  for (int64_t j = 0; j < tn; ++j)
    gather_tile(target, cols, 0, j, 1.0f, seq.data() + j * tr::kTileSize);
  encode_tiles_on(device, seq.data(), tn, K, cb, states + block * tn * tr::kTileSize, dec.data());
  for (int64_t j = 0; j < tn; ++j) scatter_tile(dec.data() + j * tr::kTileSize, cols, block, j, q);
}

// acc[a, :] = sum_b h[a, b] x[b, :] for one row a, as contiguous axpys.
void h_times_row(const float* h, const float* x, int64_t rows, int64_t cols, int64_t a,
                 float* acc) {
  std::fill_n(acc, cols, 0.0f);
  for (int64_t b = 0; b < rows; ++b) {
    const float coef = h[a * rows + b];
    if (coef == 0.0f) continue;
    const float* xb = x + b * cols;
    for (int64_t c = 0; c < cols; ++c) acc[c] += coef * xb[c];
  }
}

// tr(X^T H X) = sum_a x_a . (H X)_a, accumulated in fp64 per row.
double quadratic_trace(const float* x, const float* h, int64_t rows, int64_t cols) {
  return tbb::parallel_reduce(
      tbb::blocked_range<int64_t>(0, rows), 0.0,
      [&](const tbb::blocked_range<int64_t>& range, double sum) {
        std::vector<float> acc(static_cast<size_t>(cols));
        for (int64_t a = range.begin(); a < range.end(); ++a) {
          h_times_row(h, x, rows, cols, a, acc.data());
          double s = 0.0;
          for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(x[a * cols + c]) * acc[c];
          sum += s;
        }
        return sum;
      },
      [](double a, double b) { return a + b; });
}

}  // namespace

void quantize_blocks(const float* w_r, int64_t rows, int64_t cols, const float* l, int K,
                     tr::Codebook cb, Device device, uint16_t* states, float* q) {
  const int64_t blocks = rows / 16;
  if (l == nullptr) {
    // No feedback: all tiles are independent, so encode them as one parallel batch.
    const int64_t tn = cols / 16;
    std::vector<float> seq(static_cast<size_t>(blocks * tn * tr::kTileSize)), dec(seq.size());
    for (int64_t i = 0; i < blocks; ++i) {
      for (int64_t j = 0; j < tn; ++j)
        gather_tile(w_r, cols, i, j, 1.0f, seq.data() + (i * tn + j) * tr::kTileSize);
    }
    encode_tiles_on(device, seq.data(), blocks * tn, K, cb, states, dec.data());
    for (int64_t i = 0; i < blocks; ++i) {
      for (int64_t j = 0; j < tn; ++j)
        scatter_tile(dec.data() + (i * tn + j) * tr::kTileSize, cols, i, j, q);
    }
    return;
  }
  std::vector<float> comp(static_cast<size_t>(rows * cols), 0.0f);  // running feedback F
  std::vector<float> target(static_cast<size_t>(16 * cols)), err(target.size());
  for (int64_t b = blocks - 1; b >= 0; --b) {
    const int64_t r0 = 16 * b;
    for (int64_t i = 0; i < 16 * cols; ++i) target[i] = w_r[r0 * cols + i] + comp[r0 * cols + i];
    encode_block(target.data(), cols, b, K, cb, device, states, q);
    if (b == 0) break;
    for (int64_t i = 0; i < 16 * cols; ++i) err[i] = w_r[r0 * cols + i] - q[r0 * cols + i];
    // Push E_b into every earlier row r: F[r] += sum_t L[r0 + t, r] E_b[t].
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, r0),
                      [&](const tbb::blocked_range<int64_t>& range) {
                        for (int64_t r = range.begin(); r < range.end(); ++r) {
                          float* f = comp.data() + r * cols;
                          for (int t = 0; t < 16; ++t) {
                            const float coef = l[(r0 + t) * rows + r];
                            const float* e = err.data() + t * cols;
                            for (int64_t c = 0; c < cols; ++c) f[c] += coef * e[c];
                          }
                        }
                      });
  }
}

double proxy_error(const float* w, const float* q, const float* h, int64_t rows, int64_t cols) {
  std::vector<float> e(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < e.size(); ++i) e[i] = w[i] - q[i];
  const double num = quadratic_trace(e.data(), h, rows, cols);
  const double den = quadratic_trace(w, h, rows, cols);
  return num / std::max(den, 1e-30);
}

}  // namespace exl3::quant::detail
