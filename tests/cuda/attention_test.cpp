// Paged decode attention (cuda::attention_decode) against an fp64 CPU softmax(q K^T) V over the
// same fp16 cache: GQA head groups of 4, 2 and 1, head dims 64 and 128, contexts from 1 key to
// many splits (pages shuffled so no sequence is contiguous), NaN-poisoned outputs; the split-KV
// path equal to the one-block path within rounding; every token's output bit-identical whether
// it runs alone or in a batch; a captured graph replayed (counters left zero) equal to eager.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/trellis/half.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace {

namespace cu = exl3::cuda;
namespace tr = exl3::trellis;
using cu::DeviceBuffer;

struct Case {
  int heads, kv_heads, head_dim;
  std::vector<int32_t> positions;  // one decode token per sequence, at this position
  int window = 0;                  // sliding window (0: every earlier position)
  bool sinks = false;              // a sink logit per head (gpt-oss)
};

// A random cache of `seqs` sequences with their pages dealt in shuffled order, random q, and the
// device copies; reference() is the fp64 attention of token i.
class Fixture {
 public:
  Fixture(const Case& c, std::mt19937_64& rng) : c_(c) {
    const int seqs = static_cast<int>(c.positions.size());
    const int32_t longest = *std::max_element(c.positions.begin(), c.positions.end()) + 1;
    max_pages_ = (longest + kPage - 1) / kPage;
    const int pages = seqs * max_pages_;
    std::vector<int32_t> order(static_cast<size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    tables_ = order;  // row r owns order[r * max_pages ..]
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const size_t row = static_cast<size_t>(c.kv_heads * c.head_dim);
    k_.resize(static_cast<size_t>(pages * kPage) * row);
    v_.resize(k_.size());
    for (auto& x : k_) x = tr::float_to_half(nd(rng));
    for (auto& x : v_) x = tr::float_to_half(nd(rng));
    q_.resize(static_cast<size_t>(seqs * c.heads * c.head_dim));
    for (auto& x : q_) x = nd(rng);
    // Sinks from below to well above the scores (|score| is a few units here).
    if (c.sinks) {
      for (int h = 0; h < c.heads; ++h) sinks_.push_back(3.0f * nd(rng));
      dsinks_ = DeviceBuffer::upload(sinks_, "sinks");
    }
    for (int i = 0; i < seqs; ++i) {
      tokens_.push_back(i);
      rows_.push_back(i);
    }
    dk_ = DeviceBuffer::upload(k_, "k");
    dv_ = DeviceBuffer::upload(v_, "v");
    dq_ = DeviceBuffer::upload(q_, "q");
    dtables_ = DeviceBuffer::upload(tables_, "tables");
    dpos_ = DeviceBuffer::upload(c.positions, "pos");
    drows_ = DeviceBuffer::upload(rows_, "rows");
    dout_ = DeviceBuffer(q_.size() * 4, "out");
  }

  cu::AttnShape shape() const {
    return {c_.heads, c_.kv_heads, c_.head_dim, c_.head_dim / 2, c_.window, dsinks_.as<float>()};
  }
  cu::PagedKv kv() const {
    return {dk_.as<uint16_t>(), dv_.as<uint16_t>(), dtables_.as<int32_t>(), max_pages_, kPage};
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(c_.head_dim)); }

