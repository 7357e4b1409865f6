// The CUDA layers' plans (exl3/cuda/plan.hpp) without a device: the path switches at the
// options' boundaries, split-K against values worked by hand from the rules in plan.hpp, the
// workspace and arena carves aligned, disjoint and within the reported bytes for every m of
// random shapes (and big enough for what each pass writes), the prefill chunk the largest that
// fits the budget, and the JSON form round-tripping with its stable field names.
#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/cuda/plan.hpp"
#include "exl3/error.hpp"
#include "test_support.hpp"

namespace {

using namespace exl3::cuda;
using nlohmann::json;

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// A random multiple of `step` in [step, step * max_steps].
int64_t multiple(std::mt19937_64& rng, int64_t step, int64_t max_steps) {
  return step * uniform(rng, 1, max_steps);
}

struct NamedSpan {
  std::string name;
  Span span;
};

// Spans in use (bytes > 0) are kCarveAlign-aligned, pairwise disjoint and end by `bytes`.
void expect_carve(std::vector<NamedSpan> spans, size_t bytes, const std::string& where) {
  std::erase_if(spans, [](const NamedSpan& s) { return s.span.bytes == 0; });
  std::sort(spans.begin(), spans.end(),
            [](const NamedSpan& a, const NamedSpan& b) { return a.span.offset < b.span.offset; });
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i].span;
    ASSERT_EQ(s.offset % kCarveAlign, 0u) << where << ": " << spans[i].name;
    ASSERT_LE(s.offset + s.bytes, bytes) << where << ": " << spans[i].name;
    if (i > 0) {
      const Span& prev = spans[i - 1].span;
      ASSERT_LE(prev.offset + prev.bytes, s.offset)
          << where << ": " << spans[i - 1].name << " overlaps " << spans[i].name;
    }
  }
}

std::set<std::string> keys(const json& j) {
  std::set<std::string> k;
  for (const auto& [name, value] : j.items()) k.insert(name);
  return k;
}

// ---- EXL3 linear -------------------------------------------------------------------------------

LinearOptions random_linear_options(std::mt19937_64& rng) {
  LinearOptions o;
  o.gemv_max_m = uniform(rng, 0, 40);
  o.mma_max_m = uniform(rng, 0, 300);
  o.max_m = uniform(rng, 1, 1200);
  o.split_k = uniform(rng, 0, 3) == 0 ? static_cast<int>(uniform(rng, 1, 8)) : 0;
  return o;
}

LinearTraits random_linear_traits(std::mt19937_64& rng) {
  return {static_cast<int>(uniform(rng, 1, 200)), static_cast<int>(uniform(rng, 1, 4)),
          static_cast<int>(uniform(rng, 1, 4))};
}

TEST(LinearPlan, PathSwitchesAtGemvAndMmaMaxM) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 50; ++trial) {
    LinearOptions o;
    o.gemv_max_m = uniform(rng, 1, 32);
    o.mma_max_m = o.gemv_max_m + uniform(rng, 1, 200);
    o.max_m = o.mma_max_m + uniform(rng, 1, 500);
    const LinearShape s{multiple(rng, 128, 64), multiple(rng, 128, 64)};
    const LinearTraits t = random_linear_traits(rng);
    EXPECT_EQ(plan_linear(s, o, t, 1).path, LinearPath::kGemv);
    EXPECT_EQ(plan_linear(s, o, t, o.gemv_max_m).path, LinearPath::kGemv);
    EXPECT_EQ(plan_linear(s, o, t, o.gemv_max_m + 1).path, LinearPath::kMma);
    EXPECT_EQ(plan_linear(s, o, t, o.mma_max_m).path, LinearPath::kMma);
    EXPECT_EQ(plan_linear(s, o, t, o.mma_max_m + 1).path, LinearPath::kCublas);
    EXPECT_EQ(plan_linear(s, o, t, o.max_m).path, LinearPath::kCublas);
  }
  // gemv_max_m = 0 turns the GEMV off; mma_max_m <= gemv_max_m leaves no tensor-core GEMM.
  LinearOptions off;
  off.gemv_max_m = 0;
  EXPECT_EQ(linear_path(off, 1), LinearPath::kMma);
  off.gemv_max_m = 16;
  off.mma_max_m = 8;
  EXPECT_EQ(linear_path(off, 16), LinearPath::kGemv);
  EXPECT_EQ(linear_path(off, 17), LinearPath::kCublas);
}

