// hadamard128_rows vs an fp64 CPU Hadamard (trellis/hadamard.hpp) for every in/out dtype pair,
// with and without scales, on fresh random inputs and NaN-poisoned outputs.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/hadamard.hpp"
#include "exl3/trellis/hadamard.hpp"
#include "exl3/trellis/half.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace {

namespace tr = exl3::trellis;
using exl3::cuda::DeviceBuffer;
using exl3::cuda::DType;

size_t esize(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

// Host bytes of `v` in dtype t, and back to float.
std::vector<char> encode(const std::vector<float>& v, DType t) {
  std::vector<char> out(v.size() * esize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t b = t == DType::kF16 ? tr::float_to_half(v[i]) : tr::float_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}
float decode_one(const char* p, DType t) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, p, 2);
  return t == DType::kF16 ? tr::half_to_float(b) : tr::bf16_to_float(b);
}

TEST(CudaHadamard, RowsMatchFp64AllDtypesAndScales) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  std::normal_distribution<float> nd;
  const DType types[] = {DType::kF16, DType::kBF16, DType::kF32};
  for (int64_t rows : {1, 3, 37}) {
    for (int64_t cols : {128, 384, 1024}) {
      for (DType in : types) {
        for (DType out : types) {
          for (bool scaled : {false, true}) {
            std::vector<float> x(static_cast<size_t>(rows * cols));
            for (auto& v : x) v = nd(rng);
            const auto xb = encode(x, in);
            for (size_t i = 0; i < x.size(); ++i)
              x[i] = decode_one(xb.data() + i * esize(in), in);  // as stored
            std::vector<uint16_t> pre(static_cast<size_t>(cols)), post(static_cast<size_t>(cols));
            for (auto& v : pre)
              v = tr::float_to_half((rng() & 1 ? -1.f : 1.f) * (0.5f + 0.5f * std::fabs(nd(rng))));
            for (auto& v : post)
              v = tr::float_to_half((rng() & 1 ? -1.f : 1.f) * (0.5f + 0.5f * std::fabs(nd(rng))));

            std::vector<double> ref(x.size());
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t c0 = 0; c0 < cols; c0 += 128) {
                double chunk[128];
                for (int j = 0; j < 128; ++j) {
                  chunk[j] = x[r * cols + c0 + j] * (scaled ? tr::half_to_float(pre[c0 + j]) : 1.0);
                }
                tr::had128_inplace(chunk);
                for (int j = 0; j < 128; ++j) {
                  ref[r * cols + c0 + j] =
                      chunk[j] * (scaled ? tr::half_to_float(post[c0 + j]) : 1.0);
                }
              }
            }

            const auto dx = DeviceBuffer::upload(xb, "x");
            const DeviceBuffer dy(x.size() * esize(out), "y");
            const auto dpre = DeviceBuffer::upload(pre, "pre");
            const auto dpost = DeviceBuffer::upload(post, "post");
            EXL3_CUDA_CHECK(cudaMemset(dy.get(), 0xFF, dy.bytes()));  // NaN poison
            EXL3_CUDA_CHECK(exl3::cuda::hadamard128_rows(
                dx.get(), in, dy.get(), out, rows, cols, scaled ? dpre.as<uint16_t>() : nullptr,
                scaled ? dpost.as<uint16_t>() : nullptr, nullptr));
            EXL3_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<char> yb(x.size() * esize(out));
            EXL3_CUDA_CHECK(cudaMemcpy(yb.data(), dy.get(), yb.size(), cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (size_t i = 0; i < x.size(); ++i) {
              const double d = decode_one(yb.data() + i * esize(out), out) - ref[i];
              num += d * d;
              den += ref[i] * ref[i];
            }
            const double tol = out == DType::kBF16 ? 8e-3 : (out == DType::kF16 ? 1e-3 : 1e-6);
            EXPECT_LE(std::sqrt(num / den), tol)
                << rows << "x" << cols << " in " << static_cast<int>(in) << " out "
                << static_cast<int>(out) << " scaled " << scaled;
          }
        }
      }
    }
  }
}

TEST(CudaHadamard, RejectsBadShapes) {
  EXL3_REQUIRE_GPU();
  float buf[4];
  EXPECT_EQ(exl3::cuda::hadamard128_rows(buf, DType::kF32, buf, DType::kF32, 1, 100, nullptr,
                                         nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(exl3::cuda::hadamard128_rows(buf, DType::kF32, buf, DType::kF32, 0, 128, nullptr,
                                         nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(exl3::cuda::hadamard128_rows(nullptr, DType::kF32, buf, DType::kF32, 1, 128, nullptr,
                                         nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
