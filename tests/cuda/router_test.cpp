// The fused decode router (cuda::route_decode): logits against fp64, the selection equal to the
// CPU routers (exl3::moe) run on the same logits, softmax and sigmoid-grouped (with correction
// bias, groups and scaling), up to 1024 experts; outputs poisoned first; a token's logits and
// routes bit-identical alone and in a batch; the counter left zero; graph replay equal to eager.
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/moe/router.hpp"
#include "require_gpu.hpp"

namespace {

namespace cu = exl3::cuda;
using cu::DeviceBuffer;

struct Case {
  int experts, top_k, hidden;
  bool grouped;
  int n_group = 1, topk_group = 1;
  bool logit_bias = false;  // softmax only: the bias joins the logits (gpt-oss's router)
};

class Router {
 public:
  Router(const Case& c, int64_t m, std::mt19937_64& rng)
      : Router(c, random(static_cast<size_t>(m * c.hidden), 1.0f, rng),
               random(static_cast<size_t>(c.experts) * c.hidden, 0.05f, rng),
               random(static_cast<size_t>(c.experts), 0.1f, rng)) {}
  Router(const Case& c, std::vector<float> x, std::vector<float> w, std::vector<float> bias)
      : c_(c),
        m_(static_cast<int64_t>(x.size()) / c.hidden),
        x_(std::move(x)),
        w_(std::move(w)),
        bias_(std::move(bias)) {
    const int64_t m = m_;
    dx_ = DeviceBuffer::upload(x_, "x");
    dw_ = DeviceBuffer::upload(w_, "w");
    dbias_ = DeviceBuffer::upload(bias_, "bias");
    logits_ = DeviceBuffer(static_cast<size_t>(m * c.experts) * 4, "logits");
    ids_ = DeviceBuffer(static_cast<size_t>(m * c.top_k) * 4, "ids");
    wts_ = DeviceBuffer(static_cast<size_t>(m * c.top_k) * 4, "weights");
    counter_ = DeviceBuffer(4, "counter");
    EXL3_CUDA_CHECK(cudaMemset(counter_.get(), 0, 4), "zero counter");
    p_.num_experts = c.experts;
    p_.top_k = c.top_k;
    p_.sigmoid_grouped = c.grouped;
    p_.n_group = c.n_group;
    p_.topk_group = c.topk_group;
    p_.routed_scaling_factor = c.grouped ? 2.5f : 1.0f;
    p_.correction_bias = c.grouped ? dbias_.as<float>() : nullptr;
    p_.logit_bias = c.logit_bias ? dbias_.as<float>() : nullptr;
  }