  // Output of the listed tokens (their rows of the [seqs, heads, hd] output), poisoned first.
  std::vector<float> run(const std::vector<int32_t>& list, bool split,
                         cudaStream_t stream = nullptr) {
    DeviceBuffer dlist = DeviceBuffer::upload(list, "list");
    const auto count = static_cast<int64_t>(list.size());
    const size_t ws_bytes = cu::attention_decode_workspace_bytes(count, shape(), kv());
    DeviceBuffer ws(ws_bytes, "ws");
    if (ws_bytes > 0) EXL3_CUDA_CHECK(cudaMemset(ws.get(), 0, ws_bytes), "zero");
    poison();
    EXL3_CUDA_CHECK(launch(dlist.as<int32_t>(), count, split ? ws.get() : nullptr,
                           split ? ws_bytes : 0, stream),
                    "attention_decode");
    EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "sync");
    if (ws_bytes > 0) expect_counters_zero(ws, counter_bytes());
    return download();
  }

  cudaError_t launch(const int32_t* list, int64_t count, void* ws, size_t ws_bytes,
                     cudaStream_t stream) {
    return cu::attention_decode(dq_.as<float>(), list, count, meta(), shape(), scale(), kv(), ws,
                                ws_bytes, dout_.as<float>(), stream);
  }

  std::vector<double> reference(int i) const {
    const int hd = c_.head_dim, qpk = c_.heads / c_.kv_heads;
    const int keys = c_.positions[static_cast<size_t>(i)] + 1;
    const int first = c_.window > 0 ? std::max(0, keys - c_.window) : 0;  // the window's start
    std::vector<double> out(static_cast<size_t>(c_.heads * hd));
    for (int h = 0; h < c_.heads; ++h) {
      const int kvh = h / qpk;
      std::vector<double> sc(static_cast<size_t>(keys), -1e300);
      // A sink joins the max and the denominator and weighs no value.
      const double sink = c_.sinks ? sinks_[static_cast<size_t>(h)] : -1e300;
      double mx = sink;
      for (int j = first; j < keys; ++j) {
        const size_t base =
            slot(i, j) * static_cast<size_t>(c_.kv_heads * hd) + static_cast<size_t>(kvh * hd);
        double d = 0;
        for (int x = 0; x < hd; ++x) {
          d += static_cast<double>(q_[(static_cast<size_t>(i * c_.heads + h)) * hd + x] * scale()) *
               tr::half_to_float(k_[base + x]);
        }
        sc[static_cast<size_t>(j)] = d;
        mx = std::max(mx, d);
      }
      double den = c_.sinks ? std::exp(sink - mx) : 0.0;
      for (auto& s : sc) den += (s = std::exp(s - mx));
      for (int j = first; j < keys; ++j) {
        const size_t base =
            slot(i, j) * static_cast<size_t>(c_.kv_heads * hd) + static_cast<size_t>(kvh * hd);
        for (int x = 0; x < hd; ++x) {
          out[static_cast<size_t>(h * hd + x)] +=
              sc[static_cast<size_t>(j)] / den * tr::half_to_float(v_[base + x]);
        }
      }
    }
    return out;
  }

  size_t token_floats() const { return static_cast<size_t>(c_.heads * c_.head_dim); }
  cu::TokenMeta meta() const { return {dpos_.as<int32_t>(), drows_.as<int32_t>()}; }
  float* out() { return dout_.as<float>(); }
  void poison() {
    EXL3_CUDA_CHECK(cudaMemset(dout_.get(), 0xFF, dout_.bytes()), "poison");  // NaN
  }
  std::vector<float> download() {
    std::vector<float> h(q_.size());
    EXL3_CUDA_CHECK(cudaMemcpy(h.data(), dout_.get(), dout_.bytes(), cudaMemcpyDeviceToHost),
                    "download");
    return h;
  }
  // The counters lead the workspace, whose size is counters + count * per-token states: their
  // bytes are 2 * size(1) - size(2).
  size_t counter_bytes() const {
    return 2 * cu::attention_decode_workspace_bytes(1, shape(), kv()) -
           cu::attention_decode_workspace_bytes(2, shape(), kv());
  }
  static void expect_counters_zero(const DeviceBuffer& ws, size_t bytes) {
    ASSERT_GT(bytes, 0u);
    ASSERT_LE(bytes, ws.bytes());
    std::vector<int32_t> c(bytes / 4);
    EXL3_CUDA_CHECK(cudaMemcpy(c.data(), ws.get(), bytes, cudaMemcpyDeviceToHost), "counters");
    for (const int32_t v : c) ASSERT_EQ(v, 0) << "a completion counter was left non-zero";
  }

 private:
  static constexpr int kPage = 16;
  size_t slot(int seq, int pos) const {
    return static_cast<size_t>(tables_[static_cast<size_t>(seq * max_pages_ + pos / kPage)]) *
               kPage +
           static_cast<size_t>(pos % kPage);
  }
  Case c_;
  int32_t max_pages_ = 0;
  std::vector<int32_t> tables_, tokens_, rows_;
  std::vector<uint16_t> k_, v_;
  std::vector<float> q_, sinks_;
  DeviceBuffer dk_, dv_, dq_, dtables_, dpos_, drows_, dout_, dsinks_;
};

std::vector<float> token_rows(const std::vector<float>& all, size_t per, int i) {
  return {all.begin() + static_cast<std::ptrdiff_t>(per * static_cast<size_t>(i)),
          all.begin() + static_cast<std::ptrdiff_t>(per * static_cast<size_t>(i + 1))};
}

std::vector<int32_t> every_token(const Case& c) {
  std::vector<int32_t> all(c.positions.size());
  std::iota(all.begin(), all.end(), 0);
  return all;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {8, 2, 128, {0, 31, 32, 63, 64, 130, 700, 2047}},  // G = 4
      {4, 2, 64, {5, 96, 257, 1500}},                    // G = 2
      {6, 2, 128, {1, 40, 333, 999}},                    // 3 heads per kv head: G = 1
      {16, 16, 64, {17, 600}},                           // MHA
      // Sliding windows: shorter than one split, across splits, longer than the context.
      {8, 2, 128, {0, 40, 130, 700, 2047}, 100},
      {4, 2, 64, {5, 257, 1500}, 1000},
      {4, 1, 32, {3, 31, 90}, 8},  // head_dim 32 (the small test models), 4 heads per kv head
      {8, 4, 256, {2, 64, 300, 900}, 0},  // head_dim 256 (Gemma 3), G = 2
      {4, 1, 256, {150, 1200}, 512},      // head_dim 256, G = 4, windowed
      // Sinks (gpt-oss): one block, split contexts, and windows.
      {8, 2, 64, {0, 31, 700, 2047}, 0, true},
      {4, 2, 64, {5, 257, 1500}, 128, true},
      {4, 2, 32, {3, 90}, 8, true},
  };
  return c;
}

