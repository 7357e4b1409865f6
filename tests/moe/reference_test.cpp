// The reference MoE against a dense fp64 computation from reconstructed weights, and rank-sliced
// layers against the same layer stored unsliced: the sum of the rank partials is the full output.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/format/checkpoint.hpp"
#include "exl3/moe/reference.hpp"
#include "exl3/moe/router.hpp"
#include "exl3/moe/weights.hpp"
#include "moe_test_util.hpp"

namespace exl3::moe {
namespace {

using namespace test;

// fp64 MoE over dense reconstructed experts (+ shared).
std::vector<double> dense_moe(const std::vector<DenseMlp>& experts, const TopK& routes,
                              const std::vector<float>& x, int64_t m, int64_t h,
                              const std::vector<DenseMlp>& shared = {}) {
  std::vector<double> out(static_cast<size_t>(m * h), 0.0);
  for (int64_t t = 0; t < m; ++t) {
    for (int j = 0; j < routes.k; ++j) {
      const size_t r = static_cast<size_t>(t * routes.k + j);
      experts[static_cast<size_t>(routes.ids[r])].accumulate(x.data() + t * h, routes.weights[r],
                                                             out.data() + t * h);
    }
    for (const auto& s : shared) s.accumulate(x.data() + t * h, 1.0, out.data() + t * h);
  }
  return out;
}

TopK random_routes(int64_t m, int experts, int k) {
  return route_softmax(random_normal(static_cast<size_t>(m * experts), 2.0), m, experts,
                       {.top_k = k, .renormalize = true});
}

MoeLayerWeights load(const std::filesystem::path& dir, int rank, int tp, int experts) {
  return load_moe_layer(Checkpoint::open(dir), kLayer, rank, tp, experts);
}

TEST(ReferenceMoe, MatchesDenseFp64) {
  TempDir dir;
  auto spec = small_spec(RotationLayout::kPlain, 1);
  spec.num_experts = 6;
  spec.expert_bits = {3, 4, 2, 3, 5, 3};
  write_synthetic_moe(dir.path(), spec);
  const auto w = load(dir.path(), 0, 1, 6);
  const int64_t m = 9, h = w.hidden;
  const auto x = random_normal(static_cast<size_t>(m * h));
  const auto routes = random_routes(m, 6, 2);

  std::vector<DenseMlp> dense;
  for (const auto& e : w.experts) dense.push_back(DenseMlp::of(MlpView::of(e, w.codebook)));
  std::vector<float> out(x.size());
  moe_forward(w, routes, x.data(), m, out.data());
  const auto want = dense_moe(dense, routes, x, m, h);
  EXPECT_LE(rel_l2(std::span<const float>(out), std::span<const double>(want)), 1e-5);

  // One shared expert (here: expert 4's weights as an unrouted MLP), added with weight 1.
  const std::vector<MlpView> shared = {MlpView::of(w.experts[4], w.codebook)};
  moe_forward(w, routes, x.data(), m, out.data(), shared);
  const auto want_shared = dense_moe(dense, routes, x, m, h, {dense[4]});
  EXPECT_LE(rel_l2(std::span<const float>(out), std::span<const double>(want_shared)), 1e-5);
}

TEST(ReferenceMoe, TokensWithoutRoutesToAnExpertAndEmptyBatches) {
  TempDir dir;
  write_synthetic_moe(dir.path(), small_spec(RotationLayout::kPlain, 1));
  const auto w = load(dir.path(), 0, 1, 4);
  const int64_t m = 3, h = w.hidden;
  const auto x = random_normal(static_cast<size_t>(m * h));
  TopK routes{.m = m, .k = 1, .ids = {2, 2, 2}, .weights = {1.0f, 0.5f, -1.0f}};
  std::vector<float> out(x.size());
  moe_forward(w, routes, x.data(), m, out.data());
  std::vector<float> single(static_cast<size_t>(h));
  mlp_forward(MlpView::of(w.experts[2], w.codebook), x.data() + h, 1, single.data());
  for (int64_t c = 0; c < h; ++c)
    EXPECT_FLOAT_EQ(out[static_cast<size_t>(h + c)], 0.5f * single[static_cast<size_t>(c)]);
  moe_forward(w, TopK{.m = 0, .k = 2, .ids = {}, .weights = {}}, x.data(), 0, out.data());
  routes.ids[1] = 4;
  EXPECT_THAT(error_of([&] { moe_forward(w, routes, x.data(), m, out.data()); }),
              ::testing::HasSubstr("selects expert 4"));
}

// A TP-2 checkpoint and the same layer stored unsliced (same seed, same hidden-side values):
// the partials differ from the full output, their sum equals it.
void expect_partials_sum_to_full(RotationLayout rotation, std::vector<int> bits) {
  TempDir sliced_dir, full_dir;
  auto spec = small_spec(rotation, 2);
  spec.num_experts = 4;
  spec.expert_bits = bits;
  spec.shared_h_values = true;
  write_synthetic_moe(sliced_dir.path(), spec);
  spec.rotation = RotationLayout::kPlain;
  spec.tp = 1;
  write_synthetic_moe(full_dir.path(), spec);

  std::vector<MoeLayerWeights> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(load(sliced_dir.path(), r, 2, 4));
  const auto full = load(full_dir.path(), 0, 1, 4);
  ASSERT_EQ(ranks[0].intermediate * 2, full.intermediate);

  const int64_t m = 6, h = full.hidden;
  const auto x = random_normal(static_cast<size_t>(m * h));
  const auto routes = random_routes(m, 4, 2);
  std::vector<float> want(x.size()), got(x.size()), p0(x.size()), p1(x.size());
  moe_forward(full, routes, x.data(), m, want.data());
  moe_forward_ranks(ranks, routes, x.data(), m, got.data());
  EXPECT_LE(rel_l2(std::span<const float>(got), std::span<const float>(want)), 1e-5);

  moe_forward(ranks[0], routes, x.data(), m, p0.data());
  moe_forward(ranks[1], routes, x.data(), m, p1.data());
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = p0[i] + p1[i];
  EXPECT_EQ(sum, got);
  EXPECT_GT(rel_l2(std::span<const float>(p0), std::span<const float>(want)), 0.1);

  // And the fp64 oracle of the unsliced layer.
  std::vector<DenseMlp> dense;
  for (const auto& e : full.experts) dense.push_back(DenseMlp::of(MlpView::of(e, full.codebook)));
  const auto want64 = dense_moe(dense, routes, x, m, h);
  EXPECT_LE(rel_l2(std::span<const float>(got), std::span<const double>(want64)), 1e-5);
}

TEST(ReferenceMoe, RankPartialsSumToFullPerExpertK3) {
  expect_partials_sum_to_full(RotationLayout::kPerExpert, {3, 3, 3, 3});
}

TEST(ReferenceMoe, RankPartialsSumToFullSharedHMixedK3K4) {
  expect_partials_sum_to_full(RotationLayout::kSharedH, {3, 4, 4, 3});
}

TEST(ReferenceMoe, RanksMustBeCompleteAndInOrder) {
  TempDir dir;
  write_synthetic_moe(dir.path(), small_spec(RotationLayout::kPerExpert, 2));
  std::vector<MoeLayerWeights> ranks;
  ranks.push_back(load(dir.path(), 1, 2, 4));
  ranks.push_back(load(dir.path(), 0, 2, 4));
  const auto x = random_normal(256);
  std::vector<float> out(256);
  const auto routes = random_routes(1, 4, 2);
  EXPECT_THAT(error_of([&] { moe_forward_ranks(ranks, routes, x.data(), 1, out.data()); }),
              ::testing::HasSubstr("entry 0 is layer 1 rank 1/2"));
  ranks.pop_back();
  EXPECT_THAT(error_of([&] { moe_forward_ranks(ranks, routes, x.data(), 1, out.data()); }),
              ::testing::HasSubstr("1 ranks given for a layer sliced over TP 2"));
}

}  // namespace
}  // namespace exl3::moe