  void poison() {
    EXL3_CUDA_CHECK(cudaMemset(logits_.get(), 0xFF, logits_.bytes()), "poison logits");
    EXL3_CUDA_CHECK(cudaMemset(ids_.get(), 0xFF, ids_.bytes()), "poison ids");
    EXL3_CUDA_CHECK(cudaMemset(wts_.get(), 0xFF, wts_.bytes()), "poison weights");
  }
  cudaError_t launch(cudaStream_t s) {
    return cu::route_decode(dx_.as<float>(), dw_.as<float>(), m_, c_.hidden, p_,
                            logits_.as<float>(), counter_.as<int32_t>(), ids_.as<int32_t>(),
                            wts_.as<float>(), s);
  }
  void run() {
    poison();
    EXL3_CUDA_CHECK(launch(nullptr), "route_decode");
    EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "sync");
  }
  template <typename T>
  static std::vector<T> down(const DeviceBuffer& b) {
    std::vector<T> h(b.bytes() / sizeof(T));
    EXL3_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  std::vector<float> logits() const { return down<float>(logits_); }
  std::vector<int32_t> ids() const { return down<int32_t>(ids_); }
  std::vector<float> weights() const { return down<float>(wts_); }
  int32_t counter() const { return down<int32_t>(counter_)[0]; }
  double logit_fp64(int64_t t, int e) const {
    double s = 0.0;
    for (int i = 0; i < c_.hidden; ++i) {
      s += static_cast<double>(x_[static_cast<size_t>(t * c_.hidden + i)]) *
           w_[static_cast<size_t>(e) * c_.hidden + i];
    }
    return s;
  }
  exl3::moe::TopK cpu_route(const std::vector<float>& logits) const {
    if (!c_.grouped) {  // route_decode's logits leave the bias out; the CPU router adds it
      std::vector<float> biased = logits;
      for (size_t i = 0; c_.logit_bias && i < biased.size(); ++i)
        biased[i] += bias_[i % static_cast<size_t>(c_.experts)];
      return exl3::moe::route_softmax(biased, m_, c_.experts, {c_.top_k, true});
    }
    exl3::moe::SigmoidGroupedRouting r;
    r.top_k = c_.top_k;
    r.n_group = c_.n_group;
    r.topk_group = c_.topk_group;
    r.routed_scaling_factor = p_.routed_scaling_factor;
    r.correction_bias = bias_;
    return exl3::moe::route_sigmoid_grouped(logits, m_, c_.experts, r);
  }
  const std::vector<float>& x() const { return x_; }
  const std::vector<float>& w() const { return w_; }
  const std::vector<float>& bias() const { return bias_; }

  static std::vector<float> random(size_t n, float scale, std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = scale * nd(rng);
    return v;
  }

 private:
  Case c_;
  int64_t m_;
  std::vector<float> x_, w_, bias_;
  DeviceBuffer dx_, dw_, dbias_, logits_, ids_, wts_, counter_;
  cu::RouterParams p_;
};

const Case kCases[] = {
    {128, 8, 2048, false},              // Qwen3-30B-A3B
    {256, 8, 1024, true, 8, 4},         // DeepSeek-V3-style grouped, smaller H
    {1024, 32, 512, true, 32, 8},       // the kernel's widest case
    {64, 2, 4096, false},               // Mixtral-like top-2
    {128, 4, 2880, false, 1, 1, true},  // gpt-oss-120b: top-4 with the router's bias
};

TEST(CudaRouter, DecodeMatchesCpuRouting) {
  EXL3_REQUIRE_GPU();
  std::mt19937_64 rng(20261202);
  for (const Case& c : kCases) {
    for (const int64_t m :
         {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{9}, cu::kRouteDecodeMaxTokens}) {
      SCOPED_TRACE(testing::Message() << "E=" << c.experts << " k=" << c.top_k << " m=" << m);
      Router r(c, m, rng);
      r.run();
      const auto logits = r.logits();
      double err = 0.0, ref = 0.0;
      for (int64_t t = 0; t < m; ++t) {
        for (int e = 0; e < c.experts; ++e) {
          const double want = r.logit_fp64(t, e);
          const double got = logits[static_cast<size_t>(t * c.experts + e)];
          ASSERT_TRUE(std::isfinite(got));
          err += (got - want) * (got - want);
          ref += want * want;
        }
      }
      EXPECT_LT(std::sqrt(err / ref), 1e-6);
      // The selection is the CPU router's on the same logits, ids exactly.
      const auto want = r.cpu_route(logits);
      EXPECT_EQ(r.ids(), want.ids);
      const auto wts = r.weights();
      for (size_t i = 0; i < wts.size(); ++i) EXPECT_NEAR(wts[i], want.weights[i], 2e-6f) << i;
      EXPECT_EQ(r.counter(), 0);
    }
  }
}

TEST(CudaRouter, TokenBitsDoNotDependOnBatch) {
  EXL3_REQUIRE_GPU();
  std::mt19937_64 rng(7);
  const Case c = kCases[1];
  Router batch(c, cu::kRouteDecodeMaxTokens, rng);
  batch.run();
  const auto logits = batch.logits();
  const auto ids = batch.ids();
  const auto wts = batch.weights();
  for (const int64_t t : {int64_t{0}, int64_t{17}, cu::kRouteDecodeMaxTokens - 1}) {
    SCOPED_TRACE(t);
    std::vector<float> row(batch.x().begin() + t * c.hidden,
                           batch.x().begin() + (t + 1) * c.hidden);
    Router alone(c, row, batch.w(), batch.bias());
    alone.run();
    EXPECT_EQ(0, std::memcmp(alone.logits().data(), logits.data() + t * c.experts,
                             static_cast<size_t>(c.experts) * 4));
    const auto k = static_cast<size_t>(c.top_k);
    EXPECT_EQ(alone.ids(),
              std::vector<int32_t>(ids.begin() + t * c.top_k, ids.begin() + t * c.top_k + c.top_k));
    EXPECT_EQ(0, std::memcmp(alone.weights().data(), wts.data() + t * c.top_k, k * 4));
  }
}

TEST(CudaRouter, GraphReplayEqualsEagerAndRejectsLargeBatches) {
  EXL3_REQUIRE_GPU();
  std::mt19937_64 rng(11);
  Router r(kCases[0], 8, rng);
  r.run();
  const auto logits = r.logits();
  const auto ids = r.ids();
  const auto wts = r.weights();
  cudaStream_t stream = nullptr;
  EXL3_CUDA_CHECK(cudaStreamCreate(&stream), "stream");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXL3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  EXL3_CUDA_CHECK(r.launch(stream), "captured launch");
  EXL3_CUDA_CHECK(cudaStreamEndCapture(stream, &graph), "end capture");
  EXL3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int i = 0; i < 3; ++i) {
    r.poison();
    EXL3_CUDA_CHECK(cudaGraphLaunch(exec, stream), "replay");
    EXL3_CUDA_CHECK(cudaStreamSynchronize(stream), "sync");
    EXPECT_EQ(0, std::memcmp(r.logits().data(), logits.data(), logits.size() * 4));
    EXPECT_EQ(r.ids(), ids);
    EXPECT_EQ(0, std::memcmp(r.weights().data(), wts.data(), wts.size() * 4));
    EXPECT_EQ(r.counter(), 0);
  }
  EXL3_CUDA_CHECK(cudaGraphExecDestroy(exec), "destroy exec");
  EXL3_CUDA_CHECK(cudaGraphDestroy(graph), "destroy graph");
  EXL3_CUDA_CHECK(cudaStreamDestroy(stream), "destroy stream");

  Router big(kCases[0], cu::kRouteDecodeMaxTokens + 1, rng);
  EXPECT_EQ(big.launch(nullptr), cudaErrorInvalidValue);
}

}  // namespace
