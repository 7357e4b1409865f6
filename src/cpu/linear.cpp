// CPU reference EXL3 linear: reconstruction (rotated and original basis) and the forward pass.
#include "exl3/cpu/linear.hpp"

#include "cpu/cpu_features.hpp"
#include "cpu/tile_decode.hpp"

#include <algorithm>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/trellis/hadamard.hpp"
#include "exl3/trellis/half.hpp"
#include "exl3/trellis/tile.hpp"

namespace exl3::cpu {

namespace tr = exl3::trellis;

LinearView LinearView::of(const Exl3LinearData& data) {
  const auto& info = data.info();
  LinearView v;
  v.trellis = data.trellis();
  v.in_features = info.in_features;
  v.out_features = info.out_features;
  v.bits = info.bits;
  v.codebook = info.codebook;
  v.suh = data.suh();
  v.svh = data.svh();
  v.bias = data.bias();
  return v;
}

void LinearView::validate() const {
  if (!tr::valid_bits(bits)) fail("EXL3 linear: bits {} outside 1..8", bits);
  if (in_features <= 0 || out_features <= 0 || in_features % tr::kHadDim != 0 ||
      out_features % tr::kHadDim != 0) {
    fail("EXL3 linear: in/out features {}x{} must be positive multiples of 128", in_features,
         out_features);
  }
  const auto expect = static_cast<size_t>(in_features / 16 * (out_features / 16) * 16 * bits);
  if (trellis.size() != expect) fail("EXL3 linear: trellis has {} words, expected {}", trellis.size(), expect);
  if (suh.size() != static_cast<size_t>(in_features)) fail("EXL3 linear: suh length {} != in_features {}", suh.size(), in_features);
  if (svh.size() != static_cast<size_t>(out_features)) fail("EXL3 linear: svh length {} != out_features {}", svh.size(), out_features);
  if (!bias.empty() && bias.size() != static_cast<size_t>(out_features)) {
    fail("EXL3 linear: bias length {} != out_features {}", bias.size(), out_features);
  }
}

namespace {

int64_t tiles_k(const LinearView& w) { return w.in_features / tr::kTileDim; }
int64_t tiles_n(const LinearView& w) { return w.out_features / tr::kTileDim; }

const uint16_t* tile_at(const LinearView& w, int64_t i, int64_t j) {
  return tr::tile_ptr(w.trellis.data(), w.bits, tiles_n(w), i, j);
}

// Walsh-Hadamard along the row index of a [128, cols] block (row stride `stride`), in place.
// Rows are combined pairwise across the whole width, so every pass is contiguous.
void had128_rows(double* block, int64_t cols, int64_t stride) {
  for (int h = 1; h < tr::kHadDim; h <<= 1) {
    for (int i = 0; i < tr::kHadDim; i += 2 * h) {
      for (int r = i; r < i + h; ++r) {
        double* a = block + r * stride;
        double* b = block + (r + h) * stride;
        for (int64_t c = 0; c < cols; ++c) {
          const double x = a[c], y = b[c];
          a[c] = x + y;
          b[c] = x - y;
        }
      }
    }
  }
}

float load_act(const void* x, ActDType act, int64_t idx) {
  switch (act) {
    case ActDType::kF16:
      return tr::half_to_float(static_cast<const uint16_t*>(x)[idx]);
    case ActDType::kBF16:
      return tr::bf16_to_float(static_cast<const uint16_t*>(x)[idx]);
    default:
      return static_cast<const float*>(x)[idx];
  }
}

// The forward pass works on tiles in sequence (tensor-core) order, so no per-tile un-permutation
// is needed. Position p = 8t + e of a tile sits at row 2(t%4) + [0,1,8,9][e%4] and column
// t/4 + (e >= 4 ? 8 : 0). So lane-group t multiplies one of four 8-float "row quads" of x
// (xq[a][e] = x[2a + [0,1,8,9][e%4]]) and accumulates into one of eight 8-float column groups,
// whose halves sum to columns c0 and c0 + 8 at the end.
constexpr int kRowQuads = 4 * 8;   // floats of x per (row, tile row i)
constexpr int kColGroups = 8 * 8;  // accumulator floats per (row, tile column j)

void make_row_quads(const float* x_rot, int64_t in, float* xq) {
  for (int64_t i = 0; i < in / tr::kTileDim; ++i) {
    for (int a = 0; a < 4; ++a) {
      for (int e = 0; e < 8; ++e) {
        xq[i * kRowQuads + a * 8 + e] = x_rot[16 * i + 2 * a + (e & 1) + ((e & 2) << 2)];
      }
    }
  }
}

// acc[m][64] += per-row products of one tile (values in sequence order).
inline void tile_mac(const float* vals, const float* xq, int64_t xq_stride, int64_t m, float* acc) {
  for (int64_t row = 0; row < m; ++row) {
    const float* xr = xq + row * xq_stride;
    float* a = acc + row * kColGroups;
    for (int t = 0; t < 32; ++t) {
      const float* xv = xr + (t & 3) * 8;
      const float* v = vals + 8 * t;
      float* at = a + (t >> 2) * 8;
      for (int e = 0; e < 8; ++e) at[e] += xv[e] * v[e];
    }
  }
}

#if defined(__x86_64__)
// Same arithmetic with the 8 column-group accumulators and 4 row quads held in registers.
__attribute__((target("avx2,fma"))) void tile_mac_avx2(const float* vals, const float* xq, int64_t xq_stride,
                                                       int64_t m, float* acc) {
  for (int64_t row = 0; row < m; ++row) {
    const float* xr = xq + row * xq_stride;
    float* a = acc + row * kColGroups;
    __m256 x[4], s[8];
    for (int q = 0; q < 4; ++q) x[q] = _mm256_loadu_ps(xr + 8 * q);
    for (int g = 0; g < 8; ++g) s[g] = _mm256_loadu_ps(a + 8 * g);
    for (int t = 0; t < 32; ++t) s[t >> 2] = _mm256_fmadd_ps(x[t & 3], _mm256_loadu_ps(vals + 8 * t), s[t >> 2]);
    for (int g = 0; g < 8; ++g) _mm256_storeu_ps(a + 8 * g, s[g]);
  }
}
#endif

void tile_mac_dispatch(const float* vals, const float* xq, int64_t xq_stride, int64_t m, float* acc) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_has_avx2_fma();
  if (avx2) {
    tile_mac_avx2(vals, xq, xq_stride, m, acc);
    return;
  }
#endif
  tile_mac(vals, xq, xq_stride, m, acc);
}

}  // namespace

