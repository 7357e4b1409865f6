// Fused CUDA MoE vs the CPU reference MoE (src/moe/reference.cpp) on synthetic checkpoints in
// both rank-sliced layouts, uniform and mixed tiers, decode and prefill plans; graph replay;
// edge routes; option validation.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../format/format_test_util.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/moe.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/moe/reference.hpp"
#include "exl3/moe/router.hpp"
#include "exl3/moe/synthetic.hpp"
#include "exl3/moe/weights.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace {

using exl3::cuda::DeviceBuffer;
using exl3::cuda::DType;
using exl3::cuda::MoeLayerCuda;
using exl3::cuda::MoeOptions;
namespace moe = exl3::moe;

// `count` elements of T on the device plus 16 bytes of slack past the end.
template <typename T>
DeviceBuffer slack_buffer(size_t count) {
  return DeviceBuffer(count * sizeof(T) + 16, "a test buffer");
}

struct Fixture {
  exl3::test::TempDir dir;
  moe::MoeLayerWeights w;
  int top_k = 2;
};

// A one-layer synthetic checkpoint (layer 1), loaded for rank 0.
std::unique_ptr<Fixture> make_layer(moe::RotationLayout layout, std::vector<int> expert_bits,
                                    int bits, int experts, int tp = 1, int64_t H = 256,
                                    int64_t I = 256,
                                    exl3::trellis::Codebook cb = exl3::trellis::Codebook::kMcg) {
  auto f = std::make_unique<Fixture>();
  moe::SyntheticMoeSpec spec;
  spec.hidden_size = H;
  spec.intermediate_size = I;
  spec.num_experts = experts;
  spec.top_k = f->top_k;
  spec.tp = tp;
  spec.rotation = layout;
  spec.bits = bits;
  spec.expert_bits = std::move(expert_bits);
  spec.codebook = cb;
  spec.seed = exl3::test::make_rng()();
  moe::write_synthetic_moe(f->dir.path(), spec);
  const auto ckpt = exl3::Checkpoint::open(f->dir.path());
  f->w = moe::load_moe_layer(ckpt, 1, 0, tp, experts);
  return f;
}

// k distinct random experts per token, random positive weights.
moe::TopK random_routes(int64_t m, int k, int E, std::mt19937_64& rng) {
  moe::TopK r;
  r.m = m;
  r.k = k;
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  for (int64_t t = 0; t < m; ++t) {
    std::vector<int> perm(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) perm[static_cast<size_t>(e)] = e;
    for (int j = 0; j < k; ++j) {
      std::swap(perm[static_cast<size_t>(j)], perm[j + rng() % static_cast<size_t>(E - j)]);
      r.ids.push_back(perm[static_cast<size_t>(j)]);
      r.weights.push_back(u(rng));
    }
  }
  return r;
}