// linear_split_k: the fewest splits (1..min(16, k / 128)) whose waves, (n / 128) * s / (sms *
// blocks_per_sm), fill >= 88% of their ceiling; else the first best-filled.
TEST(LinearPlan, SplitKMatchesTheRuleByHand) {
  struct Case {
    int64_t k, n;
    int sms, bps, want;
  };
  const Case cases[] = {
      // 32 column blocks on 132 slots: 4 splits = 128 / 132 = 0.97 (3: 0.73).
      {4096, 4096, 132, 1, 4},
      // 264 slots: 8 splits = 256 / 264 = 0.97 (7: 0.85).
      {4096, 4096, 132, 2, 8},
      // 108 slots: 3 splits = 96 / 108 = 0.89.
      {4096, 4096, 108, 1, 3},
      // 48 blocks: 5 splits = 240 / 132 = 1.82 waves -> 0.91 (4: 1.45 -> 0.73).
      {2048, 6144, 132, 1, 5},
      // 8 blocks: 15 splits = 120 / 132 = 0.91 (14: 0.85).
      {4096, 1024, 132, 1, 15},
      // 396 slots: 16 splits fill only 128 / 396 = 0.32, the best of 1..16.
      {4096, 1024, 132, 3, 16},
      // 224 blocks: 1..3 splits all fill 0.85; 4 = 896 / 132 = 6.79 waves -> 0.97.
      {8192, 28672, 132, 1, 4},
      // 7 blocks on 16 slots: no split count reaches 0.88; 2, 4, 6, 8 all fill 0.875, and the
      // first of them is kept.
      {1024, 896, 16, 1, 2},
      // 7 blocks on 8 slots: 1..7 splits fill 0.875, just short; 8 fill exactly 7 waves.
      {1024, 896, 8, 1, 8},
      // k = 256: at most 2 splits (8 k-tiles each); 1 block -> 2 fills more.
      {256, 128, 132, 1, 2},
      // k = 128: 8 k-tiles, one split.
      {128, 4096, 132, 1, 1},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(linear_split_k(c.k, c.n, c.sms, c.bps), c.want)
        << c.k << "x" << c.n << " sms " << c.sms << " blocks/SM " << c.bps;
  }
}

TEST(LinearPlan, EachPathTakesItsKernelsSplitK) {
  const LinearShape s{4096, 4096};
  const LinearTraits t{132, /*mma_blocks_per_sm=*/1, /*gemv_blocks_per_sm=*/2};
  const LinearOptions o;                          // gemv to 16, mma to 128
  EXPECT_EQ(plan_linear(s, o, t, 1).split_k, 8);  // 264 GEMV slots
  EXPECT_EQ(plan_linear(s, o, t, 16).split_k, 8);
  EXPECT_EQ(plan_linear(s, o, t, 17).split_k, 4);  // 132 GEMM slots
  EXPECT_EQ(plan_linear(s, o, t, 128).split_k, 4);
  EXPECT_EQ(plan_linear(s, o, t, 129).split_k, 1);  // cuBLAS
  LinearOptions fixed = o;
  fixed.split_k = 3;
  EXPECT_EQ(plan_linear(s, fixed, t, 1).split_k, 3);
  EXPECT_EQ(plan_linear(s, fixed, t, 64).split_k, 3);
  EXPECT_EQ(plan_linear(s, fixed, t, 1000).split_k, 1);
  EXPECT_EQ(linear_splits(s, fixed, t, LinearPath::kCublas), 1);
}

TEST(LinearPlan, WorkspaceCarveByHand) {
  const LinearShape s{128, 256};
  LinearOptions o;
  o.split_k = 2;
  const LinearTraits t;
  // m = 3 on the GEMV: xr 3 * 128 * 2 = 768, row_scale 12 -> 256, partial 2 * 3 * 256 * 4.
  const LinearPlan g = plan_linear(s, o, t, 3);
  EXPECT_EQ(g.workspace.xr, (Span{0, 768}));
  EXPECT_EQ(g.workspace.row_scale, (Span{768, 12}));
  EXPECT_EQ(g.workspace.partial, (Span{1024, 6144}));
  EXPECT_EQ(g.workspace.w_hat, Span{});
  EXPECT_EQ(g.workspace.bytes, 7168u);
  // m = 200 on cuBLAS: one split, plus the decoded weight 128 * 256 * 2.
  const LinearPlan c = plan_linear(s, o, t, 200);
  EXPECT_EQ(c.workspace.xr, (Span{0, 51200}));
  EXPECT_EQ(c.workspace.row_scale, (Span{51200, 800}));
  EXPECT_EQ(c.workspace.partial, (Span{52224, 204800}));
  EXPECT_EQ(c.workspace.w_hat, (Span{257024, 65536}));
  EXPECT_EQ(c.workspace.bytes, 322560u);
}

