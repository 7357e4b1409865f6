// CPU reference MoE (see reference.hpp). Routes are grouped per expert so each expert's tiles
// are decoded once per call; every route's output is kept apart and the top-k sum runs per token
// in route order, like the fused kernel's final FP32 reduction.
#include "exl3/moe/reference.hpp"

#include <algorithm>
#include <cmath>

#include "exl3/error.hpp"

namespace exl3::moe {
namespace {

int64_t hidden_of(const MlpView& mlp) {
  return mlp.gate.in_features;
}

void check_mlp(const MlpView& mlp, int64_t hidden, const char* what, size_t index) {
  const int64_t i = mlp.gate.out_features;
  if (mlp.gate.in_features != hidden || mlp.up.in_features != hidden ||
      mlp.down.out_features != hidden || mlp.up.out_features != i || mlp.down.in_features != i) {
    fail(
        "moe_forward: {} {} is gate {}x{}, up {}x{}, down {}x{}; expected [H -> I] twice and "
        "[I -> H] with H = {}",
        what, index, mlp.gate.in_features, mlp.gate.out_features, mlp.up.in_features,
        mlp.up.out_features, mlp.down.in_features, mlp.down.out_features, hidden);
  }
}

void add_shared(std::span<const MlpView> shared, const float* x, int64_t m, int64_t hidden,
                float* out) {
  std::vector<float> y(static_cast<size_t>(m * hidden));
  for (size_t s = 0; s < shared.size(); ++s) {
    check_mlp(shared[s], hidden, "shared expert", s);
    mlp_forward(shared[s], x, m, y.data());
    for (size_t i = 0; i < y.size(); ++i) out[i] += y[i];
  }
}

void routed_views(std::span<const MlpView> experts, const TopK& routes, const float* x, int64_t m,
                  float* out) {
  if (experts.empty()) fail("moe_forward: no experts");
  const int64_t hidden = hidden_of(experts[0]);
  for (size_t e = 0; e < experts.size(); ++e) check_mlp(experts[e], hidden, "expert", e);
  routed_forward(static_cast<int>(experts.size()), hidden, routes, x, m, out,
                 [&](int e, const float* xs, int64_t rows, float* ys) {
                   mlp_forward(experts[static_cast<size_t>(e)], xs, rows, ys);
                 });
}

std::vector<MlpView> views_of(const MoeLayerWeights& w) {
  std::vector<MlpView> v;
  v.reserve(w.experts.size());
  for (const auto& e : w.experts) v.push_back(MlpView::of(e, w.codebook));
  return v;
}

}  // namespace

MlpView MlpView::of(const ExpertWeights& e, trellis::Codebook cb) {
  return {e.gate.view(cb), e.up.view(cb), e.down.view(cb)};
}

void routed_forward(int num_experts, int64_t hidden, const TopK& routes, const float* x, int64_t m,
                    float* out, const ExpertFn& expert) {
  if (num_experts <= 0) fail("moe_forward: no experts");
  const int k = routes.k;
  if (routes.m != m || k <= 0 || routes.ids.size() != static_cast<size_t>(m * k) ||
      routes.weights.size() != routes.ids.size()) {
    fail("moe_forward: routes are {} x {} ({} ids, {} weights), expected {} tokens", routes.m, k,
         routes.ids.size(), routes.weights.size(), m);
  }
  // Route (t, j) lives at row t*k + j of route_out.
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(num_experts));
  for (size_t r = 0; r < routes.ids.size(); ++r) {
    const int32_t id = routes.ids[r];
    if (id < 0 || id >= num_experts) {
      fail("moe_forward: token {} route {} selects expert {}, outside 0..{}",
           r / static_cast<size_t>(k), r % static_cast<size_t>(k), id, num_experts - 1);
    }
    by_expert[static_cast<size_t>(id)].push_back(static_cast<int64_t>(r));
  }
  const auto h = static_cast<size_t>(hidden);
  std::vector<float> route_out(routes.ids.size() * h);
  std::vector<float> xs, ys;
  for (int e = 0; e < num_experts; ++e) {
    const auto& rows = by_expert[static_cast<size_t>(e)];
    if (rows.empty()) continue;
    xs.resize(rows.size() * h);
    ys.resize(rows.size() * h);
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* src = x + (rows[i] / k) * hidden;
      std::copy_n(src, h, xs.begin() + static_cast<std::ptrdiff_t>(i * h));
    }
    expert(e, xs.data(), static_cast<int64_t>(rows.size()), ys.data());
    for (size_t i = 0; i < rows.size(); ++i) {
      std::copy_n(
          ys.begin() + static_cast<std::ptrdiff_t>(i * h), h,
          route_out.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(rows[i]) * h));
    }
  }
  for (int64_t t = 0; t < m; ++t) {
    float* o = out + t * hidden;
    std::fill_n(o, h, 0.0f);
    for (int j = 0; j < k; ++j) {
      const size_t r = static_cast<size_t>(t * k + j);
      const float w = routes.weights[r];
      const float* d = route_out.data() + r * h;
      for (size_t c = 0; c < h; ++c) o[c] += w * d[c];
    }
  }
}

