// The fixture of the paged attention tests (attention_test.cpp for decode,
// attention_prefill_test.cpp for prefill): a random fp16 cache with shuffled pages, random queries,
// and an fp64 reference of softmax(q K^T) V with windows and sinks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3::test::attention {

namespace cu = exl3::cuda;
namespace tr = exl3::trellis;
using cu::DeviceBuffer;

struct Case {
  int heads, kv_heads, head_dim;
  std::vector<int32_t> positions;  // sequence i's last position (decode: its one token's)
  int window = 0;                  // sliding window (0: every earlier position)
  bool sinks = false;              // a sink logit per head (gpt-oss)
};

// A query token: position `pos` of sequence `seq`.
struct Query {
  int seq, pos;
};

// A random cache of `seqs` sequences (sequence i holds positions 0..c.positions[i]) with their
// pages dealt in shuffled order, random q for the query tokens (by default one per sequence, at
// its last position: a decode step), and the device copies; reference() is the fp64 attention of
// query i.
class Fixture {
 public:
  Fixture(const Case& c, std::mt19937_64& rng, std::vector<Query> queries = {})
      : c_(c), queries_(std::move(queries)) {
    const int seqs = static_cast<int>(c.positions.size());
    if (queries_.empty()) {
      for (int i = 0; i < seqs; ++i) queries_.push_back({i, c.positions[static_cast<size_t>(i)]});
    }
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
    q_.resize(queries_.size() * static_cast<size_t>(c.heads * c.head_dim));
    for (auto& x : q_) x = nd(rng);
    // Sinks from below to well above the scores (|score| is a few units here).
    if (c.sinks) {
      for (int h = 0; h < c.heads; ++h) sinks_.push_back(3.0f * nd(rng));
      dsinks_ = DeviceBuffer::upload(sinks_, "sinks");
    }
    for (const Query& x : queries_) {
      rows_.push_back(x.seq);
      pos_.push_back(x.pos);
    }
    dk_ = DeviceBuffer::upload(k_, "k");
    dv_ = DeviceBuffer::upload(v_, "v");
    dq_ = DeviceBuffer::upload(q_, "q");
    dtables_ = DeviceBuffer::upload(tables_, "tables");
    dpos_ = DeviceBuffer::upload(pos_, "pos");
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
    const int seq = queries_[static_cast<size_t>(i)].seq;
    const int keys = queries_[static_cast<size_t>(i)].pos + 1;
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
            slot(seq, j) * static_cast<size_t>(c_.kv_heads * hd) + static_cast<size_t>(kvh * hd);
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
            slot(seq, j) * static_cast<size_t>(c_.kv_heads * hd) + static_cast<size_t>(kvh * hd);
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
  const float* q() const { return dq_.as<float>(); }
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
  std::vector<Query> queries_;
  int32_t max_pages_ = 0;
  std::vector<int32_t> tables_, rows_, pos_;
  std::vector<uint16_t> k_, v_;
  std::vector<float> q_, sinks_;
  DeviceBuffer dk_, dv_, dq_, dtables_, dpos_, drows_, dout_, dsinks_;
};

// One launch captured on a stream of its own and instantiated; replay() runs the graph and waits.
// `launch(stream)` returns the launch's cudaError_t. The capture is ended before a failed
// launch is reported, so no capture is left open behind the test.
class CapturedGraph {
 public:
  template <typename Launch>
  explicit CapturedGraph(Launch&& launch) {
    EXL3_CUDA_CHECK(cudaStreamCreate(&stream_), "stream");
    EXL3_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "capture");
    const cudaError_t launched = launch(stream_);
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph_);
    EXL3_CUDA_CHECK(launched, "captured launch");
    EXL3_CUDA_CHECK(ended, "end capture");
    EXL3_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0), "instantiate");
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_ != nullptr) {
      EXPECT_EQ(cudaGraphExecDestroy(exec_), cudaSuccess) << "destroy exec";
    }
    if (graph_ != nullptr) {
      EXPECT_EQ(cudaGraphDestroy(graph_), cudaSuccess) << "destroy graph";
    }
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess) << "destroy stream";
    }
  }
  void replay() {
    EXL3_CUDA_CHECK(cudaGraphLaunch(exec_, stream_), "replay");
    EXL3_CUDA_CHECK(cudaStreamSynchronize(stream_), "sync");
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

inline std::vector<float> token_rows(const std::vector<float>& all, size_t per, int i) {
  return {all.begin() + static_cast<std::ptrdiff_t>(per * static_cast<size_t>(i)),
          all.begin() + static_cast<std::ptrdiff_t>(per * static_cast<size_t>(i + 1))};
}

inline std::vector<int32_t> every_token(const Case& c) {
  std::vector<int32_t> all(c.positions.size());
  std::iota(all.begin(), all.end(), 0);
  return all;
}

}  // namespace exl3::test::attention