TEST(LinearPlan, CarvesAreDisjointAndFitForEveryM) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 40; ++trial) {
    const LinearShape s{multiple(rng, 128, 96), multiple(rng, 128, 96)};
    const LinearOptions o = random_linear_options(rng);
    const LinearTraits t = random_linear_traits(rng);
    const size_t total = linear_workspace_bytes(s, o, t);
    size_t largest = 0;
    for (int64_t m = 1; m <= o.max_m; ++m) {
      const LinearPlan p = plan_linear(s, o, t, m);
      const auto& w = p.workspace;
      const std::string where = fmt::format("{}x{} m={} {}", s.in, s.out, m, path_name(p.path));
      ASSERT_EQ(p.m, m);
      ASSERT_EQ(w.xr.bytes, static_cast<size_t>(m * s.in * 2)) << where;
      ASSERT_EQ(w.row_scale.bytes, static_cast<size_t>(m * 4)) << where;
      ASSERT_EQ(w.partial.bytes, static_cast<size_t>(p.split_k * m * s.out * 4)) << where;
      ASSERT_EQ(w.w_hat.bytes,
                p.path == LinearPath::kCublas ? static_cast<size_t>(s.in * s.out * 2) : 0u)
          << where;
      expect_carve(
          {{"xr", w.xr}, {"row_scale", w.row_scale}, {"partial", w.partial}, {"w_hat", w.w_hat}},
          w.bytes, where);
      ASSERT_LE(w.bytes, total) << where;
      largest = std::max(largest, w.bytes);
    }
    // The reported workspace is the largest any m needs, not more.
    EXPECT_EQ(largest, total) << s.in << "x" << s.out;
  }
}

// The chunks a slice touches, counted tile by tile against the GEMV's own cut.
int chunks_by_hand(int64_t k, int splits) {
  const int64_t tiles = k / 16;
  int most = 0;
  for (int s = 0; s < splits; ++s) {
    std::set<int64_t> chunks;
    for (int64_t t = tiles * s / splits; t < tiles * (s + 1) / splits; ++t) chunks.insert(t / 8);
    most = std::max(most, static_cast<int>(chunks.size()));
  }
  return most;
}

TEST(LinearPlan, FusedRotationOnlyWhereItStaysSmall) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t k = multiple(rng, 128, 96);
    const int splits = static_cast<int>(uniform(rng, 1, 16));
    ASSERT_EQ(gemv_staged_chunks(k, splits), chunks_by_hand(k, splits)) << k << " " << splits;
  }
  const LinearTraits t{132, 1, 2};
  LinearOptions o;
  EXPECT_EQ(plan_linear({2048, 5120}, o, t, 1).staged_chunks, 0) << "off by default";
  o.gemv_fused_rotation = true;
  // 2048 -> 5120 (Qwen3-30B-A3B's q/k/v) at batch 1: fused; one row of 2048 is 8 KiB to read.
  const LinearPlan p1 = plan_linear({2048, 5120}, o, t, 1);
  EXPECT_EQ(p1.path, LinearPath::kGemv);
  EXPECT_EQ(p1.staged_chunks, gemv_staged_chunks(2048, p1.split_k));
  EXPECT_GT(p1.staged_chunks, 0);
  // At 4 rows the block reads 32 KiB: still fused; at 5, or at 2 rows of 8192, not.
  EXPECT_GT(plan_linear({2048, 5120}, o, t, 4).staged_chunks, 0);
  EXPECT_EQ(plan_linear({2048, 5120}, o, t, 5).staged_chunks, 0);
  EXPECT_EQ(plan_linear({8192, 1024}, o, t, 2).staged_chunks, 0);
  // Beyond one 8-token group, off, or off the GEMV path: a rotation launch.
  EXPECT_EQ(plan_linear({128, 128}, o, t, 9).staged_chunks, 0);
  EXPECT_EQ(plan_linear({128, 128}, o, t, 200).staged_chunks, 0);
  o.gemv_fused_rotation = false;
  EXPECT_EQ(plan_linear({2048, 5120}, o, t, 1).staged_chunks, 0);
  // One slice of 8192 inputs: 64 chunks, 16 KiB of shared memory and 32 KiB read; one chunk
  // more is past both bounds.
  LinearOptions one;
  one.gemv_fused_rotation = true;
  one.split_k = 1;
  EXPECT_EQ(plan_linear({8192, 128}, one, t, 1).staged_chunks, 64);
  EXPECT_EQ(plan_linear({8192 + 128, 128}, one, t, 1).staged_chunks, 0);
}