std::vector<uint16_t> reconstruct_w_hat(const LinearView& w) {
  w.validate();
  const int64_t tn = tiles_n(w);
  std::vector<uint16_t> out(static_cast<size_t>(w.in_features * w.out_features));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, tiles_k(w)), [&](const tbb::blocked_range<int64_t>& rows) {
    uint16_t tile[tr::kTileSize];
    for (int64_t i = rows.begin(); i < rows.end(); ++i) {
      for (int64_t j = 0; j < tn; ++j) {
        tr::decode_tile_bits(tile_at(w, i, j), w.bits, w.codebook, tile);
        for (int r = 0; r < tr::kTileDim; ++r) {
          std::copy_n(tile + r * tr::kTileDim, tr::kTileDim,
                      out.begin() + (16 * i + r) * w.out_features + 16 * j);
        }
      }
    }
  });
  return out;
}

std::vector<float> reconstruct_weight(const LinearView& w) {
  const std::vector<uint16_t> w_hat = reconstruct_w_hat(w);
  const int64_t n = w.out_features;
  std::vector<float> out(w_hat.size());
  // One 128-row block at a time: B_k along rows, suh, B_n along each row, svh, all in fp64.
  tbb::parallel_for(int64_t{0}, w.in_features / tr::kHadDim, [&](int64_t blk) {
    std::vector<double> block(static_cast<size_t>(tr::kHadDim * n));
    const int64_t r0 = blk * tr::kHadDim;
    for (int64_t r = 0; r < tr::kHadDim; ++r) {
      for (int64_t c = 0; c < n; ++c) block[r * n + c] = tr::half_to_float(w_hat[(r0 + r) * n + c]);
    }
    had128_rows(block.data(), n, n);
    for (int64_t r = 0; r < tr::kHadDim; ++r) {
      double* row = block.data() + r * n;
      const double su = tr::half_to_float(w.suh[r0 + r]) * tr::kHadScaleD;
      for (int64_t c = 0; c < n; ++c) row[c] *= su;
      for (int64_t c0 = 0; c0 < n; c0 += tr::kHadDim) tr::had128_inplace(row + c0);
      for (int64_t c = 0; c < n; ++c) {
        out[(r0 + r) * n + c] = static_cast<float>(row[c] * tr::half_to_float(w.svh[c]));
      }
    }
  });
  return out;
}