std::vector<float> random_x(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

// GPU forward (fp32 in and out); out poisoned with NaN before the run.
std::vector<float> run_gpu(const MoeLayerCuda& L, const std::vector<float>& x, const moe::TopK& r,
                           cudaGraphExec_t* replay = nullptr) {
  const int64_t H = L.hidden(), m = r.m;
  const size_t out_count = static_cast<size_t>(m * H), arena_bytes = L.arena_bytes();
  const auto dx = slack_buffer<float>(x.size()), dout = slack_buffer<float>(out_count),
             dw = slack_buffer<float>(r.weights.size());
  const auto dids = slack_buffer<int32_t>(r.ids.size());
  const auto arena = slack_buffer<char>(arena_bytes);
  std::vector<float> out(static_cast<size_t>(m * H));
  EXL3_CUDA_CHECK(cudaMemcpy(dx.as<float>(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  EXL3_CUDA_CHECK(
      cudaMemcpy(dids.as<int32_t>(), r.ids.data(), r.ids.size() * 4, cudaMemcpyHostToDevice));
  EXL3_CUDA_CHECK(
      cudaMemcpy(dw.as<float>(), r.weights.data(), r.weights.size() * 4, cudaMemcpyHostToDevice));
  EXL3_CUDA_CHECK(cudaMemset(dout.as<float>(), 0xFF, out_count * 4));  // NaN poison
  EXL3_CUDA_CHECK(cudaMemset(arena.get(), 0xFF, arena_bytes));
  EXL3_CUDA_CHECK(L.run(dx.as<float>(), DType::kF32, dids.as<int32_t>(), dw.as<float>(),
                        dout.as<float>(), m, arena.get(), arena_bytes, nullptr));
  EXL3_CUDA_CHECK(cudaDeviceSynchronize());
  EXL3_CUDA_CHECK(cudaMemcpy(out.data(), dout.as<float>(), out.size() * 4, cudaMemcpyDeviceToHost));
  if (replay != nullptr) {
    // Capture the same call, poison, replay twice: must equal the eager result bit for bit.
    cudaStream_t s;
    EXL3_CUDA_CHECK(cudaStreamCreate(&s));
    cudaGraph_t g;
    EXL3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXL3_CUDA_CHECK(L.run(dx.as<float>(), DType::kF32, dids.as<int32_t>(), dw.as<float>(),
                          dout.as<float>(), m, arena.get(), arena_bytes, s));
    EXL3_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    EXL3_CUDA_CHECK(cudaGraphInstantiate(replay, g, 0));
    EXL3_CUDA_CHECK(cudaGraphDestroy(g));
    EXL3_CUDA_CHECK(cudaMemset(dout.as<float>(), 0xFF, out_count * 4));
    for (int i = 0; i < 2; ++i) EXL3_CUDA_CHECK(cudaGraphLaunch(*replay, s));
    EXL3_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> again(out.size());
    EXL3_CUDA_CHECK(
        cudaMemcpy(again.data(), dout.as<float>(), again.size() * 4, cudaMemcpyDeviceToHost));
    EXL3_CUDA_CHECK(cudaGraphExecDestroy(*replay));
    EXL3_CUDA_CHECK(cudaStreamDestroy(s));
    if (std::memcmp(again.data(), out.data(), out.size() * 4) != 0)
      exl3::fail("graph replay != eager at m={}", m);
  }
  return out;
}

void expect_matches(const Fixture& f, const MoeOptions& opts, const std::vector<int64_t>& ms,
                    const char* what) {
  auto rng = exl3::test::make_rng();
  const MoeLayerCuda L(f.w, f.top_k, opts);
  for (int64_t m : ms) {
    const auto r = random_routes(m, f.top_k, f.w.num_experts(), rng);
    const auto x = random_x(m * f.w.hidden, rng);
    std::vector<float> ref(x.size());
    moe::moe_forward(f.w, r, x.data(), m, ref.data());
    const auto got = run_gpu(L, x, r);
    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what << " m=" << m;
    EXPECT_LE(exl3::test::rel_l2(std::span<const float>(got), std::span<const float>(ref)), 1e-3)
        << what << " m=" << m << " path " << exl3::cuda::moe_path_name(L.path_for(m));
  }
}

MoeOptions opts_for(int64_t capacity, int64_t chunk = 0) {
  MoeOptions o;
  o.capacity = capacity;
  o.prefill_chunk = chunk;
  return o;
}

const std::vector<int64_t> kMs = {1, 2, 3, 8, 32, 33, 256};

TEST(CudaMoe, PerExpertUniformK3) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kPerExpert, {}, 3, 8);
  expect_matches(*f, opts_for(256), kMs, "per_expert_v1 K3");
}

TEST(CudaMoe, SharedHUniformK4) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kSharedH, {}, 4, 8);
  expect_matches(*f, opts_for(256), kMs, "shared_h_v1 K4");
}

