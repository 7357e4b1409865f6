// FP32 MoE routers (see router.hpp).
#include "exl3/moe/router.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "exl3/error.hpp"

namespace exl3::moe {
namespace {

// Indices 0..n-1 ordered by descending score, ties by ascending index (a strict weak order, so
// the result does not depend on the sort algorithm).
std::vector<int32_t> rank_desc(std::span<const float> score, int keep) {
  std::vector<int32_t> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  const auto better = [&](int32_t a, int32_t b) {
    return score[static_cast<size_t>(a)] != score[static_cast<size_t>(b)]
               ? score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)]
               : a < b;
  };
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), better);
  idx.resize(static_cast<size_t>(keep));
  return idx;
}

void check_logits(std::span<const float> logits, int64_t m, int64_t e, int top_k, const char* who) {
  if (m < 0 || e <= 0 || static_cast<int64_t>(logits.size()) != m * e) {
    fail("{}: logits hold {} values, expected m x E = {} x {}", who, logits.size(), m, e);
  }
  if (top_k <= 0 || top_k > e) fail("{}: top_k {} outside 1..{} (E)", who, top_k, e);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      fail("{}: logit [{}, {}] is {}; routing needs finite logits", who,
           static_cast<int64_t>(i) / e, static_cast<int64_t>(i) % e, logits[i]);
    }
  }
}

TopK make_topk(int64_t m, int k) {
  TopK t;
  t.m = m;
  t.k = k;
  t.ids.resize(static_cast<size_t>(m * k));
  t.weights.resize(static_cast<size_t>(m * k));
  return t;
}

}  // namespace

TopK route_softmax(std::span<const float> logits, int64_t m, int64_t num_experts,
                   const SoftmaxRouting& r) {
  check_logits(logits, m, num_experts, r.top_k, "route_softmax");
  TopK out = make_topk(m, r.top_k);
  const auto e = static_cast<size_t>(num_experts);
  std::vector<float> p(e);
  for (int64_t t = 0; t < m; ++t) {
    const auto row = logits.subspan(static_cast<size_t>(t) * e, e);
    const float mx = *std::max_element(row.begin(), row.end());
    float sum = 0.0f;
    for (size_t i = 0; i < e; ++i) sum += p[i] = std::exp(row[i] - mx);
    for (auto& v : p) v /= sum;
    const auto ids = rank_desc(p, r.top_k);
    float chosen = 0.0f;
    for (const int32_t id : ids) chosen += p[static_cast<size_t>(id)];
    for (int j = 0; j < r.top_k; ++j) {
      const size_t o = static_cast<size_t>(t * r.top_k + j);
      out.ids[o] = ids[static_cast<size_t>(j)];
      const float w = p[static_cast<size_t>(ids[static_cast<size_t>(j)])];
      out.weights[o] = r.renormalize ? w / chosen : w;
    }
  }
  return out;
}

TopK route_sigmoid_grouped(std::span<const float> logits, int64_t m, int64_t num_experts,
                           const SigmoidGroupedRouting& r) {
  const char* who = "route_sigmoid_grouped";
  check_logits(logits, m, num_experts, r.top_k, who);
  const auto e = static_cast<size_t>(num_experts);
  if (!r.correction_bias.empty() && r.correction_bias.size() != e) {
    fail("{}: e_score_correction_bias has {} values, expected E = {}", who,
         r.correction_bias.size(), e);
  }
  if (r.n_group <= 0 || num_experts % r.n_group != 0) {
    fail("{}: n_group {} does not divide E = {}", who, r.n_group, num_experts);
  }
  const auto group_size = static_cast<size_t>(num_experts / r.n_group);
  if (r.topk_group <= 0 || r.topk_group > r.n_group) {
    fail("{}: topk_group {} outside 1..{} (n_group)", who, r.topk_group, r.n_group);
  }
  if (static_cast<size_t>(r.top_k) > static_cast<size_t>(r.topk_group) * group_size) {
    fail("{}: top_k {} exceeds the {} experts of the {} eligible groups", who, r.top_k,
         static_cast<size_t>(r.topk_group) * group_size, r.topk_group);
  }

  TopK out = make_topk(m, r.top_k);
  std::vector<float> s(e), c(e), group_score(static_cast<size_t>(r.n_group));
  for (int64_t t = 0; t < m; ++t) {
    const auto row = logits.subspan(static_cast<size_t>(t) * e, e);
    for (size_t i = 0; i < e; ++i) {
      s[i] = 1.0f / (1.0f + std::exp(-row[i]));
      c[i] = s[i] + (r.correction_bias.empty() ? 0.0f : r.correction_bias[i]);
    }
    // Group score: the sum of the group's two best corrected scores.
    for (size_t g = 0; g < group_score.size(); ++g) {
      const auto grp = std::span<const float>(c).subspan(g * group_size, group_size);
      const auto best = rank_desc(grp, std::min<int>(2, static_cast<int>(group_size)));
      float sum = 0.0f;
      for (const int32_t b : best) sum += grp[static_cast<size_t>(b)];
      group_score[g] = sum;
    }
    // Experts outside the chosen groups can never be picked.
    std::vector<float> masked(e, -INFINITY);
    for (const int32_t g : rank_desc(group_score, r.topk_group)) {
      const size_t b = static_cast<size_t>(g) * group_size;
      std::copy_n(c.begin() + static_cast<std::ptrdiff_t>(b), group_size,
                  masked.begin() + static_cast<std::ptrdiff_t>(b));
    }
    const auto ids = rank_desc(masked, r.top_k);
    float chosen = 0.0f;
    for (const int32_t id : ids) chosen += s[static_cast<size_t>(id)];
    // The same operation order as transformers: w / (sum + 1e-20), then * scaling factor.
    for (int j = 0; j < r.top_k; ++j) {
      const size_t o = static_cast<size_t>(t * r.top_k + j);
      out.ids[o] = ids[static_cast<size_t>(j)];
      float w = s[static_cast<size_t>(out.ids[o])];
      if (r.renormalize) w /= chosen + 1e-20f;
      out.weights[o] = w * r.routed_scaling_factor;
    }
  }
  return out;
}

}  // namespace exl3::moe