void linear_forward(const LinearView& w, const void* x, ActDType act, int64_t m, float* y) {
  w.validate();
  if (m < 0) fail("linear_forward: negative row count {}", m);
  if (m == 0) return;
  const int64_t in = w.in_features, out = w.out_features;

  // Input rotation: x' = had128(x * suh), fp32.
  std::vector<float> xr(static_cast<size_t>(m * in));
  tbb::parallel_for(int64_t{0}, m, [&](int64_t row) {
    float* dst = xr.data() + row * in;
    for (int64_t k = 0; k < in; ++k) dst[k] = load_act(x, act, row * in + k) * tr::half_to_float(w.suh[k]);
    for (int64_t k0 = 0; k0 < in; k0 += tr::kHadDim) tr::had128_inplace(dst + k0);
  });

  // Row quads of x' for every (row, tile row), the layout tile_mac consumes.
  const int64_t xq_stride = tiles_k(w) * kRowQuads;
  std::vector<float> xq(static_cast<size_t>(m * xq_stride));
  tbb::parallel_for(int64_t{0}, m, [&](int64_t row) { make_row_quads(xr.data() + row * in, in, xq.data() + row * xq_stride); });

  // y' = x' @ W_hat, one output-tile column per task, each tile decoded once for all rows.
  std::vector<float> yr(static_cast<size_t>(m * out));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, tiles_n(w)), [&](const tbb::blocked_range<int64_t>& cols) {
    std::vector<float> acc(static_cast<size_t>(m * kColGroups));
    alignas(32) float vals[tr::kTileSize];
    for (int64_t j = cols.begin(); j < cols.end(); ++j) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t i = 0; i < tiles_k(w); ++i) {
        decode_tile_seq(tile_at(w, i, j), w.bits, w.codebook, vals);
        tile_mac_dispatch(vals, xq.data() + i * kRowQuads, xq_stride, m, acc.data());
      }
      for (int64_t row = 0; row < m; ++row) {
        const float* a = acc.data() + row * kColGroups;
        float* dst = yr.data() + row * out + 16 * j;
        for (int c0 = 0; c0 < 8; ++c0) {
          dst[c0] = (a[c0 * 8 + 0] + a[c0 * 8 + 1]) + (a[c0 * 8 + 2] + a[c0 * 8 + 3]);
          dst[c0 + 8] = (a[c0 * 8 + 4] + a[c0 * 8 + 5]) + (a[c0 * 8 + 6] + a[c0 * 8 + 7]);
        }
      }
    }
  });

  // Output rotation: y = had128(y') * svh + bias.
  tbb::parallel_for(int64_t{0}, m, [&](int64_t row) {
    float* src = yr.data() + row * out;
    for (int64_t n0 = 0; n0 < out; n0 += tr::kHadDim) tr::had128_inplace(src + n0);
    float* dst = y + row * out;
    for (int64_t n = 0; n < out; ++n) {
      dst[n] = src[n] * tr::half_to_float(w.svh[n]) + (w.bias.empty() ? 0.0f : w.bias[n]);
    }
  });
}

}  // namespace exl3::cpu