TEST(LinearPlan, JsonRoundTripsWithStableNames) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 20; ++trial) {
    const LinearShape s{multiple(rng, 128, 64), multiple(rng, 128, 64)};
    const LinearOptions o = random_linear_options(rng);
    const LinearPlan p = plan_linear(s, o, random_linear_traits(rng), uniform(rng, 1, o.max_m));
    const json j = p;
    EXPECT_EQ(keys(j),
              (std::set<std::string>{"m", "path", "split_k", "staged_chunks", "workspace"}));
    EXPECT_EQ(keys(j.at("workspace")),
              (std::set<std::string>{"bytes", "xr", "row_scale", "partial", "w_hat"}));
    EXPECT_EQ(keys(j.at("workspace").at("partial")), (std::set<std::string>{"offset", "bytes"}));
    EXPECT_EQ(j.at("path"), path_name(p.path));
    EXPECT_EQ(j.at("split_k"), p.split_k);
    EXPECT_EQ(json::parse(j.dump()).get<LinearPlan>(), p);
    json changed = j;
    changed["workspace"]["partial"]["offset"] = p.workspace.partial.offset + kCarveAlign;
    EXPECT_NE(changed.get<LinearPlan>(), p);
  }
  json bad = plan_linear({128, 128}, {}, {}, 1);
  bad["path"] = "tensor";
  EXPECT_THROW(bad.get<LinearPlan>(), exl3::Error);
}

// ---- MXFP8 linear ------------------------------------------------------------------------------

TEST(Mxfp8Plan, PathSwitchesAtGemvMaxM) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 50; ++trial) {
    Mxfp8Options o;
    o.gemv_max_m = uniform(rng, 1, 64);
    o.max_m = o.gemv_max_m + uniform(rng, 1, 300);
    const Mxfp8Shape s{multiple(rng, 32, 200), uniform(rng, 1, 5000), uniform(rng, 0, 1) == 1};
    const Mxfp8Traits t{static_cast<int>(uniform(rng, 1, 200))};
    EXPECT_EQ(plan_mxfp8(s, o, t, 1).path, Mxfp8Path::kGemv);
    EXPECT_EQ(plan_mxfp8(s, o, t, o.gemv_max_m).path, Mxfp8Path::kGemv);
    EXPECT_EQ(plan_mxfp8(s, o, t, o.gemv_max_m + 1).path, Mxfp8Path::kCublas);
    EXPECT_EQ(plan_mxfp8(s, o, t, o.gemv_max_m + 1).split_k, 1);
  }
  Mxfp8Options off;
  off.gemv_max_m = 0;
  EXPECT_EQ(mxfp8_path(off, 1), Mxfp8Path::kCublas);
}

// mxfp8_split_k: 1 once there is a 16-row tile per SM, else ceil(4 * sms / tiles) clamped to
// 1..min(16, k / 512).
TEST(Mxfp8Plan, SplitKMatchesTheRuleByHand) {
  struct Case {
    int64_t k, n;
    int sms, want;
  };
  const Case cases[] = {
      {4096, 2048, 132, 5},   // 128 tiles: ceil(528 / 128) = 5, cap 8
      {4096, 4096, 132, 1},   // 256 tiles >= 132 SMs
      {4096, 2112, 132, 1},   // exactly 132 tiles
      {1024, 2048, 132, 2},   // want 5, cap 1024 / 512 = 2
      {8192, 16, 132, 16},    // one tile: want 528, cap 16
      {512, 100, 132, 1},     // 7 tiles (100 rows round up), cap 1
      {28672, 1024, 132, 9},  // 64 tiles: ceil(528 / 64) = 9
      {2048, 1000, 78, 4},    // 63 tiles: ceil(312 / 63) = 5, cap 4
  };
  for (const auto& c : cases) {
    EXPECT_EQ(mxfp8_split_k(c.k, c.n, c.sms), c.want) << c.k << "x" << c.n << " sms " << c.sms;
  }
  Mxfp8Options fixed;
  fixed.split_k = 3;
  EXPECT_EQ(mxfp8_splits({4096, 4096, false}, fixed, {}, Mxfp8Path::kGemv), 3);
  EXPECT_EQ(mxfp8_splits({4096, 4096, false}, fixed, {}, Mxfp8Path::kCublas), 1);
}

