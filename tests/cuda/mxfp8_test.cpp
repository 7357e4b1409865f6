// CUDA MXFP8 linear against the CPU reference (mxfp8::Weight::matmul_t) on random data at m from
// 1 to 1024 (both paths: the tensor-core GEMV with every n8-tile count, and dequant + cuBLAS),
// with and without bias, fp32 and bf16 outputs poisoned with NaN first; E4M3 subnormal codes and
// extreme scales and activations; batch invariance on the GEMV; CUDA graph replay equal to eager;
// the BF16 dequant pass exact on ragged rows; the tiled layout a permutation; error paths. Every
// CUDA return code is checked.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/mxfp8_tiles.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/mxfp8.hpp"
#include "exl3/error.hpp"
#include "exl3/mxfp8/weight.hpp"
#include "exl3/trellis/half.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace {

using exl3::cuda::CudaContext;
using exl3::cuda::DeviceBuffer;
using exl3::cuda::DType;
using exl3::cuda::Mxfp8LinearCuda;
using exl3::cuda::Mxfp8Options;
using exl3::cuda::Mxfp8Path;

struct Problem {
  int64_t in, out;
  exl3::mxfp8::Weight w;
  std::vector<float> bias;
};

Problem make_problem(std::mt19937_64& rng, int64_t in, int64_t out, bool bias) {
  std::normal_distribution<float> nd(0.0f, 0.03f);
  std::uniform_real_distribution<float> mag(0.2f, 5.0f);
  std::vector<float> w(static_cast<size_t>(in * out));
  for (int64_t r = 0; r < out; ++r) {
    const float g = mag(rng);
    for (int64_t c = 0; c < in; ++c) {
      float v = g * nd(rng);
      w[static_cast<size_t>(r * in + c)] = v == 0.0f ? 1e-3f : v;
    }
  }
  Problem p{in, out, exl3::mxfp8::Weight::quantize_f32("test", w, out, in), {}};
  if (bias) {
    p.bias.resize(static_cast<size_t>(out));
    for (auto& b : p.bias) b = nd(rng) * 10.0f;
  }
  return p;
}

// x [m, in]: bf16 bits and the same values as fp32.
void make_x(std::mt19937_64& rng, int64_t m, int64_t in, std::vector<uint16_t>& bits,
            std::vector<float>& f) {
  std::normal_distribution<float> nd;
  bits.resize(static_cast<size_t>(m * in));
  f.resize(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    float v = nd(rng);
    if (v == 0.0f) v = 0.5f;
    bits[i] = exl3::trellis::float_to_bf16(v);
    f[i] = exl3::trellis::bf16_to_float(bits[i]);
  }
}

