// CUDA EXL3 linear vs the CPU reference on fresh random data: every K x codebook, both paths,
// many m; poisoned outputs; graph replay == eager; batch invariance; golden GEMM vectors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

#include <fmt/format.h>

#include "exl3/cpu/linear.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/trellis/half.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace tr = exl3::trellis;
using exl3::cuda::CudaContext;
using exl3::cuda::DeviceBuffer;
using exl3::cuda::DType;
using exl3::cuda::Exl3LinearCuda;

namespace {

struct Layer {
  int64_t in, out;
  int K;
  tr::Codebook cb;
  std::vector<uint16_t> trellis, suh, svh;
  std::vector<float> bias;
  Layer(int64_t i, int64_t o, int k, tr::Codebook c, bool with_bias, std::mt19937_64& rng)
      : in(i), out(o), K(k), cb(c) {
    trellis.resize(static_cast<size_t>(in / 16 * (out / 16) * 16 * K));
    for (auto& w : trellis) w = static_cast<uint16_t>(rng());
    std::uniform_real_distribution<float> mag(0.05f, 1.0f);
    for (int64_t j = 0; j < in; ++j)
      suh.push_back(tr::float_to_half(((rng() & 1) ? -1.f : 1.f) * mag(rng) * 0.2f));
    for (int64_t j = 0; j < out; ++j)
      svh.push_back(tr::float_to_half(((rng() & 1) ? -1.f : 1.f) * mag(rng)));
    if (with_bias) {
      std::normal_distribution<float> nd;
      for (int64_t j = 0; j < out; ++j) bias.push_back(nd(rng));
    }
  }
  exl3::cpu::LinearView view() const { return {trellis, in, out, K, cb, suh, svh, bias}; }
  Exl3LinearCuda gpu(CudaContext& ctx, const exl3::cuda::LinearOptions& o) const {
    return Exl3LinearCuda(ctx, "test", trellis.data(), in, out, K, cb, suh.data(), svh.data(),
                          bias.empty() ? nullptr : bias.data(), o);
  }
};

// Runs the GPU layer on fp16 (or bf16) x and returns y as float (output dtype f16 or f32).
std::vector<float> run_gpu(const Exl3LinearCuda& L, const std::vector<uint16_t>& x_bits,
                           DType in_type, int64_t m, DType out_type, void* ws, size_t ws_bytes) {
  auto dx = DeviceBuffer::of<uint16_t>(x_bits.size(), "dx");
  DeviceBuffer dy(static_cast<size_t>(m * L.out_features()) * exl3::cuda::dtype_size(out_type),
                  "dy");
  EXPECT_EQ(cudaMemcpy(dx.as<uint16_t>(), x_bits.data(), x_bits.size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaMemset(dy.get(), 0xFF, dy.bytes()), cudaSuccess);  // poison: NaN in every dtype
  EXPECT_EQ(L.run(dx.as<uint16_t>(), in_type, dy.get(), out_type, m, ws, ws_bytes, nullptr),
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
      y[i] = out_type == DType::kF16 ? tr::half_to_float(b) : tr::bf16_to_float(b);
    }
  }
  return y;
}

std::vector<uint16_t> random_x(int64_t m, int64_t k, bool bf16, std::mt19937_64& rng,
                               float scale = 1.0f) {
  std::normal_distribution<float> nd;
  std::vector<uint16_t> x(static_cast<size_t>(m * k));
  for (auto& v : x)
    v = bf16 ? tr::float_to_bf16(scale * nd(rng)) : tr::float_to_half(scale * nd(rng));
  return x;
}

std::vector<float> cpu_ref(const Layer& L, const std::vector<uint16_t>& x, bool bf16, int64_t m) {
  std::vector<float> y(static_cast<size_t>(m * L.out));
  exl3::cpu::linear_forward(L.view(), x.data(),
                            bf16 ? exl3::cpu::ActDType::kBF16 : exl3::cpu::ActDType::kF16, m,
                            y.data());
  return y;
}

const tr::Codebook kAllCb[] = {tr::Codebook::k3Inst, tr::Codebook::kMcg, tr::Codebook::kMul1};

}  // namespace