TEST(Mxfp8Plan, CarvesAreDisjointAndFitForEveryM) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 40; ++trial) {
    const Mxfp8Shape s{multiple(rng, 32, 256), uniform(rng, 1, 6000), uniform(rng, 0, 1) == 1};
    Mxfp8Options o;
    o.gemv_max_m = uniform(rng, 0, 64);
    o.max_m = uniform(rng, 1, 1200);
    o.split_k = uniform(rng, 0, 3) == 0 ? static_cast<int>(uniform(rng, 1, 8)) : 0;
    const Mxfp8Traits t{static_cast<int>(uniform(rng, 1, 200))};
    const size_t total = mxfp8_workspace_bytes(s, o, t);
    size_t largest = 0;
    for (int64_t m = 1; m <= o.max_m; ++m) {
      const Mxfp8Plan p = plan_mxfp8(s, o, t, m);
      const auto& w = p.workspace;
      const bool cublas = p.path == Mxfp8Path::kCublas;
      const std::string where =
          fmt::format("{}x{} bias {} m={} {}", s.in, s.out, s.bias, m, mxfp8_path_name(p.path));
      // Partials only where the kernels write them: split GEMVs and cuBLAS with a bias.
      const bool partial = p.split_k > 1 || (cublas && s.bias);
      ASSERT_EQ(w.partial.bytes, partial ? static_cast<size_t>(p.split_k * m * s.out * 4) : 0u)
          << where;
      ASSERT_EQ(w.w_bf16.bytes, cublas ? static_cast<size_t>(s.in * s.out * 2) : 0u) << where;
      expect_carve({{"partial", w.partial}, {"w_bf16", w.w_bf16}}, w.bytes, where);
      ASSERT_LE(w.bytes, total) << where;
      largest = std::max(largest, w.bytes);
    }
    EXPECT_EQ(largest, total);
  }
}

TEST(Mxfp8Plan, JsonRoundTripsWithStableNames) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 20; ++trial) {
    const Mxfp8Shape s{multiple(rng, 32, 256), uniform(rng, 1, 6000), uniform(rng, 0, 1) == 1};
    const Mxfp8Plan p =
        plan_mxfp8(s, {}, {static_cast<int>(uniform(rng, 1, 200))}, uniform(rng, 1, 100));
    const json j = p;
    EXPECT_EQ(keys(j), (std::set<std::string>{"m", "path", "split_k", "workspace"}));
    EXPECT_EQ(keys(j.at("workspace")), (std::set<std::string>{"bytes", "partial", "w_bf16"}));
    EXPECT_EQ(j.at("path"), mxfp8_path_name(p.path));
    EXPECT_EQ(json::parse(j.dump()).get<Mxfp8Plan>(), p);
    json changed = j;
    changed["m"] = p.m + 1;
    EXPECT_NE(changed.get<Mxfp8Plan>(), p);
  }
}

// ---- fused MoE ---------------------------------------------------------------------------------

MoeShape random_moe_shape(std::mt19937_64& rng) {
  MoeShape s;
  s.hidden = multiple(rng, 128, 24);
  s.intermediate = multiple(rng, 128, 12);
  s.experts = static_cast<int>(uniform(rng, 1, 160));
  s.top_k = static_cast<int>(uniform(rng, 1, std::min(s.experts, 10)));
  s.shared_h = s.experts > 1 && uniform(rng, 0, 1) == 1;
  s.tier_count = static_cast<int>(uniform(rng, 1, 2));
  return s;
}

MoeOptions random_moe_options(std::mt19937_64& rng) {
  MoeOptions o;
  o.capacity = uniform(rng, 1, 700);
  o.decode_max_m = uniform(rng, 1, 40);
  o.prefill_chunk = uniform(rng, 0, 1) == 1 ? uniform(rng, 1, 300) : 0;
  o.arena_budget_mib = uniform(rng, 1, 64);
  o.tiers = static_cast<MoeOptions::Tiers>(uniform(rng, 0, 2));
  const int64_t groups[] = {0, 32, 128};
  o.prefill_group = groups[uniform(rng, 0, 2)];
  return o;
}

TEST(MoePlan, PathSwitchesAtDecodeMaxM) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 50; ++trial) {
    const MoeShape s = random_moe_shape(rng);
    MoeOptions o = random_moe_options(rng);
    o.capacity = o.decode_max_m + uniform(rng, 1, 300);
    const MoeTraits t{static_cast<int>(uniform(rng, 1, 200))};
    EXPECT_EQ(plan_moe(s, o, t, 1).path, MoePath::kDecode);
    EXPECT_EQ(plan_moe(s, o, t, o.decode_max_m).path, MoePath::kDecode);
    EXPECT_EQ(plan_moe(s, o, t, o.decode_max_m + 1).path, MoePath::kPrefill);
    EXPECT_EQ(plan_moe(s, o, t, o.capacity).path, MoePath::kPrefill);
  }
  // Capacity within the decode path: no prefill chunk at all.
  MoeOptions o;
  o.capacity = 8;
  o.decode_max_m = 32;
  EXPECT_EQ(moe_prefill_chunk({1024, 256, 8, 2, false, 1}, o), 0);
  o.capacity = 32;
  EXPECT_EQ(moe_prefill_chunk({1024, 256, 8, 2, false, 1}, o), 0);
  EXPECT_EQ(plan_moe({1024, 256, 8, 2, false, 1}, o, {132}, 32).path, MoePath::kDecode);
}

