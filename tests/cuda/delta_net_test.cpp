// The gated DeltaNet kernels (cuda::delta_net_forward) against the host reference
// (runtime::delta_net_forward) on random weights and inputs, both input layouts: two sequences
// in slots out of order, a multi-token run beside a one-token run, then steps that continue both
// (the convolution window across steps, runs shorter than the window, a decode step, runs of
// several chunks), outputs and every state float compared; outputs poisoned first. Then the gates
// of the hybrid stacks (query / gate split, sigmoid gate with a per-channel and a broadcast
// gate).
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cpu/activation.hpp"
#include "exl3/cuda/delta_net.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/runtime/delta_net.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace {

namespace cu = exl3::cuda;
using cu::DeviceBuffer;
using exl3::model::GatedDeltaNetSpec;
using exl3::runtime::DeltaNetInputs;
using exl3::runtime::DeltaNetState;
using exl3::runtime::DeltaNetWeights;

std::vector<float> random(size_t n, float scale, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> download(const DeviceBuffer& b, size_t n) {
  std::vector<float> v(n);
  EXL3_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * 4, cudaMemcpyDeviceToHost), "download");
  return v;
}

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Case {
  int nk, nv, dk, dv, taps;
  bool split;
};

class DeltaNetKernel : public ::testing::TestWithParam<Case> {};