TEST(CudaLinear, MatchesCpuAllBitsCodebooksAndM) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  const struct { int64_t in, out; } shapes[] = {{128, 128}, {256, 384}, {512, 256}};
  exl3::cuda::LinearOptions opts;
  opts.max_m = 1025;  // 1024 (fp16) and 1025 (bf16) take the folded cuBLAS path
  opts.gemv_max_m = 32;
  opts.mma_max_m = 256;
  for (const auto& sh : shapes) {
    for (int K = 1; K <= 8; ++K) {
      for (auto cb : kAllCb) {
        const Layer L(sh.in, sh.out, K, cb, (K % 2) == 0, rng);
        const auto gpu = L.gpu(ctx, opts);
        DeviceBuffer ws(gpu.workspace_bytes(), "ws");
        for (int64_t m : {1, 2, 3, 8, 16, 24, 33, 64, 256, 1024, 1025}) {
          const bool bf16 = (m % 2) == 1;
          const auto x = random_x(m, sh.in, bf16, rng);
          const auto ref = cpu_ref(L, x, bf16, m);
          const auto y = run_gpu(gpu, x, bf16 ? DType::kBF16 : DType::kF16, m, DType::kF16,
                                 ws.get(), ws.bytes());
          const double err =
              exl3::test::rel_l2(std::span<const float>(y), std::span<const float>(ref));
          EXPECT_LE(err, bf16 ? 8e-3 : 1e-3)
              << sh.in << "x" << sh.out << " K=" << K << " cb=" << tr::codebook_name(cb)
              << " m=" << m << " " << exl3::cuda::path_name(gpu.path_for(m));
        }
      }
    }
  }
}

TEST(CudaLinear, Fp32OutputAndRangeGuard) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  const Layer L(256, 256, 4, tr::Codebook::kMcg, true, rng);
  const auto gpu = L.gpu(ctx, {});
  DeviceBuffer ws(gpu.workspace_bytes(), "ws");
  // bf16 activations far outside fp16 range: the per-row power-of-two guard keeps x' finite.
  const auto x = random_x(5, 256, true, rng, 3.0e5f);
  const auto ref = cpu_ref(L, x, true, 5);
  const auto y = run_gpu(gpu, x, DType::kBF16, 5, DType::kF32, ws.get(), ws.bytes());
  for (float v : y) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LE(exl3::test::rel_l2(std::span<const float>(y), std::span<const float>(ref)), 8e-3);
}

// Rows must come out bit-identical whatever they are batched with, within each small-m path.
void expect_batch_invariant(const exl3::cuda::Exl3LinearCuda& gpu, int64_t in, int64_t out,
                            int64_t m, std::initializer_list<int64_t> subs, std::mt19937_64& rng) {
  DeviceBuffer ws(gpu.workspace_bytes(), "ws");
  const auto x = random_x(m, in, false, rng);
  const auto all = run_gpu(gpu, x, DType::kF16, m, DType::kF32, ws.get(), ws.bytes());
  for (int64_t sub : subs) {
    ASSERT_EQ(gpu.path_for(sub), gpu.path_for(m))
        << "sub-batch " << sub << " left the path under test";
    for (int64_t r0 = 0; r0 + sub <= m; r0 += 7) {
      std::vector<uint16_t> part(x.begin() + r0 * in, x.begin() + (r0 + sub) * in);
      const auto y = run_gpu(gpu, part, DType::kF16, sub, DType::kF32, ws.get(), ws.bytes());
      for (int64_t i = 0; i < sub * out; ++i) {
        uint32_t a, b;
        std::memcpy(&a, &y[i], 4);
        std::memcpy(&b, &all[r0 * out + i], 4);
        ASSERT_EQ(a, b) << exl3::cuda::path_name(gpu.path_for(m)) << ": row " << r0 + i / out
                        << " batched " << sub << " vs " << m;
      }
    }
  }
}