// moe_split_k: ceil(8 * sms / base_blocks) clamped to 1..min(max_splits, k_tiles / 8).
TEST(MoePlan, DecodeSplitsMatchTheRuleByHand) {
  // GLM-5.2 per rank (H 6144, I 512, top-8) on 132 SMs. FC1: 2 * 4 * 8 = 64 blocks, ceil(1056 /
  // 64) = 17 (cap 32). FC2: 48 * 8 = 384 blocks, ceil(1056 / 384) = 3 (cap 512 / 128 = 4).
  EXPECT_EQ(moe_decode_splits({6144, 512, 256, 8, true, 1}, {}, {132}), std::make_pair(17, 3));
  // On 78 SMs: ceil(624 / 64) = 10 and ceil(624 / 384) = 2.
  EXPECT_EQ(moe_decode_splits({6144, 512, 256, 8, true, 1}, {}, {78}), std::make_pair(10, 2));
  // Qwen3-30B-A3B (H 2048, I 768, top-8). FC1: 96 blocks, ceil(1056 / 96) = 11 (cap 16). FC2:
  // 128 blocks, ceil(1056 / 128) = 9, capped at 768 / 128 = 6.
  EXPECT_EQ(moe_decode_splits({2048, 768, 128, 8, false, 1}, {}, {132}), std::make_pair(11, 6));
  EXPECT_EQ(moe_split_k(10000, 4096, 132), 1);  // more blocks than the target
  EXPECT_EQ(moe_split_k(1, 4096, 132, 5), 5);   // max_splits
  EXPECT_EQ(moe_split_k(1, 8, 132), 1);         // k_tiles / 8
}

TEST(MoePlan, PrefillPassesSplitWithinTheirRoom) {
  // H 1024, I 128, E 4, top-2 on 132 SMs, chunks of 64 tokens.
  const MoeShape s{1024, 128, 4, 2, false, 1};
  MoeOptions o;
  o.capacity = 200;
  o.decode_max_m = 4;
  o.prefill_chunk = 64;
  const MoePlan p = plan_moe(s, o, {132}, 133);  // 2 x 64 tokens, then 5
  EXPECT_EQ(p.chunk, 64);
  EXPECT_EQ(p.full.tokens, 64);
  EXPECT_EQ(p.full.count, 2);
  // 128 routes: 128 / 32 + min(4, 128) = 8 groups; room 1 (64 / 64) keeps one split.
  EXPECT_EQ(p.full.routes, 128);
  EXPECT_EQ(p.full.max_groups, 8);
  EXPECT_EQ(p.full.split_fc1, 1);
  EXPECT_EQ(p.full.split_fc2, 1);
  // Tail: 10 routes, 0 + 4 groups; room 64 / 5 = 12. FC1: 2 * 1 * 4 = 8 blocks want 132,
  // capped at min(12, 1024 / 128 = 8) = 8. FC2: 8 * 4 = 32 blocks want 33, capped at 128 / 128.
  EXPECT_EQ(p.tail.tokens, 5);
  EXPECT_EQ(p.tail.count, 1);
  EXPECT_EQ(p.tail.routes, 10);
  EXPECT_EQ(p.tail.max_groups, 4);
  EXPECT_EQ(p.tail.split_fc1, 8);
  EXPECT_EQ(p.tail.split_fc2, 1);
}

TEST(MoePlan, PrefillGroupsGrowWhereExpertsGetManyRoutes) {
  // Qwen3-30B-A3B's layer: 128 experts, top-8, chunks of 2048 tokens.
  const MoeShape s{2048, 768, 128, 8, false, 1};
  MoeOptions o;
  o.capacity = 4096;
  o.prefill_chunk = 2048;
  // The grouped GEMM from kMoeGemmMinRoutesPerExpert routes per expert on average.
  const int64_t from = kMoeGemmMinRoutesPerExpert * 128;
  EXPECT_EQ(moe_prefill_group(s, o, from - 1), kMoePrefillGroup);
  EXPECT_EQ(moe_prefill_group(s, o, from), kMoePrefillGroupGemm);
  const MoePlan big = plan_moe(s, o, {132}, 2048), small = plan_moe(s, o, {132}, 256);
  EXPECT_EQ(big.full.group, 128);
  EXPECT_EQ(big.full.max_groups, 16384 / 128 + 128);
  EXPECT_EQ(small.tail.group, 32);
  EXPECT_EQ(small.tail.max_groups, 2048 / 32 + 128);
  // A fixed group size holds at every m; the arena's group tables fit either.
  for (const int64_t g : {32, 128}) {
    o.prefill_group = g;
    for (const int64_t m : {33, 256, 2048, 4096}) {
      const MoePlan p = plan_moe(s, o, {132}, m);
      const MoePass& pass = p.full.count > 0 ? p.full : p.tail;
      EXPECT_EQ(pass.group, g) << m;
      EXPECT_LE(4 * pass.max_groups, static_cast<int64_t>(p.arena.group_expert.bytes)) << m;
    }
  }
  o.prefill_group = 64;
  EXPECT_THROW((void)plan_moe(s, o, {132}, 2048), exl3::Error);
}