void mlp_forward(const MlpView& mlp, const float* x, int64_t m, float* y) {
  const int64_t i = mlp.gate.out_features;
  std::vector<float> g(static_cast<size_t>(m * i)), u(g.size());
  cpu::linear_forward(mlp.gate, x, cpu::ActDType::kF32, m, g.data());
  cpu::linear_forward(mlp.up, x, cpu::ActDType::kF32, m, u.data());
  for (size_t n = 0; n < g.size(); ++n) g[n] = g[n] / (1.0f + std::exp(-g[n])) * u[n];  // SiLU*up
  cpu::linear_forward(mlp.down, g.data(), cpu::ActDType::kF32, m, y);
}

void moe_forward(std::span<const MlpView> experts, const TopK& routes, const float* x, int64_t m,
                 float* out, std::span<const MlpView> shared) {
  routed_views(experts, routes, x, m, out);
  add_shared(shared, x, m, hidden_of(experts[0]), out);
}

void moe_forward(const MoeLayerWeights& w, const TopK& routes, const float* x, int64_t m,
                 float* out, std::span<const MlpView> shared) {
  const auto views = views_of(w);
  moe_forward(views, routes, x, m, out, shared);
}

void moe_forward_ranks(std::span<const MoeLayerWeights> ranks, const TopK& routes, const float* x,
                       int64_t m, float* out, std::span<const MlpView> shared) {
  if (ranks.empty()) fail("moe_forward_ranks: no ranks");
  const auto& r0 = ranks[0];
  if (static_cast<int>(ranks.size()) != r0.tp) {
    fail("moe_forward_ranks: {} ranks given for a layer sliced over TP {}", ranks.size(), r0.tp);
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto& w = ranks[r];
    if (w.rank != static_cast<int>(r) || w.layer != r0.layer || w.tp != r0.tp ||
        w.hidden != r0.hidden || w.num_experts() != r0.num_experts()) {
      fail(
          "moe_forward_ranks: entry {} is layer {} rank {}/{} (H {}, {} experts); expected "
          "layer {} rank {}/{} (H {}, {} experts)",
          r, w.layer, w.rank, w.tp, w.hidden, w.num_experts(), r0.layer, r, r0.tp, r0.hidden,
          r0.num_experts());
    }
  }
  const auto n = static_cast<size_t>(m * r0.hidden);
  std::fill_n(out, n, 0.0f);
  std::vector<float> partial(n);
  for (const auto& w : ranks) {
    moe_forward(w, routes, x, m, partial.data());
    for (size_t i = 0; i < n; ++i) out[i] += partial[i];
  }
  add_shared(shared, x, m, r0.hidden, out);
}

}  // namespace exl3::moe