TEST(CudaMoe, MixedK3K4TiersBothLayouts) {
  EXL3_REQUIRE_GPU();
  for (auto layout : {moe::RotationLayout::kPerExpert, moe::RotationLayout::kSharedH}) {
    const auto f = make_layer(layout, {3, 4, 4, 3, 3, 4, 3, 4}, 3, 8);
    // One grid with a per-block K switch, per-K passes, and the planner's choice by plan.
    for (const auto tiers :
         {MoeOptions::Tiers::kGrid, MoeOptions::Tiers::kPasses, MoeOptions::Tiers::kAuto}) {
      auto o = opts_for(3072, 1000);
      o.tiers = tiers;
      const MoeLayerCuda L(f->w, f->top_k, o);
      EXPECT_EQ(L.tiers(), (std::vector<int>{3, 4}));
      EXPECT_EQ(L.tier_passes(exl3::cuda::MoePath::kDecode), tiers == MoeOptions::Tiers::kPasses);
      EXPECT_EQ(L.tier_passes(exl3::cuda::MoePath::kPrefill), tiers == MoeOptions::Tiers::kPasses);
      expect_matches(*f, o, {1, 3, 8, 33, 3072}, moe::rotation_layout_name(layout).data());
    }
  }
}

// Prefill groups of 32 slots (the grouped GEMV) and of 128 (the decode-once grouped GEMM; the
// automatic choice takes it only where experts average many routes, so force each): mixed tiers
// in one grid and in per-K passes, both rank-sliced layouts; groups of 1..128 slots and experts
// with several groups (m = 3072, top-2 of 8: ~768 routes per expert).
TEST(CudaMoe, PrefillGroupsOf32And128) {
  EXL3_REQUIRE_GPU();
  for (auto layout : {moe::RotationLayout::kPerExpert, moe::RotationLayout::kSharedH}) {
    const auto f = make_layer(layout, {3, 4, 4, 3, 3, 4, 3, 4}, 3, 8);
    for (const int64_t group : {32, 128}) {
      for (const auto tiers : {MoeOptions::Tiers::kGrid, MoeOptions::Tiers::kPasses}) {
        auto o = opts_for(3072, 1000);
        o.prefill_group = group;
        o.tiers = tiers;
        expect_matches(*f, o, {9, 33, 100, 3072},
                       fmt::format("{} group {} tiers {}", moe::rotation_layout_name(layout), group,
                                   static_cast<int>(tiers))
                           .c_str());
      }
    }
  }
}

// The grouped GEMM at every K and codebook (plain layout: any codebook), against the reference.
TEST(CudaMoe, PrefillGemmEveryKAndCodebook) {
  EXL3_REQUIRE_GPU();
  namespace tr = exl3::trellis;
  for (const auto cb : {tr::Codebook::k3Inst, tr::Codebook::kMcg, tr::Codebook::kMul1}) {
    for (const int K : {1, 2, 3, 4, 5, 6, 7, 8}) {
      const auto f = make_layer(moe::RotationLayout::kPlain, {}, K, 4, 1, 256, 256, cb);
      auto o = opts_for(600);
      o.prefill_group = 128;
      expect_matches(*f, o, {40, 600},
                     fmt::format("plain K{} {}", K, tr::codebook_name(cb)).c_str());
    }
  }
}

// Same split plan, same bits: the GEMM's sums are the GEMV's, product for product, per slot.
TEST(CudaMoe, PrefillGemmMatchesTheGemvBitForBit) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kSharedH, {3, 4, 4, 3, 3, 4, 3, 4}, 3, 8);
  auto rng = exl3::test::make_rng();
  const int64_t m = 2000;  // two full passes of 1000 tokens: one split each, whatever the group
  const auto r = random_routes(m, f->top_k, f->w.num_experts(), rng);
  const auto x = random_x(m * f->w.hidden, rng);
  std::vector<std::vector<float>> outs;
  for (const int64_t group : {32, 128}) {
    auto o = opts_for(2000, 1000);
    o.prefill_group = group;
    const MoeLayerCuda L(f->w, f->top_k, o);
    const auto plan = L.plan(m);
    ASSERT_EQ(plan.full.count, 2);
    ASSERT_EQ(plan.full.group, group);
    ASSERT_EQ(plan.full.split_fc1, 1);
    ASSERT_EQ(plan.full.split_fc2, 1);
    outs.push_back(run_gpu(L, x, r));
  }
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4), 0);
}

