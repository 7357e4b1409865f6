// Paged decode attention (cuda::attention_decode, the fp16 cache's tensor-core kernel) against an
// fp64 CPU softmax(q K^T) V over the same fp16 cache: 1 to 24 query heads per kv head (one row
// block of up to 16 heads, or two), head dims 32 to 256, contexts from 1 key to many splits (pages
// shuffled so no sequence is contiguous), NaN-poisoned outputs; the split-KV path equal to the
// one-block path within rounding; every token's output bit-identical whether it runs alone or in a
// batch; a captured graph replayed (counters left zero) equal to eager.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "attention_fixture.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace {

using namespace exl3::test::attention;

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
      // 8 query heads per kv head (Qwen3-30B-A3B), and 24: row blocks of 16 and 8 heads.
      {16, 2, 128, {3, 200, 1900}},
      {24, 1, 64, {10, 700, 1300}},
      {24, 1, 64, {5, 900}, 300, true},
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
  CapturedGraph graph([&](cudaStream_t stream) {
    return f.launch(dlist.as<int32_t>(), count, ws.get(), ws_bytes, stream);
  });
  for (int rep = 0; rep < 3; ++rep) {
    f.poison();
    graph.replay();
    EXPECT_EQ(f.download(), eager) << "replay " << rep;
    Fixture::expect_counters_zero(ws, f.counter_bytes());
  }
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