std::vector<float> run_gpu(const Mxfp8LinearCuda& L, const std::vector<uint16_t>& x, int64_t m,
                           DType out_type) {
  const size_t ws_bytes = L.workspace_bytes();
  DeviceBuffer ws(ws_bytes, "ws");
  auto dx = DeviceBuffer::of<uint16_t>(x.size(), "dx");
  const size_t es = out_type == DType::kF32 ? 4 : 2;
  DeviceBuffer dy(static_cast<size_t>(m * L.out_features()) * es, "dy");
  EXPECT_EQ(cudaMemcpy(dx.as<uint16_t>(), x.data(), x.size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaMemset(dy.get(), 0xFF, dy.bytes()), cudaSuccess);  // poison: NaN in fp32 and bf16
  EXPECT_EQ(L.run(dx.as<uint16_t>(), dy.get(), out_type, m, ws.get(), ws_bytes, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<char> host(dy.bytes());
  EXPECT_EQ(cudaMemcpy(host.data(), dy.get(), dy.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> y(static_cast<size_t>(m * L.out_features()));
  for (size_t i = 0; i < y.size(); ++i) {
    if (out_type == DType::kF32) {
      std::memcpy(&y[i], host.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, host.data() + 2 * i, 2);
      y[i] = exl3::trellis::bf16_to_float(b);
    }
  }
  return y;
}

// The layer's BF16 dequant pass, poisoned first, back on the host.
std::vector<uint16_t> dequant_on_gpu(const Mxfp8LinearCuda& L) {
  auto d = DeviceBuffer::of<uint16_t>(static_cast<size_t>(L.in_features() * L.out_features()), "d");
  EXPECT_EQ(cudaMemset(d.as<uint16_t>(), 0xFF, d.bytes()), cudaSuccess);
  EXPECT_EQ(L.dequantize_bf16(d.as<uint16_t>(), nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> h(d.count<uint16_t>());
  EXPECT_EQ(cudaMemcpy(h.data(), d.as<uint16_t>(), d.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(Mxfp8Cuda, MatchesTheCpuReferenceOnEveryPath) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  // 200 outputs: a ragged last row tile; 256 -> 128 and 128 -> 256: fewer 32-input blocks per
  // row than the GEMV has warps (the engine test models' shared-expert MLP).
  for (const auto& [in, out, bias] : {std::tuple{int64_t{1024}, int64_t{200}, false},
                                      std::tuple{int64_t{1024}, int64_t{200}, true},
                                      std::tuple{int64_t{256}, int64_t{128}, false},
                                      std::tuple{int64_t{128}, int64_t{256}, true}}) {
    const auto P = make_problem(rng, in, out, bias);
    for (int64_t gemv_max_m : {int64_t{64}, int64_t{16}}) {
      Mxfp8Options o;
      o.max_m = 1024;
      o.gemv_max_m = gemv_max_m;
      const Mxfp8LinearCuda L(ctx, P.w, P.bias, o);
      for (int64_t m : {1, 2, 3, 8, 9, 16, 17, 31, 33, 64, 65, 256, 1024}) {
        std::vector<uint16_t> xb;
        std::vector<float> xf;
        make_x(rng, m, P.in, xb, xf);
        std::vector<float> ref(static_cast<size_t>(m * P.out));
        P.w.matmul_t(xf.data(), m, ref.data(), P.bias);
        for (DType t : {DType::kF32, DType::kBF16}) {
          const auto y = run_gpu(L, xb, m, t);
          for (float v : y) ASSERT_TRUE(std::isfinite(v)) << "m=" << m;
          const double err = exl3::test::rel_l2(y, ref);
          // fp32: summation order only; bf16 output: one rounding (2^-9 relative).
          EXPECT_LT(err, t == DType::kF32 ? 2e-6 : 4e-3)
              << in << "x" << out << " m=" << m
              << " path=" << exl3::cuda::mxfp8_path_name(L.path_for(m)) << " bias=" << bias;
        }
      }
    }
  }
}

// E4M3 subnormal codes only (the bf16 operands are subnormal too), then every code with scales
// from 2^-27 to 2^60 and activations from 2^-40 to 2^60: the GEMV's 2^48 / 2^72
// range scaling must keep the result equal to the reference's fp32 arithmetic.
TEST(Mxfp8Cuda, SubnormalCodesAndExtremeRangesStayExact) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  const int64_t in = 512, out = 48, m = 5;
  struct Case {
    const char* what;
    int code_lo, code_hi, scale_lo, scale_hi;
    float x_scale;
  };
  for (const Case& c :
       {Case{"subnormal codes", 1, 7, 127, 127, 1.0f}, Case{"tiny scales", 0, 126, 100, 110, 1.0f},
        Case{"huge scales", 0, 126, 170, 187, 1.0f},
        Case{"tiny activations", 0, 126, 120, 130, 0x1p-40f},
        Case{"huge activations", 0, 126, 100, 110, 0x1p60f}}) {
    std::uniform_int_distribution<int> code(c.code_lo, c.code_hi), sign(0, 1),
        sc(c.scale_lo, c.scale_hi);
    std::vector<uint8_t> v(static_cast<size_t>(in * out)), s(static_cast<size_t>(in / 32 * out));
    for (auto& b : v) b = static_cast<uint8_t>(code(rng) | (sign(rng) << 7));
    for (auto& b : s) b = static_cast<uint8_t>(sc(rng));
    const auto w = exl3::mxfp8::Weight::from_planes("extreme", v, s, out, in);
    Mxfp8Options o;
    o.gemv_max_m = 64;
    const Mxfp8LinearCuda L(ctx, w, {}, o);
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    make_x(rng, m, in, xb, xf);
    for (size_t i = 0; i < xb.size(); ++i) {
      xb[i] = exl3::trellis::float_to_bf16(xf[i] * c.x_scale);
      xf[i] = exl3::trellis::bf16_to_float(xb[i]);
    }
    std::vector<float> ref(static_cast<size_t>(m * out));
    w.matmul_t(xf.data(), m, ref.data());
    const auto y = run_gpu(L, xb, m, DType::kF32);
    for (float f : y) ASSERT_TRUE(std::isfinite(f)) << c.what;
    EXPECT_LT(exl3::test::rel_l2(y, ref), 2e-6) << c.what;
    // The BF16 dequant (the cuBLAS path's weight) rounds the exact value once, like the host.
    const auto h = dequant_on_gpu(L);
    const auto dq = w.dequantize();
    for (size_t i = 0; i < h.size(); ++i) {
      ASSERT_EQ(h[i], exl3::trellis::float_to_bf16(dq[i])) << c.what << " element " << i;
    }
  }
}

TEST(Mxfp8Cuda, RowsAreBatchInvariantOnTheGemv) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  const auto P = make_problem(rng, 2048, 384, true);
  Mxfp8Options o;
  o.gemv_max_m = 64;
  const Mxfp8LinearCuda L(ctx, P.w, P.bias, o);
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  make_x(rng, 64, P.in, xb, xf);
  // m = 64 (8 n8 tiles) against every other tile count and ragged m.
  const auto y64 = run_gpu(L, xb, 64, DType::kF32);
  for (int64_t m : {1, 2, 3, 5, 8, 9, 13, 16, 17, 32, 40, 63}) {
    ASSERT_EQ(L.path_for(m), Mxfp8Path::kGemv);
    const auto y =
        run_gpu(L, std::vector<uint16_t>(xb.begin(), xb.begin() + m * P.in), m, DType::kF32);
    ASSERT_EQ(std::memcmp(y.data(), y64.data(), y.size() * 4), 0) << "gemv m=" << m;
  }
}

TEST(Mxfp8Cuda, GraphReplayEqualsEager) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  const auto P = make_problem(rng, 4096, 512, true);
  const Mxfp8LinearCuda L(ctx, P.w, P.bias);
  for (int64_t m : {1, 9, 64, 1024}) {
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    make_x(rng, m, P.in, xb, xf);
    const auto eager = run_gpu(L, xb, m, DType::kF32);
    auto dx = DeviceBuffer::of<uint16_t>(xb.size(), "dx");
    auto dy = DeviceBuffer::of<float>(static_cast<size_t>(m * P.out), "dy");
    DeviceBuffer ws(L.workspace_bytes(), "ws");
    EXL3_CUDA_CHECK(
        cudaMemcpy(dx.as<uint16_t>(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
    EXL3_CUDA_CHECK(cudaMemset(dy.as<float>(), 0xFF, dy.bytes()));
    cudaStream_t s;
    EXL3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // Warm once outside capture (cuBLAS picks and loads its kernel), then capture.
    EXL3_CUDA_CHECK(
        L.run(dx.as<uint16_t>(), dy.as<float>(), DType::kF32, m, ws.get(), ws.bytes(), s));
    EXL3_CUDA_CHECK(cudaStreamSynchronize(s));
    EXL3_CUDA_CHECK(cudaMemset(dy.as<float>(), 0xFF, dy.bytes()));
    cudaGraph_t graph;
    EXL3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXL3_CUDA_CHECK(
        L.run(dx.as<uint16_t>(), dy.as<float>(), DType::kF32, m, ws.get(), ws.bytes(), s));
    EXL3_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    EXL3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; ++rep) EXL3_CUDA_CHECK(cudaGraphLaunch(exec, s));
    EXL3_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> replay(dy.count<float>());
    EXL3_CUDA_CHECK(cudaMemcpy(replay.data(), dy.as<float>(), dy.bytes(), cudaMemcpyDeviceToHost));
    EXL3_CUDA_CHECK(cudaGraphExecDestroy(exec));
    EXL3_CUDA_CHECK(cudaGraphDestroy(graph));
    EXL3_CUDA_CHECK(cudaStreamDestroy(s));
    ASSERT_EQ(std::memcmp(replay.data(), eager.data(), eager.size() * 4), 0) << "m=" << m;
  }
}

TEST(Mxfp8Cuda, DequantIsExactAndHostWrapperMatches) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  const auto P = make_problem(rng, 256, 100, false);  // 100 rows: the padded last tile is cut off
  const Mxfp8LinearCuda L(ctx, P.w);
  const auto h = dequant_on_gpu(L);
  const auto ref = P.w.dequantize();
  for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(exl3::trellis::bf16_to_float(h[i]), ref[i]) << i;
  std::vector<float> x(static_cast<size_t>(3 * P.in), 0.25f);
  std::vector<float> yr(static_cast<size_t>(3 * P.out));
  P.w.matmul_t(x.data(), 3, yr.data());
  EXPECT_LT(exl3::test::rel_l2(exl3::cuda::mxfp8_forward_host(L, x.data(), 3), yr), 2e-6);
}

TEST(Mxfp8Cuda, ErrorPaths) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  std::vector<uint8_t> v(48 * 8, 0x38), s(8, 120);
  EXPECT_THROW(Mxfp8LinearCuda(ctx, "bad", v.data(), s.data(), 48, 8, nullptr), exl3::Error);
  Mxfp8Options o;
  o.gemv_max_m = 65;
  std::vector<uint8_t> v2(64 * 8, 0x38), s2(16, 120);
  EXPECT_THROW(Mxfp8LinearCuda(ctx, "bad", v2.data(), s2.data(), 64, 8, nullptr, o), exl3::Error);
  {
    auto nan_code = v2;
    nan_code[100] = 0xFF;
    auto nan_scale = s2;
    nan_scale[3] = 0xFF;
    EXPECT_THROW(Mxfp8LinearCuda(ctx, "bad", nan_code.data(), s2.data(), 64, 8, nullptr),
                 exl3::Error);
    EXPECT_THROW(Mxfp8LinearCuda(ctx, "bad", v2.data(), nan_scale.data(), 64, 8, nullptr),
                 exl3::Error);
  }
  o = {};
  o.max_m = 64;
  const Mxfp8LinearCuda L(ctx, "ok", v2.data(), s2.data(), 64, 8, nullptr, o);
  auto dx = DeviceBuffer::of<uint16_t>(128 * 64, "dx");
  auto dy = DeviceBuffer::of<float>(128 * 8, "dy");
  DeviceBuffer ws(L.workspace_bytes(), "ws");
  EXPECT_EQ(L.run(dx.as<uint16_t>(), dy.as<float>(), DType::kF32, 0, ws.get(), ws.bytes(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      L.run(dx.as<uint16_t>(), dy.as<float>(), DType::kF32, 65, ws.get(), ws.bytes(), nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(L.run(dx.as<uint16_t>(), dy.as<float>(), DType::kF16, 1, ws.get(), ws.bytes(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(L.run(nullptr, dy.as<float>(), DType::kF32, 1, ws.get(), ws.bytes(), nullptr),
            cudaErrorInvalidValue);
  if (L.workspace_bytes(64) > 0) {
    EXPECT_EQ(L.run(dx.as<uint16_t>(), dy.as<float>(), DType::kF32, 64, ws.get(), 1, nullptr),
              cudaErrorInvalidValue);
  }
  EXPECT_THROW(exl3::cuda::mxfp8_forward_host(L, std::vector<float>(64).data(), 100), exl3::Error);
  EXL3_CUDA_CHECK(cudaGetLastError());
}

// The tiled layout is a permutation of the code and scale planes (every source byte lands on its
// own destination, inside the padded planes); checked on the host, no GPU needed.
TEST(Mxfp8Tiles, LayoutIsAPermutation) {
  for (int64_t k : {32, 96, 4096}) {
    const int64_t n = 40, kb = k / 32, rows = 48;
    std::vector<int> hits(static_cast<size_t>(rows * k), 0),
        shits(static_cast<size_t>(rows * kb), 0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const int64_t off = exl3::cuda::detail::mxfp8_tile_value_offset(r, c, kb);
        ASSERT_GE(off, 0);
        ASSERT_LT(off, rows * k);
        ++hits[static_cast<size_t>(off)];
      }
      for (int64_t b = 0; b < kb; ++b)
        ++shits[static_cast<size_t>(exl3::cuda::detail::mxfp8_tile_scale_offset(r, b, kb))];
    }
    for (int h : hits) ASSERT_EQ(h, 1) << "k=" << k;
    for (int h : shits) ASSERT_EQ(h, 1) << "k=" << k;
    (void)n;
  }
}

}  // namespace