TEST(CudaAttention, DecodeMatchesFp64AcrossContextsAndGroups) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  for (const Case& c : cases()) {
    Fixture f(c, rng);
    const std::vector<int32_t> all = every_token(c);
    const auto split = f.run(all, true);
    const auto whole = f.run(all, false);
    for (int i = 0; i < static_cast<int>(all.size()); ++i) {
      const auto ref = f.reference(i);
      const auto s = token_rows(split, f.token_floats(), i),
                 w = token_rows(whole, f.token_floats(), i);
      for (size_t x = 0; x < ref.size(); ++x) {
        ASSERT_TRUE(std::isfinite(s[x]) && std::isfinite(w[x]))
            << "heads " << c.heads << " token " << i;
        ASSERT_NEAR(s[x], ref[x], 2e-5)
            << "split path, heads " << c.heads << " pos " << c.positions[i];
        ASSERT_NEAR(w[x], ref[x], 2e-5)
            << "one-block path, heads " << c.heads << " pos " << c.positions[i];
      }
    }
  }
}

TEST(CudaAttention, DecodeTokenBitsDoNotDependOnTheBatch) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  const Case& c = cases()[0];
  Fixture f(c, rng);
  const std::vector<int32_t> all = every_token(c);
  std::vector<int32_t> reversed(all.rbegin(), all.rend());
  const auto together = f.run(all, true);
  const auto backwards = f.run(reversed, true);
  EXPECT_EQ(together, backwards);
  for (const int32_t i : all) {
    const auto alone = f.run({i}, true);
    EXPECT_EQ(token_rows(alone, f.token_floats(), i), token_rows(together, f.token_floats(), i))
        << "token " << i;
  }
}

TEST(CudaAttention, DecodeGraphReplayEqualsEager) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  const Case& c = cases()[0];
  Fixture f(c, rng);
  const std::vector<int32_t> all = every_token(c);
  const auto eager = f.run(all, true);

  DeviceBuffer dlist = DeviceBuffer::upload(all, "list");
  const auto count = static_cast<int64_t>(all.size());
  const size_t ws_bytes = cu::attention_decode_workspace_bytes(count, f.shape(), f.kv());
  ASSERT_GT(ws_bytes, 0u) << "this case must take the split path";
  DeviceBuffer ws(ws_bytes, "ws");
  EXL3_CUDA_CHECK(cudaMemset(ws.get(), 0, ws_bytes), "zero");
  cudaStream_t stream = nullptr;
  EXL3_CUDA_CHECK(cudaStreamCreate(&stream), "stream");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXL3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  EXL3_CUDA_CHECK(f.launch(dlist.as<int32_t>(), count, ws.get(), ws_bytes, stream),
                  "captured launch");
  EXL3_CUDA_CHECK(cudaStreamEndCapture(stream, &graph), "end capture");
  EXL3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < 3; ++rep) {
    f.poison();
    EXL3_CUDA_CHECK(cudaGraphLaunch(exec, stream), "replay");
    EXL3_CUDA_CHECK(cudaStreamSynchronize(stream), "sync");
    EXPECT_EQ(f.download(), eager) << "replay " << rep;
    Fixture::expect_counters_zero(ws, f.counter_bytes());
  }
  EXL3_CUDA_CHECK(cudaGraphExecDestroy(exec), "destroy exec");
  EXL3_CUDA_CHECK(cudaGraphDestroy(graph), "destroy graph");
  EXL3_CUDA_CHECK(cudaStreamDestroy(stream), "destroy stream");
}

TEST(CudaAttention, DecodeRejectsBadShapes) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  Fixture f(cases()[1], rng);
  const cu::AttnShape bad_dim{4, 2, 96, 48}, bad_groups{5, 2, 64, 32}, bad_window{4, 2, 64, 32, -1};
  DeviceBuffer dlist = DeviceBuffer::upload(std::vector<int32_t>{0}, "list");
  for (const auto& s : {bad_dim, bad_groups, bad_window}) {
    EXPECT_EQ(cu::attention_decode(nullptr, dlist.as<int32_t>(), 1, f.meta(), s, 1.0f, f.kv(),
                                   nullptr, 0, f.out(), nullptr),
              cudaErrorInvalidValue);
  }
}

}  // namespace