TEST(MoePlan, DecodeArenaByHand) {
  // H = I = 128, 2 experts, top-1, per-expert rotations, one decode token, no splits.
  const MoeArena a = moe_arena({128, 128, 2, 1, false, 1}, MoePath::kDecode, 1, 1, 1);
  EXPECT_EQ(a.counts, Span{});  // route packing is prefill only
  EXPECT_EQ(a.xg, (Span{0, 256}));
  EXPECT_EQ(a.xu, (Span{256, 256}));
  EXPECT_EQ(a.scale_g, (Span{512, 4}));
  EXPECT_EQ(a.scale_u, (Span{768, 4}));
  EXPECT_EQ(a.partial1, (Span{1024, 1024}));
  EXPECT_EQ(a.act, (Span{2048, 256}));
  EXPECT_EQ(a.act_scale, (Span{2304, 4}));
  EXPECT_EQ(a.partial2, (Span{2560, 512}));
  EXPECT_EQ(a.bytes, 3072u);
}

TEST(MoePlan, PrefillChunkIsTheLargestWithinBudget) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 50; ++trial) {
    const MoeShape s = random_moe_shape(rng);
    MoeOptions o = random_moe_options(rng);
    o.prefill_chunk = 0;
    o.capacity = o.decode_max_m + uniform(rng, 1, 5000);
    const int64_t chunk = moe_prefill_chunk(s, o);
    const size_t budget = static_cast<size_t>(o.arena_budget_mib) << 20;
    ASSERT_GE(chunk, 1);
    ASSERT_LE(chunk, o.capacity);
    // A chunk of 1 is the floor even over budget; any larger one fits, and one more would not.
    if (chunk > 1) {
      EXPECT_LE(moe_arena(s, MoePath::kPrefill, chunk, 1, 1).bytes, budget);
    }
    if (chunk < o.capacity) {
      EXPECT_GT(moe_arena(s, MoePath::kPrefill, chunk + 1, 1, 1).bytes, budget);
    }
    o.prefill_chunk = uniform(rng, 1, 2 * o.capacity);
    EXPECT_EQ(moe_prefill_chunk(s, o), std::min(o.prefill_chunk, o.capacity));
  }
}

TEST(MoePlan, TierPasses) {
  using T = MoeOptions::Tiers;
  for (const MoePath p : {MoePath::kDecode, MoePath::kPrefill}) {
    for (const T t : {T::kAuto, T::kGrid, T::kPasses}) {
      EXPECT_TRUE(moe_tier_passes(t, 1, p));  // one K: its own kernel
    }
    EXPECT_FALSE(moe_tier_passes(T::kAuto, 2, p));
    EXPECT_FALSE(moe_tier_passes(T::kGrid, 2, p));
    EXPECT_TRUE(moe_tier_passes(T::kPasses, 3, p));
  }
}

