// Paged prefill attention on the fp16 cache (cuda::attention_prefill, the tensor-core kernel)
// against an fp64 softmax(q K^T) V over the same cache: head dims 32..256, GQA groups of 1 to 8
// (including groups that do not fill a block's heads), tiles of 1..32 tokens, prefills that
// continue an existing context (chunked prefill), sliding windows shorter than a tile and longer
// than the context, gpt-oss sinks. Outputs are NaN-poisoned first; a tile's bits do not depend
// on the other tiles of the launch; a captured graph replays the eager bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "attention_fixture.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace {

using namespace exl3::test::attention;

// A prefill run: positions start .. start + len - 1 of one sequence (earlier positions are
// context already in the cache).
struct Run {
  int start, len;
};

struct PrefillCase {
  int heads, kv_heads, head_dim;
  std::vector<Run> runs;  // one per sequence
  int window = 0;
  bool sinks = false;
};

// The fixture of a case (sequence i's cache reaches its run's last position) with one query per
// run position, and the engine's tiles: up to 32 consecutive tokens of one run each.
struct Prefill {
  Prefill(const PrefillCase& p, std::mt19937_64& rng) : fixture(make(p, rng)) {
    int t = 0;
    for (const Run& r : p.runs) {
      for (int f = 0; f < r.len; f += 32) {
        first.push_back(t + f);
        len.push_back(std::min(32, r.len - f));
      }
      t += r.len;
    }
    queries = t;
  }

  static Fixture make(const PrefillCase& p, std::mt19937_64& rng) {
    Case c{p.heads, p.kv_heads, p.head_dim, {}, p.window, p.sinks};
    std::vector<Query> qs;
    for (size_t s = 0; s < p.runs.size(); ++s) {
      c.positions.push_back(p.runs[s].start + p.runs[s].len - 1);
      for (int j = 0; j < p.runs[s].len; ++j)
        qs.push_back({static_cast<int>(s), p.runs[s].start + j});
    }
    return Fixture(c, rng, std::move(qs));
  }

  // Tiles [from, to) to the device: what launch() runs (uploaded before any graph capture, which
  // may not allocate).
  void select(size_t from, size_t to) {
    const auto a = static_cast<std::ptrdiff_t>(from), b = static_cast<std::ptrdiff_t>(to);
    selected = static_cast<int64_t>(to - from);
    dfirst = DeviceBuffer::upload(std::vector<int32_t>(first.begin() + a, first.begin() + b),
                                  "tile_first");
    dlen = DeviceBuffer::upload(std::vector<int32_t>(len.begin() + a, len.begin() + b), "tile_len");
  }

  // The selected tiles on `stream` (outputs neither poisoned nor synchronised).
  cudaError_t launch(cudaStream_t stream) {
    return cu::attention_prefill(fixture.q(), dfirst.as<int32_t>(), dlen.as<int32_t>(), selected,
                                 fixture.meta(), fixture.shape(), fixture.scale(), fixture.kv(),
                                 fixture.out(), stream);
  }

  // Poisoned output, tiles [from, to), downloaded.
  std::vector<float> run(size_t from, size_t to) {
    select(from, to);
    fixture.poison();
    EXL3_CUDA_CHECK(launch(nullptr), "attention_prefill");
    EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "sync");
    return fixture.download();
  }
  std::vector<float> run_all() { return run(0, first.size()); }

  Fixture fixture;
  std::vector<int32_t> first, len;
  int queries = 0;
  int64_t selected = 0;
  DeviceBuffer dfirst, dlen;
};