TEST(CudaMoe, RankSlicedTp2Rank0AndPlainCheckpoint) {
  EXL3_REQUIRE_GPU();
  // Rank 0 of a TP-2 slice (I_loc = 128) and a plain exllamav3-style layer.
  expect_matches(*make_layer(moe::RotationLayout::kSharedH, {}, 3, 8, 2), opts_for(64), {1, 5, 64},
                 "tp2 rank0");
  expect_matches(*make_layer(moe::RotationLayout::kPlain, {}, 4, 4), opts_for(64), {1, 5, 64},
                 "plain");
}

TEST(CudaMoe, PrefillChunksAndLargerGeometry) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kSharedH, {}, 3, 16, 1, 512, 384);
  expect_matches(*f, opts_for(300, 64), {9, 100, 300}, "chunked prefill");
}

// Routes from both routers (Qwen3-MoE softmax top-k, DeepSeek-V3/GLM sigmoid + correction bias
// + grouped top-k + routed scaling) on random router logits.
TEST(CudaMoe, RoutesFromSoftmaxAndSigmoidGroupedRouters) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kSharedH, {3, 4, 4, 3, 3, 4, 3, 4}, 3, 8);
  const MoeLayerCuda L(f->w, f->top_k, opts_for(64));
  auto rng = exl3::test::make_rng();
  std::normal_distribution<float> nd;
  std::vector<float> bias(8);
  for (auto& b : bias) b = 0.5f * nd(rng);
  for (int64_t m : {1, 8, 33}) {
    std::vector<float> logits(static_cast<size_t>(m * 8));
    for (auto& v : logits) v = nd(rng);
    moe::SoftmaxRouting sr;
    sr.top_k = 2;
    moe::SigmoidGroupedRouting gr;
    gr.top_k = 2;
    gr.n_group = 2;
    gr.topk_group = 1;
    gr.routed_scaling_factor = 2.5f;
    gr.correction_bias = bias;
    for (const auto& r :
         {moe::route_softmax(logits, m, 8, sr), moe::route_sigmoid_grouped(logits, m, 8, gr)}) {
      const auto x = random_x(m * f->w.hidden, rng);
      std::vector<float> ref(x.size());
      moe::moe_forward(f->w, r, x.data(), m, ref.data());
      const auto got = run_gpu(L, x, r);
      EXPECT_LE(exl3::test::rel_l2(std::span<const float>(got), std::span<const float>(ref)), 1e-3)
          << "m=" << m;
    }
  }
}

TEST(CudaMoe, AllRoutesOnOneExpertAndIdleExperts) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kSharedH, {3, 4, 3, 4, 3, 4, 3, 4}, 3, 8);
  const MoeLayerCuda L(f->w, f->top_k, opts_for(200));
  auto rng = exl3::test::make_rng();
  for (int64_t m : {1, 7, 200}) {
    moe::TopK r;
    r.m = m;
    r.k = 2;
    for (int64_t t = 0; t < m; ++t) {
      r.ids.insert(r.ids.end(), {5, 2});  // experts 0, 1, 3, 4, 6, 7 get nothing
      r.weights.insert(r.weights.end(), {0.7f, 0.3f});
    }
    const auto x = random_x(m * f->w.hidden, rng);
    std::vector<float> ref(x.size());
    moe::moe_forward(f->w, r, x.data(), m, ref.data());
    const auto got = run_gpu(L, x, r);
    EXPECT_LE(exl3::test::rel_l2(std::span<const float>(got), std::span<const float>(ref)), 1e-3)
        << "m=" << m;
  }
}

TEST(CudaMoe, InvalidIdsContributeNothing) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kPerExpert, {}, 3, 8);
  const MoeLayerCuda L(f->w, f->top_k, opts_for(64));
  auto rng = exl3::test::make_rng();
  for (int64_t m : {4, 40}) {
    auto r = random_routes(m, 2, 8, rng);
    const auto x = random_x(m * f->w.hidden, rng);
    auto valid = r;
    for (int64_t t = 0; t < m; t += 3) {
      r.ids[static_cast<size_t>(2 * t + 1)] = (t % 2) ? -1 : 8;  // out of range: skipped
      valid.weights[static_cast<size_t>(2 * t + 1)] = 0.0f;
    }
    for (int64_t t = 1; t < m; t += 5) {  // no valid route at all: the token's output is zero
      r.ids[static_cast<size_t>(2 * t)] = -1;
      r.ids[static_cast<size_t>(2 * t + 1)] = 8;
      valid.weights[static_cast<size_t>(2 * t)] = 0.0f;
      valid.weights[static_cast<size_t>(2 * t + 1)] = 0.0f;
    }
    std::vector<float> ref(x.size());
    moe::moe_forward(f->w, valid, x.data(), m, ref.data());
    const auto got = run_gpu(L, x, r);
    EXPECT_LE(exl3::test::rel_l2(std::span<const float>(got), std::span<const float>(ref)), 1e-3)
        << "m=" << m;
  }
}