TEST(MoePlan, PassesCoverMAndCarvesFitEveryPass) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 60; ++trial) {
    const MoeShape s = random_moe_shape(rng);
    const MoeOptions o = random_moe_options(rng);
    const MoeTraits t{static_cast<int>(uniform(rng, 1, 200))};
    const size_t total = moe_arena_bytes(s, o, t);
    const int64_t k = s.top_k, H = s.hidden, I = s.intermediate;
    for (int64_t m = 1; m <= o.capacity; ++m) {
      const MoePlan p = plan_moe(s, o, t, m);
      const std::string where =
          fmt::format("H{} I{} E{} k{} m={} {}", H, I, s.experts, k, m, moe_path_name(p.path));
      ASSERT_EQ(p.arena_bytes, total) << where;
      ASSERT_LE(p.arena.bytes, p.arena_bytes) << where;
      ASSERT_EQ(p.tier_passes, moe_tier_passes(o.tiers, s.tier_count, p.path)) << where;
      const auto& a = p.arena;
      std::vector<NamedSpan> spans = {{"counts", a.counts},
                                      {"fill", a.fill},
                                      {"offsets", a.offsets},
                                      {"num_groups", a.num_groups},
                                      {"group_expert", a.group_expert},
                                      {"group_begin", a.group_begin},
                                      {"group_count", a.group_count},
                                      {"slot_of_route", a.slot_of_route},
                                      {"route_of_slot", a.route_of_slot},
                                      {"xg", a.xg},
                                      {"xu", a.xu},
                                      {"scale_g", a.scale_g},
                                      {"scale_u", a.scale_u},
                                      {"partial1", a.partial1},
                                      {"act", a.act},
                                      {"act_scale", a.act_scale},
                                      {"partial2", a.partial2}};
      expect_carve(spans, a.bytes, where);
      ASSERT_EQ(p.full.count * p.full.tokens + p.tail.count * p.tail.tokens, m) << where;
      const bool prefill = p.path == MoePath::kPrefill;
      if (prefill) {
        ASSERT_EQ(p.chunk, moe_prefill_chunk(s, o)) << where;
        ASSERT_TRUE(p.full.count == 0 || p.full.tokens == p.chunk) << where;
        ASSERT_LE(p.tail.count, 1) << where;
        ASSERT_LT(p.tail.tokens, p.chunk) << where;
      } else {
        ASSERT_EQ(p.full.count, 1) << where;
        ASSERT_EQ(std::make_pair(p.full.split_fc1, p.full.split_fc2), moe_decode_splits(s, o, t))
            << where;
        ASSERT_EQ(a.counts.bytes + a.slot_of_route.bytes + a.group_expert.bytes, 0u) << where;
      }
      // What each pass writes fits its span.
      for (const MoePass* pass : {&p.full, &p.tail}) {
        if (pass->count == 0) continue;
        const int64_t routes = pass->tokens * k;
        const int64_t rot_rows = s.shared_h ? pass->tokens : routes;
        ASSERT_EQ(pass->routes, routes) << where;
        ASSERT_GE(pass->split_fc1, 1) << where;
        ASSERT_GE(pass->split_fc2, 1) << where;
        ASSERT_GE(a.xg.bytes, static_cast<size_t>(rot_rows * H * 2)) << where;
        ASSERT_GE(a.scale_u.bytes, static_cast<size_t>(rot_rows * 4)) << where;
        ASSERT_GE(a.partial1.bytes, static_cast<size_t>(pass->split_fc1 * routes * 2 * I * 4))
            << where;
        ASSERT_GE(a.act.bytes, static_cast<size_t>(routes * I * 2)) << where;
        ASSERT_GE(a.partial2.bytes, static_cast<size_t>(pass->split_fc2 * routes * H * 4)) << where;
        if (prefill) {
          ASSERT_EQ(pass->group, moe_prefill_group(s, o, routes)) << where;
          ASSERT_EQ(pass->max_groups, routes / pass->group + std::min<int64_t>(s.experts, routes))
              << where;
          ASSERT_GE(a.group_expert.bytes, static_cast<size_t>(pass->max_groups * 4)) << where;
          ASSERT_GE(a.route_of_slot.bytes, static_cast<size_t>(routes * 4)) << where;
          ASSERT_EQ(a.counts.bytes, static_cast<size_t>(s.experts * 4)) << where;
        } else {
          ASSERT_EQ(pass->max_groups, routes) << where;
        }
      }
    }
  }
}

TEST(MoePlan, JsonRoundTripsWithStableNames) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 20; ++trial) {
    const MoeShape s = random_moe_shape(rng);
    const MoeOptions o = random_moe_options(rng);
    const MoePlan p =
        plan_moe(s, o, {static_cast<int>(uniform(rng, 1, 200))}, uniform(rng, 1, o.capacity));
    const json j = p;
    EXPECT_EQ(keys(j), (std::set<std::string>{"m", "path", "tier_passes", "chunk", "full", "tail",
                                              "arena", "arena_bytes"}));
    EXPECT_EQ(keys(j.at("full")),
              (std::set<std::string>{"tokens", "count", "split_fc1", "split_fc2", "routes",
                                     "max_groups", "group"}));
    EXPECT_EQ(keys(j.at("arena")),
              (std::set<std::string>{"bytes", "counts", "fill", "offsets", "num_groups",
                                     "group_expert", "group_begin", "group_count", "slot_of_route",
                                     "route_of_slot", "xg", "xu", "scale_g", "scale_u", "partial1",
                                     "act", "act_scale", "partial2"}));
    EXPECT_EQ(j.at("path"), moe_path_name(p.path));
    EXPECT_EQ(json::parse(j.dump()).get<MoePlan>(), p);
    json changed = j;
    changed["arena"]["partial2"]["bytes"] = p.arena.partial2.bytes + 1;
    EXPECT_NE(changed.get<MoePlan>(), p);
  }
}

}  // namespace
