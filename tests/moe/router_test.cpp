// Routers against hand-computed cases: softmax top-k (renormalised or not), sigmoid + correction
// bias + grouped top-k, deterministic tie-breaking, and bad inputs.
#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/moe/router.hpp"
#include "moe_test_util.hpp"

namespace exl3::moe {
namespace {

using test::error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
float logit_of(double s) {
  return static_cast<float>(std::log(s / (1.0 - s)));
}

TEST(SoftmaxRouter, TopKRenormalisedAndNot) {
  const std::vector<float> logits = {1, 2, 3, 0};
  const double z = std::exp(0.0) + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  auto r = route_softmax(logits, 1, 4, {.top_k = 2, .renormalize = false});
  EXPECT_THAT(r.ids, ElementsAre(2, 1));
  EXPECT_NEAR(r.weights[0], std::exp(3.0) / z, 1e-7);
  EXPECT_NEAR(r.weights[1], std::exp(2.0) / z, 1e-7);
  r = route_softmax(logits, 1, 4, {.top_k = 2, .renormalize = true});
  EXPECT_THAT(r.ids, ElementsAre(2, 1));
  EXPECT_NEAR(r.weights[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-7);
  EXPECT_NEAR(r.weights[1], 1.0 / (1.0 + std::exp(1.0)), 1e-7);
}

TEST(SoftmaxRouter, TiesGoToTheLowerExpertId) {
  auto r = route_softmax(std::vector<float>{1, 1, 1, 1}, 1, 4, {.top_k = 2, .renormalize = false});
  EXPECT_THAT(r.ids, ElementsAre(0, 1));
  EXPECT_THAT(r.weights, ElementsAre(0.25f, 0.25f));
  r = route_softmax(std::vector<float>{0, 5, 5, 5, -1, 5}, 1, 6, {.top_k = 3, .renormalize = true});
  EXPECT_THAT(r.ids, ElementsAre(1, 2, 3));
  for (const float w : r.weights) EXPECT_NEAR(w, 1.0 / 3.0, 1e-7);
}

TEST(SoftmaxRouter, RandomRowsAreSortedAndSumToOne) {
  const int64_t m = 7, e = 16;
  const auto logits = test::random_normal(static_cast<size_t>(m * e), 2.0);
  const auto r = route_softmax(logits, m, e, {.top_k = 4, .renormalize = true});
  for (int64_t t = 0; t < m; ++t) {
    double sum = 0.0;
    for (int j = 0; j < 4; ++j) {
      const size_t o = static_cast<size_t>(t * 4 + j);
      sum += r.weights[o];
      if (j > 0) {
        EXPECT_GE(logits[static_cast<size_t>(t * e + r.ids[o - 1])],
                  logits[static_cast<size_t>(t * e + r.ids[o])]);
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

// The bias picks expert 3 over expert 2, but the weight is expert 3's plain sigmoid score.
TEST(SigmoidRouter, BiasChangesSelectionNotWeights) {
  const std::vector<float> logits = {0.0f, 1.0f, 0.5f, -1.0f};
  const std::vector<float> bias = {0, 0, 0, 1};
  SigmoidGroupedRouting cfg{.top_k = 2,
                            .n_group = 1,
                            .topk_group = 1,
                            .renormalize = false,
                            .routed_scaling_factor = 1.0f};
  auto r = route_sigmoid_grouped(logits, 1, 4, cfg);
  EXPECT_THAT(r.ids, ElementsAre(1, 2));
  cfg.correction_bias = bias;
  r = route_sigmoid_grouped(logits, 1, 4, cfg);
  EXPECT_THAT(r.ids, ElementsAre(3, 1));  // corrected 1.269 > 0.731
  EXPECT_NEAR(r.weights[0], sigmoid(-1.0), 1e-7);
  EXPECT_NEAR(r.weights[1], sigmoid(1.0), 1e-7);
  cfg.renormalize = true;
  cfg.routed_scaling_factor = 2.5f;
  r = route_sigmoid_grouped(logits, 1, 4, cfg);
  const double sum = sigmoid(-1.0) + sigmoid(1.0);
  EXPECT_NEAR(r.weights[0], sigmoid(-1.0) / sum * 2.5, 1e-6);
  EXPECT_NEAR(r.weights[1], sigmoid(1.0) / sum * 2.5, 1e-6);
}

// Groups of two, scored by the sum of their top-2: the single best expert (0) sits in a weak
// group and is never chosen.
TEST(SigmoidRouter, GroupedTopKUsesTopTwoSums) {
  const std::vector<double> s = {0.95, 0.05, 0.6, 0.6, 0.55, 0.55, 0.1, 0.1};
  std::vector<float> logits;
  for (const double v : s) logits.push_back(logit_of(v));
  SigmoidGroupedRouting cfg{.top_k = 2,
                            .n_group = 4,
                            .topk_group = 2,
                            .renormalize = true,
                            .routed_scaling_factor = 1.0f};
  auto r = route_sigmoid_grouped(logits, 1, 8, cfg);
  EXPECT_THAT(r.ids, ElementsAre(2, 3));  // equal scores: the lower id first
  EXPECT_NEAR(r.weights[0], 0.5, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.5, 1e-6);
  cfg.top_k = 3;  // the third pick comes from the second group (4), not from expert 0
  r = route_sigmoid_grouped(logits, 1, 8, cfg);
  EXPECT_THAT(r.ids, ElementsAre(2, 3, 4));
  cfg.n_group = 1;
  cfg.topk_group = 1;
  cfg.top_k = 2;
  r = route_sigmoid_grouped(logits, 1, 8, cfg);
  EXPECT_THAT(r.ids, ElementsAre(0, 2));
}

TEST(SigmoidRouter, TiedGroupsGoToTheLowerGroupId) {
  const auto r = route_sigmoid_grouped(std::vector<float>{0, 0, 0, 0}, 1, 4,
                                       {.top_k = 2, .n_group = 2, .topk_group = 1});
  EXPECT_THAT(r.ids, ElementsAre(0, 1));
}

// With every corrected score negative, experts of dropped groups stay out (masked to -inf, not 0).
TEST(SigmoidRouter, DroppedGroupsStayOutWhenScoresAreNegative) {
  const std::vector<float> bias(4, -2.0f);
  const auto r =
      route_sigmoid_grouped(std::vector<float>{0, 0, -5, -5}, 1, 4,
                            {.top_k = 2, .n_group = 2, .topk_group = 1, .correction_bias = bias});
  EXPECT_THAT(r.ids, ElementsAre(0, 1));
}

TEST(Router, RejectsBadInput) {
  std::vector<float> logits = {0, 1, NAN, 2};
  EXPECT_THAT(error_of([&] { route_softmax(logits, 1, 4, {}); }), HasSubstr("logit [0, 2]"));
  logits[2] = 0;
  EXPECT_THAT(error_of([&] { route_softmax(logits, 1, 4, {.top_k = 5}); }), HasSubstr("top_k 5"));
  EXPECT_THAT(error_of([&] { route_softmax(logits, 2, 4, {}); }), HasSubstr("expected m x E"));
  EXPECT_THAT(error_of([&] { route_sigmoid_grouped(logits, 1, 4, {.top_k = 2, .n_group = 3}); }),
              HasSubstr("n_group 3"));
  EXPECT_THAT(error_of([&] {
                route_sigmoid_grouped(logits, 1, 4, {.top_k = 3, .n_group = 2, .topk_group = 1});
              }),
              HasSubstr("top_k 3 exceeds"));
  const std::vector<float> bias(3, 0.0f);
  EXPECT_THAT(
      error_of([&] { route_sigmoid_grouped(logits, 1, 4, {.top_k = 2, .correction_bias = bias}); }),
      HasSubstr("e_score_correction_bias"));
}

}  // namespace
}  // namespace exl3::moe