const std::vector<PrefillCase>& cases() {
  static const std::vector<PrefillCase> c = {
      // Qwen3-30B-A3B's group of 8 at head dim 128: a fresh prompt of three tiles (32, 32, 6)
      // and a prefill of 40 continuing 500 tokens of context.
      {16, 2, 128, {{0, 70}, {500, 40}}},
      {8, 2, 128, {{0, 1}, {3, 17}, {100, 33}}},  // G = 4; a one-token tile; tiles of 17 and 1
      {6, 2, 128, {{0, 45}, {64, 64}}},           // G = 3: a block's fourth head idle
      {12, 2, 64, {{0, 64}, {7, 50}}},            // G = 6: a second head block half full
      {16, 16, 64, {{0, 40}, {200, 31}}},         // MHA
      {4, 1, 32, {{0, 70}, {20, 9}}, 8},          // head dim 32, window shorter than a tile
      {8, 2, 64, {{0, 96}, {300, 64}}, 48},       // windows across chunks
      {4, 2, 64, {{0, 40}, {10, 30}}, 1000},      // a window longer than the context
      {8, 4, 256, {{0, 37}, {300, 32}}},          // head dim 256 (Gemma 3), G = 2
      {16, 2, 256, {{0, 50}, {90, 20}}, 64},      // Qwen3-Next's group of 8, windowed
      // Sinks (gpt-oss): full and sliding layers.
      {8, 2, 64, {{0, 70}, {400, 40}}, 0, true},
      {8, 2, 64, {{0, 70}, {400, 40}}, 128, true},
      {4, 2, 32, {{0, 33}}, 8, true},
  };
  return c;
}

TEST(CudaAttentionPrefill, MatchesFp64AcrossShapesWindowsAndContexts) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  for (const PrefillCase& c : cases()) {
    Prefill p(c, rng);
    const auto got = p.run_all();
    const size_t per = p.fixture.token_floats();
    double worst = 0;
    for (int i = 0; i < p.queries; ++i) {
      const auto ref = p.fixture.reference(i);
      const auto row = token_rows(got, per, i);
      for (size_t x = 0; x < per; ++x) {
        ASSERT_TRUE(std::isfinite(row[x]))
            << "heads " << c.heads << " hd " << c.head_dim << " query " << i << " channel " << x;
        worst = std::max(worst, std::abs(row[x] - ref[x]));
      }
      const std::vector<float> want(ref.begin(), ref.end());
      ASSERT_LT(exl3::test::rel_l2(row, want), 2e-5)
          << "heads " << c.heads << "/" << c.kv_heads << " hd " << c.head_dim << " window "
          << c.window << " query " << i;
    }
    std::printf("heads %d/%d hd %d window %d sinks %d: max |error| %.2e\n", c.heads, c.kv_heads,
                c.head_dim, c.window, c.sinks ? 1 : 0, worst);
  }
}

// A tile's output is its own block's work: launched alone it gives the bits it gives among all
// the tiles, and a captured graph replays the eager bits.
TEST(CudaAttentionPrefill, TileBitsDoNotDependOnTheLaunchAndGraphsReplayThem) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  Prefill p(cases()[0], rng);
  const auto all = p.run_all();
  const size_t per = p.fixture.token_floats();
  const size_t last = p.first.size() - 1;
  const auto alone = p.run(last, last + 1);
  for (int t = p.first[last]; t < p.first[last] + p.len[last]; ++t)
    EXPECT_EQ(token_rows(alone, per, t), token_rows(all, per, t)) << "token " << t;

  p.select(0, p.first.size());
  CapturedGraph graph([&](cudaStream_t stream) { return p.launch(stream); });
  for (int rep = 0; rep < 2; ++rep) {
    p.fixture.poison();
    graph.replay();
    EXPECT_EQ(p.fixture.download(), all) << "replay " << rep;
  }
}

TEST(CudaAttentionPrefill, RejectsBadShapes) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  Prefill p(cases()[1], rng);
  const cu::AttnShape bad_dim{4, 2, 96, 48}, bad_groups{5, 2, 64, 32}, bad_window{4, 2, 64, 32, -1};
  DeviceBuffer one = DeviceBuffer::upload(std::vector<int32_t>{0}, "tile");
  for (const auto& s : {bad_dim, bad_groups, bad_window}) {
    EXPECT_EQ(
        cu::attention_prefill(p.fixture.q(), one.as<int32_t>(), one.as<int32_t>(), 1,
                              p.fixture.meta(), s, 1.0f, p.fixture.kv(), p.fixture.out(), nullptr),
        cudaErrorInvalidValue);
  }
}

}  // namespace