TEST(CudaLinear, BatchInvariantRowsOnGemvPath) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  exl3::cuda::LinearOptions opts;
  opts.gemv_max_m = 32;
  // MCG runs the split-halves decode, MUL1 the paired one; 29 rows span 1, 2 and 4 token groups.
  for (auto cb : {tr::Codebook::kMcg, tr::Codebook::kMul1}) {
    const Layer L(512, 384, 3, cb, false, rng);
    expect_batch_invariant(L.gpu(ctx, opts), 512, 384, 29, {1, 3, 8, 9, 17}, rng);
  }
}

TEST(CudaLinear, BatchInvariantRowsOnMmaPath) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  const Layer L(512, 384, 3, tr::Codebook::kMul1, false, rng);
  exl3::cuda::LinearOptions opts;
  opts.gemv_max_m = 0;  // every m <= mma_max_m on the tensor-core GEMM
  // 77 rows span 16-, 32- and 64-row groups.
  expect_batch_invariant(L.gpu(ctx, opts), 512, 384, 77, {1, 5, 20, 40}, rng);
}

// The GEMV that rotates its own input (one launch) gives the bits of the rotation kernel + GEMV
// pair, for every K and codebook, fp16 and bf16 rows, rows past the guard (divisor > 1), one
// slice of many chunks and split-K slices that cut chunks in the middle.
TEST(CudaLinear, FusedRotationEqualsRotationKernel) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;
  auto rng = exl3::test::make_rng();
  for (int K = 1; K <= 8; ++K) {
    for (auto cb : kAllCb) {
      const Layer L(384, 256, K, cb, K % 3 == 0, rng);
      for (int splits : {1, 5}) {
        exl3::cuda::LinearOptions fused, plain;
        fused.max_m = plain.max_m = 16;
        fused.split_k = plain.split_k = splits;  // 24 k-tiles in 5 slices: 4 or 5 tiles each
        fused.gemv_fused_rotation = true;
        plain.gemv_fused_rotation = false;
        const auto gf = L.gpu(ctx, fused), gp = L.gpu(ctx, plain);
        DeviceBuffer ws(std::max(gf.workspace_bytes(), gp.workspace_bytes()), "ws");
        for (int64_t m : {1, 2, 3, 8}) {
          ASSERT_GT(gf.plan(m).staged_chunks, 0) << "m=" << m;
          ASSERT_EQ(gp.plan(m).staged_chunks, 0);
          const bool bf16 = m % 2 == 1;
          const auto x = random_x(m, 384, bf16, rng, m == 3 ? 2.0e4f : 1.0f);
          const DType t = bf16 ? DType::kBF16 : DType::kF16;
          const auto a = run_gpu(gf, x, t, m, DType::kF32, ws.get(), ws.bytes());
          const auto b = run_gpu(gp, x, t, m, DType::kF32, ws.get(), ws.bytes());
          ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
              << "K=" << K << " cb=" << tr::codebook_name(cb) << " splits=" << splits << " m=" << m;
          for (float v : a) ASSERT_TRUE(std::isfinite(v)) << "m=" << m;
        }
      }
    }
  }
}