TEST_P(DeltaNetKernel, MatchesTheHostReferenceAcrossSteps) {
  EXL3_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937_64 rng(exl3::test::test_seed());
  GatedDeltaNetSpec s;
  s.prefix = "layer";
  s.num_k_heads = c.nk;
  s.num_v_heads = c.nv;
  s.head_k_dim = c.dk;
  s.head_v_dim = c.dv;
  s.conv_kernel = c.taps;
  s.norm_eps = 1e-6;
  s.split_inputs = c.split;
  DeltaNetWeights w;
  w.spec = s;
  w.conv = random(static_cast<size_t>(s.conv_dim() * c.taps), 0.5f, rng);
  w.a = random(static_cast<size_t>(c.nv), 0.5f, rng);
  for (float& a : w.a) a = std::exp(a);
  w.dt_bias = random(static_cast<size_t>(c.nv), 0.5f, rng);
  w.norm = random(static_cast<size_t>(c.dv), 1.0f, rng);
  cu::DeltaNetShape sh{c.nk, c.nv, c.dk, c.dv, c.taps, 1e-6f, c.split};
  ASSERT_TRUE(cu::delta_net_supports(sh));
  // The inputs' widths per layout.
  std::vector<int64_t> widths;
  if (c.split) {
    widths = {s.conv_dim(), s.value_dim(), s.num_v_heads, s.num_v_heads};
  } else {
    widths = {s.qkvz_width(), s.ba_width()};
  }
  const DeviceBuffer dconv = DeviceBuffer::upload(w.conv, "conv");
  const DeviceBuffer da = DeviceBuffer::upload(w.a, "a");
  const DeviceBuffer ddt = DeviceBuffer::upload(w.dt_bias, "dt_bias");
  const DeviceBuffer dnorm = DeviceBuffer::upload(w.norm, "norm");
  const cu::DeltaNetWeightsDev dw{dconv.as<float>(), da.as<float>(), ddt.as<float>(),
                                  dnorm.as<float>()};
  // A pool of 3 slots with this layer after 5 floats of another: sequence 0 in slot 2, 1 in 0.
  const int64_t offset = 5, slot_floats = offset + sh.state_floats() + 3;
  DeviceBuffer pool = DeviceBuffer::of<float>(static_cast<size_t>(3 * slot_floats), "pool");
  EXL3_CUDA_CHECK(cudaMemset(pool.get(), 0, pool.bytes()), "zero pool");
  const int slots[2] = {2, 0};
  DeltaNetState ref[2] = {DeltaNetState(s), DeltaNetState(s)};
  // Step 1: 7 tokens of sequence 0, 1 of sequence 1; step 2: 1 token of 0, 2 of 1 (fewer than the
  // window), step 3: 9 tokens of 1 only (these by chunks of up to 32 tokens); step 4: one token
  // each (the decode kernel); step 5: 40 and 70 tokens (several chunks each).
  const std::vector<std::vector<int>> steps = {{7, 1}, {1, 2}, {0, 9}, {1, 1}, {40, 70}};
  for (size_t step = 0; step < steps.size(); ++step) {
    std::vector<int32_t> token_run, first, len, slot;
    std::vector<int> seqs;
    int64_t n = 0;
    for (int q = 0; q < 2; ++q) {
      const int l = steps[step][static_cast<size_t>(q)];
      if (l == 0) continue;
      first.push_back(static_cast<int32_t>(n));
      len.push_back(l);
      slot.push_back(slots[q]);
      seqs.push_back(q);
      for (int i = 0; i < l; ++i) token_run.push_back(static_cast<int32_t>(first.size() - 1));
      n += l;
    }
    std::vector<std::vector<float>> in;
    std::vector<DeviceBuffer> din;
    const float* inp[4] = {};
    for (size_t i = 0; i < widths.size(); ++i) {
      in.push_back(random(static_cast<size_t>(n * widths[i]), 1.0f, rng));
      din.push_back(DeviceBuffer::upload(in.back(), "inputs"));
      inp[i] = din.back().as<float>();
    }
    const DeviceBuffer dtr = DeviceBuffer::upload(token_run, "token_run");
    const DeviceBuffer dfirst = DeviceBuffer::upload(first, "first");
    const DeviceBuffer dlen = DeviceBuffer::upload(len, "len");
    const DeviceBuffer dslot = DeviceBuffer::upload(slot, "slot");
    const cu::DeltaNetRuns runs{dtr.as<int32_t>(), dfirst.as<int32_t>(), dlen.as<int32_t>(),
                                dslot.as<int32_t>(), static_cast<int>(first.size())};
    DeviceBuffer conv_ws = DeviceBuffer::of<float>(static_cast<size_t>(n * s.conv_dim()), "ws");
    const std::vector<float> poison(static_cast<size_t>(n * s.value_dim()),
                                    std::numeric_limits<float>::quiet_NaN());
    DeviceBuffer out = DeviceBuffer::upload(poison, "out");
    const cu::DeltaNetStatePool p{pool.as<float>(), slot_floats, offset};
    EXL3_CUDA_CHECK(cu::delta_net_forward(sh, dw, inp, n, runs, p, conv_ws.as<float>(),
                                          out.as<float>(), nullptr),
                    "delta_net_forward");
    EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "running the step");
    const std::vector<float> got = download(out, poison.size());
    const std::vector<float> states = download(pool, static_cast<size_t>(3 * slot_floats));
    for (size_t r = 0; r < first.size(); ++r) {
      const int q = seqs[r];
      DeltaNetInputs x;
      x.n = len[r];
      for (size_t i = 0; i < widths.size(); ++i) x.p[i] = in[i].data() + first[r] * widths[i];
      std::vector<float> want(static_cast<size_t>(len[r] * s.value_dim()));
      exl3::runtime::delta_net_forward(w, ref[q], x, want.data());
      const float* g = got.data() + first[r] * s.value_dim();
      const double e = rel_l2(g, want.data(), want.size());
      std::printf(
          "nk %d nv %d dk %d dv %d taps %d %s: step %zu sequence %d (%d tokens) rel-L2 %.2e\n",
          c.nk, c.nv, c.dk, c.dv, c.taps, c.split ? "split" : "qkvz", step, q, len[r], e);
      EXPECT_LE(e, 2e-5) << "step " << step << " sequence " << q;
      const float* st = states.data() + slots[q] * slot_floats + offset;
      EXPECT_LE(rel_l2(st, ref[q].s.data(), ref[q].s.size()), 2e-5) << "S, step " << step;
      if (!ref[q].conv.empty()) {
        EXPECT_EQ(rel_l2(st + ref[q].s.size(), ref[q].conv.data(), ref[q].conv.size()), 0.0)
            << "convolution window, step " << step;
      }
    }
  }
  // The other slot and the floats around the layer's part stay zero.
  const std::vector<float> states = download(pool, static_cast<size_t>(3 * slot_floats));
  for (int64_t i = 0; i < slot_floats; ++i)
    ASSERT_EQ(states[static_cast<size_t>(slot_floats + i)], 0.0f);
  for (const int q : slots) {
    for (int64_t i = 0; i < offset; ++i)
      ASSERT_EQ(states[static_cast<size_t>(q * slot_floats + i)], 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, DeltaNetKernel,
                         ::testing::Values(Case{2, 4, 32, 32, 4, false},  // the fixture's shape
                                           Case{2, 4, 32, 32, 4, true},
                                           Case{2, 4, 128, 128, 4, false},  // Qwen3-Next's heads
                                           Case{1, 2, 128, 128, 4, true},
                                           Case{3, 3, 64, 16, 2, false},
                                           Case{2, 2, 128, 64, 1, true},
                                           Case{1, 2, 128, 32, 3, false}));

TEST(DeltaNetKernel, UnsupportedShapesAreRefused) {
  EXPECT_FALSE(cu::delta_net_supports({2, 3, 128, 128, 4, 1e-6f, false}));   // 3 % 2
  EXPECT_FALSE(cu::delta_net_supports({2, 4, 128, 96, 4, 1e-6f, false}));    // 256 % 96
  EXPECT_FALSE(cu::delta_net_supports({2, 4, 512, 128, 4, 1e-6f, false}));   // head_k_dim > 256
  EXPECT_FALSE(cu::delta_net_supports({2, 4, 128, 128, 9, 1e-6f, false}));   // taps
  EXPECT_TRUE(cu::delta_net_supports({16, 32, 128, 128, 4, 1e-6f, false}));  // Qwen3-Next-80B
}

TEST(DeltaNetKernel, GatesMatchTheirFormulas) {
  EXL3_REQUIRE_GPU();
  std::mt19937_64 rng(exl3::test::test_seed());
  const int64_t rows = 5, heads = 3, hd = 32, width = heads * hd;
  const std::vector<float> qg = random(static_cast<size_t>(rows * 2 * width), 1.0f, rng);
  const DeviceBuffer dqg = DeviceBuffer::upload(qg, "qg");
  const std::vector<float> poison(static_cast<size_t>(rows * width),
                                  std::numeric_limits<float>::quiet_NaN());
  DeviceBuffer q = DeviceBuffer::upload(poison, "q"), g = DeviceBuffer::upload(poison, "gate");
  EXL3_CUDA_CHECK(
      cu::split_query_gate(dqg.as<float>(), rows, heads, hd, q.as<float>(), g.as<float>(), nullptr),
      "split_query_gate");
  const auto hq = download(q, poison.size()), hg = download(g, poison.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < hd; ++d) {
        const auto i = static_cast<size_t>(r * width + h * hd + d);
        ASSERT_EQ(hq[i], qg[static_cast<size_t>(r * 2 * width + h * 2 * hd + d)]);
        ASSERT_EQ(hg[i], qg[static_cast<size_t>(r * 2 * width + h * 2 * hd + hd + d)]);
      }
    }
  }
  for (const int64_t gw : {width, int64_t{1}}) {
    const std::vector<float> y = random(static_cast<size_t>(rows * width), 1.0f, rng);
    const std::vector<float> gate = random(static_cast<size_t>(rows * gw), 2.0f, rng);
    DeviceBuffer dy = DeviceBuffer::upload(y, "y");
    const DeviceBuffer dg = DeviceBuffer::upload(gate, "gate");
    EXL3_CUDA_CHECK(cu::sigmoid_gate(dy.as<float>(), dg.as<float>(), rows, width, gw, nullptr),
                    "sigmoid_gate");
    const auto got = download(dy, y.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < width; ++i) {
        const float want =
            y[static_cast<size_t>(r * width + i)] *
            exl3::cpu::sigmoid(gate[static_cast<size_t>(r * gw + (gw == 1 ? 0 : i))]);
        ASSERT_NEAR(got[static_cast<size_t>(r * width + i)], want,
                    1e-6f * (1.0f + std::fabs(want)));
      }
    }
  }
}

}  // namespace