TEST(CudaMoe, GraphReplayBitIdenticalAtEveryDecodeM) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kSharedH, {3, 4, 4, 3, 3, 4, 3, 4}, 3, 8);
  auto o = opts_for(96, 40);
  const MoeLayerCuda L(f->w, f->top_k, o);
  auto rng = exl3::test::make_rng();
  for (int64_t m = 1; m <= o.decode_max_m + 1; ++m) {
    const auto r = random_routes(m, 2, 8, rng);
    cudaGraphExec_t g;
    EXPECT_NO_THROW(run_gpu(L, random_x(m * f->w.hidden, rng), r, &g)) << "m=" << m;
  }
  cudaGraphExec_t g;
  EXPECT_NO_THROW(run_gpu(L, random_x(96 * f->w.hidden, rng), random_routes(96, 2, 8, rng), &g))
      << "prefill";
}

TEST(CudaMoe, RunRejectsMOutsideThePlan) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kSharedH, {}, 3, 8);
  const MoeLayerCuda L(f->w, f->top_k, opts_for(16));
  const size_t arena_bytes = L.arena_bytes();
  const auto arena = slack_buffer<char>(arena_bytes);
  const auto buf = slack_buffer<float>(1 << 16);
  const auto ids = slack_buffer<int32_t>(64);
  EXPECT_EQ(L.run(buf.as<float>(), DType::kF32, ids.as<int32_t>(), buf.as<float>(), buf.as<float>(),
                  17, arena.get(), arena_bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(L.run(buf.as<float>(), DType::kF32, ids.as<int32_t>(), buf.as<float>(), buf.as<float>(),
                  0, arena.get(), arena_bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(L.run(buf.as<float>(), DType::kF32, ids.as<int32_t>(), buf.as<float>(), buf.as<float>(),
                  4, arena.get(), arena_bytes - 1, nullptr),
            cudaErrorInvalidValue);
}

TEST(CudaMoe, OptionsFailClosed) {
  EXL3_REQUIRE_GPU();
  const auto f = make_layer(moe::RotationLayout::kSharedH, {}, 3, 8);
  EXPECT_THAT(exl3::test::error_of([&] { MoeLayerCuda L(f->w, 2, MoeOptions{}); }),
              testing::HasSubstr("refusing to guess a capacity"));
  EXPECT_THAT(exl3::test::error_of([&] { MoeLayerCuda L(f->w, 9, opts_for(4)); }),
              testing::HasSubstr("top_k 9"));
  auto o = opts_for(64);
  o.prefill_group = 64;
  EXPECT_THAT(exl3::test::error_of([&] { MoeLayerCuda L(f->w, 2, o); }),
              testing::HasSubstr("prefill_group 64"));
}

TEST(CudaMoe, SharedHStaysOneRowOnTheDevice) {
  EXL3_REQUIRE_GPU();
  const auto s = make_layer(moe::RotationLayout::kSharedH, {}, 3, 8);
  const auto p = make_layer(moe::RotationLayout::kPerExpert, {}, 3, 8);
  const MoeLayerCuda ls(s->w, 2, opts_for(8)), lp(p->w, 2, opts_for(8));
  // Per-expert stores 3 hidden-side rows per expert, shared-H 3 per layer: (E - 1) * 3 * H * 2.
  EXPECT_EQ(lp.device_bytes() - ls.device_bytes(), static_cast<size_t>(7 * 3 * 256 * 2));
}

}  // namespace
