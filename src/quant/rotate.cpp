// The left transform gathers 16 columns of a 128-row block at a time into a contiguous buffer, so
// each column goes through the shared 128-point transform and the gather stays cache friendly.
#include "quant/rotate.hpp"

#include <algorithm>
#include <array>

#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>

#include "exl3/trellis/hadamard.hpp"

namespace exl3::quant::detail {

namespace tr = exl3::trellis;

namespace {

template <typename T>
void right_impl(T* x, int64_t rows, int64_t cols) {
  tbb::parallel_for(int64_t{0}, rows, [&](int64_t r) {
    for (int64_t c = 0; c < cols; c += tr::kHadDim) tr::had128_inplace(x + r * cols + c);
  });
}

template <typename T>
void left_impl(T* x, int64_t rows, int64_t cols) {
  constexpr int64_t kGroup = 16;
  const int64_t groups = (cols + kGroup - 1) / kGroup;
  tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, rows / tr::kHadDim, 0, groups),
                    [&](const tbb::blocked_range2d<int64_t>& range) {
                      std::array<T, kGroup * tr::kHadDim> buf;
                      for (int64_t blk = range.rows().begin(); blk < range.rows().end(); ++blk) {
                        T* base = x + blk * tr::kHadDim * cols;
                        for (int64_t g = range.cols().begin(); g < range.cols().end(); ++g) {
                          const int64_t c0 = g * kGroup;
                          const int64_t width = std::min(kGroup, cols - c0);
                          for (int64_t r = 0; r < tr::kHadDim; ++r) {
                            for (int64_t c = 0; c < width; ++c)
                              buf[c * tr::kHadDim + r] = base[r * cols + c0 + c];
                          }
                          for (int64_t c = 0; c < width; ++c)
                            tr::had128_inplace(buf.data() + c * tr::kHadDim);
                          for (int64_t r = 0; r < tr::kHadDim; ++r) {
                            for (int64_t c = 0; c < width; ++c)
                              base[r * cols + c0 + c] = buf[c * tr::kHadDim + r];
                          }
                        }
                      }
                    });
}

}  // namespace

void had_right(float* x, int64_t rows, int64_t cols) {
  right_impl(x, rows, cols);
}
void had_right(double* x, int64_t rows, int64_t cols) {
  right_impl(x, rows, cols);
}
void had_left(float* x, int64_t rows, int64_t cols) {
  left_impl(x, rows, cols);
}
void had_left(double* x, int64_t rows, int64_t cols) {
  left_impl(x, rows, cols);
}

}  // namespace exl3::quant::detail