TEST(CudaLinear, GraphReplayEqualsEager) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  const Layer L(256, 512, 2, tr::Codebook::k3Inst, true, rng);
  exl3::cuda::LinearOptions opts;
  opts.max_m = 300;
  opts.mma_max_m = 128;
  const auto gpu = L.gpu(ctx, opts);
  DeviceBuffer ws(gpu.workspace_bytes(), "ws");
  for (int64_t m : {1, 3, 128, 300}) {
    const auto x = random_x(m, 256, false, rng);
    const auto eager = run_gpu(gpu, x, DType::kF16, m, DType::kF32, ws.get(), ws.bytes());

    auto dx = DeviceBuffer::of<uint16_t>(x.size(), "dx");
    auto dy = DeviceBuffer::of<float>(static_cast<size_t>(m * 512), "dy");
    EXL3_CUDA_CHECK(cudaMemcpy(dx.as<uint16_t>(), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    EXL3_CUDA_CHECK(cudaMemset(dy.as<float>(), 0xFF, dy.bytes()));
    cudaStream_t s;
    EXL3_CUDA_CHECK(cudaStreamCreate(&s));
    cudaGraph_t graph;
    EXL3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXL3_CUDA_CHECK(gpu.run(dx.as<uint16_t>(), DType::kF16, dy.as<float>(), DType::kF32, m,
                            ws.get(), ws.bytes(), s));
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

// q/k/v-style groups: one rotation launch and one fused GEMV launch for three layers reading the
// same x give each layer's own run() bits, eager and replayed from a graph (the GEMV completion
// counters are left zero between runs); layers of different K do not group.
TEST(CudaLinear, GroupRunEqualsSeparateRuns) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;
  auto rng = exl3::test::make_rng();
  for (auto cb : {tr::Codebook::kMcg, tr::Codebook::kMul1}) {
    const Layer a(512, 384, 4, cb, true, rng), b(512, 128, 4, cb, false, rng),
        c(512, 256, 4, cb, true, rng);
    exl3::cuda::LinearOptions opts;
    opts.max_m = 64;
    const auto ga = a.gpu(ctx, opts), gb = b.gpu(ctx, opts), gc = c.gpu(ctx, opts);
    const Exl3LinearCuda* group[] = {&ga, &gb, &gc};
    for (int64_t m : {1, 5, 8, 16}) {
      ASSERT_TRUE(Exl3LinearCuda::can_group(group, m)) << "m=" << m;
      const size_t ws_bytes =
          std::max({Exl3LinearCuda::group_workspace_bytes(group, m), ga.workspace_bytes(),
                    gb.workspace_bytes(), gc.workspace_bytes()});
      DeviceBuffer ws(ws_bytes, "ws");
      const auto x = random_x(m, 512, false, rng);
      std::vector<std::vector<float>> separate;
      for (const Exl3LinearCuda* l : group)
        separate.push_back(run_gpu(*l, x, DType::kF16, m, DType::kF32, ws.get(), ws.bytes()));

      auto dx = DeviceBuffer::of<uint16_t>(x.size(), "dx");
      EXL3_CUDA_CHECK(
          cudaMemcpy(dx.as<uint16_t>(), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
      std::vector<DeviceBuffer> dy;
      std::vector<void*> ys;
      for (const Exl3LinearCuda* l : group) {
        dy.push_back(DeviceBuffer::of<float>(static_cast<size_t>(m * l->out_features()), "dy"));
        ys.push_back(dy.back().get());
      }
      cudaStream_t s;
      EXL3_CUDA_CHECK(cudaStreamCreate(&s));
      const auto check = [&](const char* how) {
        for (size_t i = 0; i < dy.size(); ++i) {
          std::vector<float> got(dy[i].count<float>());
          EXL3_CUDA_CHECK(
              cudaMemcpy(got.data(), dy[i].get(), dy[i].bytes(), cudaMemcpyDeviceToHost));
          ASSERT_EQ(std::memcmp(got.data(), separate[i].data(), got.size() * 4), 0)
              << how << ": layer " << i << " m=" << m;
        }
      };
      const auto poison = [&] {
        for (auto& d : dy) EXL3_CUDA_CHECK(cudaMemset(d.get(), 0xFF, d.bytes()));
      };
      poison();
      EXL3_CUDA_CHECK(Exl3LinearCuda::run_group(group, dx.get(), DType::kF16, ys, DType::kF32, m,
                                                ws.get(), ws.bytes(), s));
      EXL3_CUDA_CHECK(cudaStreamSynchronize(s));
      check("eager");
      cudaGraph_t graph;
      EXL3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      EXL3_CUDA_CHECK(Exl3LinearCuda::run_group(group, dx.get(), DType::kF16, ys, DType::kF32, m,
                                                ws.get(), ws.bytes(), s));
      EXL3_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      cudaGraphExec_t exec;
      EXL3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int rep = 0; rep < 3; ++rep) {
        poison();
        EXL3_CUDA_CHECK(cudaGraphLaunch(exec, s));
        EXL3_CUDA_CHECK(cudaStreamSynchronize(s));
        check("replay");
      }
      EXL3_CUDA_CHECK(cudaGraphExecDestroy(exec));
      EXL3_CUDA_CHECK(cudaGraphDestroy(graph));
      EXL3_CUDA_CHECK(cudaStreamDestroy(s));
    }
    const Layer d(512, 128, 3, cb, false, rng);
    const auto gd = d.gpu(ctx, opts);
    const Exl3LinearCuda* mixed[] = {&ga, &gd};
    EXPECT_FALSE(Exl3LinearCuda::can_group(mixed, 1));
    const Exl3LinearCuda* one[] = {&ga};
    EXPECT_FALSE(Exl3LinearCuda::can_group(one, 65)) << "m past max_m";
  }
}

TEST(CudaLinear, RejectsBadArguments) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  auto rng = exl3::test::make_rng();
  const Layer L(128, 128, 4, tr::Codebook::kMcg, false, rng);
  exl3::cuda::LinearOptions opts;
  opts.max_m = 8;
  const auto gpu = L.gpu(ctx, opts);
  DeviceBuffer ws(gpu.workspace_bytes(), "ws");
  auto x = DeviceBuffer::of<uint16_t>(16 * 128, "x");
  auto y = DeviceBuffer::of<uint16_t>(16 * 128, "y");
  EXPECT_EQ(gpu.run(x.as<uint16_t>(), DType::kF16, y.as<uint16_t>(), DType::kF16, 9, ws.get(),
                    ws.bytes(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(gpu.run(x.as<uint16_t>(), DType::kF16, y.as<uint16_t>(), DType::kF16, 0, ws.get(),
                    ws.bytes(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(gpu.run(x.as<uint16_t>(), DType::kF16, y.as<uint16_t>(), DType::kF16, 4, ws.get(), 16,
                    nullptr),
            cudaErrorInvalidValue);
  EXPECT_THROW(Exl3LinearCuda(ctx, "bad", L.trellis.data(), 128, 128, 9, L.cb, L.suh.data(),
                              L.svh.data(), nullptr),
               exl3::Error);
}

TEST(CudaLinear, GoldenGemmVectors) {
  EXL3_REQUIRE_GPU();
  CudaContext ctx;  // cuBLAS for the layers of this test
  EXL3_REQUIRE_CONFORMANCE(dir);
  for (const char* cbn : {"3inst", "mcg", "mul1"}) {
    const auto ckpt =
        exl3::Checkpoint::open(dir / "tensors" / fmt::format("exl3_public_{}.safetensors", cbn));
    for (int K = 1; K <= 8; ++K) {
      const std::string name = fmt::format("cb_{}.k{}", cbn, K);
      const auto data = exl3::Exl3LinearData::load(ckpt, name + ".layer");
      const Exl3LinearCuda gpu(ctx, data);
      DeviceBuffer ws(gpu.workspace_bytes(), "ws");
      const auto x = exl3::copy_tensor<uint16_t>(ckpt.store().at(name + ".input.x"));
      const int64_t m = static_cast<int64_t>(x.size()) / 256;
      const auto y = run_gpu(gpu, x, DType::kF16, m, DType::kF16, ws.get(), ws.bytes());
      const auto ref = exl3::read_as_double(ckpt.store().at(name + ".expected.y_fp64"));
      EXPECT_LE(exl3::test::rel_l2(std::span<const float>(y), std::span<const double>(ref)), 1e-3)
          << name;
    }
  }
}
