// The CUDA layers' planners (exl3/cuda/plan.hpp): host arithmetic only, so this file builds and
// is tested without CUDA.
#include "exl3/cuda/plan.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"

namespace exl3::cuda {

namespace {

size_t align_up(size_t v) {
  return (v + kCarveAlign - 1) / kCarveAlign * kCarveAlign;
}

// Hands out consecutive aligned spans.
class Carver {
 public:
  Span take(size_t bytes) {
    const Span s{off_, bytes};
    off_ += align_up(bytes);
    return s;
  }
  size_t bytes() const { return off_; }

 private:
  size_t off_ = 0;
};

// Every carve grows with m inside a path, so the largest m of each reachable path bounds the
// workspace over 1..max_m. `ends` are those path ends (clamped to max_m; < 1 skipped).
template <typename PlanAt>
size_t bound_over_paths(std::initializer_list<int64_t> ends, int64_t max_m, PlanAt plan_at) {
  size_t bytes = 0;
  for (int64_t m : ends) {
    if (m >= 1) bytes = std::max(bytes, plan_at(std::min(m, max_m)).workspace.bytes);
  }
  return bytes;
}

}  // namespace

// ---- EXL3 linear -------------------------------------------------------------------------------

const char* path_name(LinearPath p) {
  switch (p) {
    case LinearPath::kGemv:
      return "gemv";
    case LinearPath::kMma:
      return "mma";
    default:
      return "cublas";
  }
}

int linear_split_k(int64_t k, int64_t n, int sms, int blocks_per_sm) {
  const int64_t slots = static_cast<int64_t>(sms) * blocks_per_sm;
  const int64_t blocks_x = n / 128;
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(16, k / 16 / 8));
  int64_t best = 1;
  double best_eff = 0.0;
  for (int64_t s = 1; s <= cap; ++s) {
    const double waves = static_cast<double>(blocks_x * s) / static_cast<double>(slots);
    const double score = waves / std::ceil(waves);  // fill of the GPU over all waves
    if (score >= 0.88) return static_cast<int>(s);
    if (score > best_eff) {
      best_eff = score;
      best = s;
    }
  }
  return static_cast<int>(best);
}

LinearPath linear_path(const LinearOptions& opts, int64_t m) {
  if (m <= opts.gemv_max_m) return LinearPath::kGemv;
  return m <= opts.mma_max_m ? LinearPath::kMma : LinearPath::kCublas;
}

int linear_splits(const LinearShape& s, const LinearOptions& opts, const LinearTraits& t,
                  LinearPath p) {
  if (p == LinearPath::kCublas) return 1;
  if (opts.split_k > 0) return opts.split_k;
  return linear_split_k(s.in, s.out, t.sms,
                        p == LinearPath::kGemv ? t.gemv_blocks_per_sm : t.mma_blocks_per_sm);
}

LinearPlan plan_linear(const LinearShape& s, const LinearOptions& opts, const LinearTraits& t,
                       int64_t m) {
  LinearPlan p;
  p.m = m;
  p.path = linear_path(opts, m);
  p.split_k = linear_splits(s, opts, t, p.path);
  const int64_t k = s.in, n = s.out;
  Carver c;
  p.workspace.xr = c.take(static_cast<size_t>(m * k) * 2);
  p.workspace.row_scale = c.take(static_cast<size_t>(m) * 4);
  p.workspace.partial = c.take(static_cast<size_t>(p.split_k) * m * n * 4);
  if (p.path == LinearPath::kCublas) p.workspace.w_hat = c.take(static_cast<size_t>(k * n) * 2);
  p.workspace.bytes = c.bytes();
  return p;
}

size_t linear_workspace_bytes(const LinearShape& s, const LinearOptions& opts,
                              const LinearTraits& t) {
  return bound_over_paths({opts.gemv_max_m, opts.mma_max_m, opts.max_m}, opts.max_m,
                          [&](int64_t m) { return plan_linear(s, opts, t, m); });
}

// ---- MXFP8 linear ------------------------------------------------------------------------------

const char* mxfp8_path_name(Mxfp8Path p) {
  switch (p) {
    case Mxfp8Path::kGemv:
      return "gemv";
    default:
      return "cublas";
  }
}

int mxfp8_split_k(int64_t k, int64_t n, int sms) {
  const int64_t tiles = (n + kMxfp8PlanTileRows - 1) / kMxfp8PlanTileRows;
  if (tiles >= sms) return 1;
  const int64_t want = (4LL * sms + tiles - 1) / tiles;
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(16, k / 32 / 16));
  return static_cast<int>(std::clamp<int64_t>(want, 1, cap));
}

Mxfp8Path mxfp8_path(const Mxfp8Options& opts, int64_t m) {
  return m <= opts.gemv_max_m ? Mxfp8Path::kGemv : Mxfp8Path::kCublas;
}

int mxfp8_splits(const Mxfp8Shape& s, const Mxfp8Options& opts, const Mxfp8Traits& t, Mxfp8Path p) {
  if (p == Mxfp8Path::kCublas) return 1;
  return opts.split_k > 0 ? opts.split_k : mxfp8_split_k(s.in, s.out, t.sms);
}

Mxfp8Plan plan_mxfp8(const Mxfp8Shape& s, const Mxfp8Options& opts, const Mxfp8Traits& t,
                     int64_t m) {
  Mxfp8Plan p;
  p.m = m;
  p.path = mxfp8_path(opts, m);
  p.split_k = mxfp8_splits(s, opts, t, p.path);
  const bool cublas = p.path == Mxfp8Path::kCublas;
  Carver c;
  // Unsplit GEMVs write y directly; the cuBLAS output goes through fp32 when a bias is added.
  if (p.split_k > 1 || (cublas && s.bias)) {
    p.workspace.partial = c.take(static_cast<size_t>(std::max(p.split_k, 1)) * m * s.out * 4);
  }
  if (cublas) p.workspace.w_bf16 = c.take(static_cast<size_t>(s.in * s.out) * 2);
  p.workspace.bytes = c.bytes();
  return p;
}

size_t mxfp8_workspace_bytes(const Mxfp8Shape& s, const Mxfp8Options& opts, const Mxfp8Traits& t) {
  return bound_over_paths({opts.gemv_max_m, opts.max_m}, opts.max_m,
                          [&](int64_t m) { return plan_mxfp8(s, opts, t, m); });
}

// ---- JSON --------------------------------------------------------------------------------------

namespace {

template <typename Enum, size_t N>
Enum enum_of(const nlohmann::json& j, const char* field, const Enum (&values)[N],
             const char* (*name)(Enum)) {
  const auto s = j.at(field).get<std::string>();
  for (const Enum v : values) {
    if (s == name(v)) return v;
  }
  fail("plan JSON: {} '{}' is not a known path", field, s);
}

constexpr LinearPath kLinearPaths[] = {LinearPath::kGemv, LinearPath::kMma, LinearPath::kCublas};
constexpr Mxfp8Path kMxfp8Paths[] = {Mxfp8Path::kGemv, Mxfp8Path::kCublas};

}  // namespace

void to_json(nlohmann::json& j, const Span& s) {
  j = {{"offset", s.offset}, {"bytes", s.bytes}};
}

void from_json(const nlohmann::json& j, Span& s) {
  j.at("offset").get_to(s.offset);
  j.at("bytes").get_to(s.bytes);
}

void to_json(nlohmann::json& j, const LinearPlan& p) {
  const auto& w = p.workspace;
  j = {{"m", p.m},
       {"path", path_name(p.path)},
       {"split_k", p.split_k},
       {"workspace",
        {{"bytes", w.bytes},
         {"xr", w.xr},
         {"row_scale", w.row_scale},
         {"partial", w.partial},
         {"w_hat", w.w_hat}}}};
}

void from_json(const nlohmann::json& j, LinearPlan& p) {
  j.at("m").get_to(p.m);
  p.path = enum_of(j, "path", kLinearPaths, path_name);
  j.at("split_k").get_to(p.split_k);
  const auto& w = j.at("workspace");
  w.at("bytes").get_to(p.workspace.bytes);
  w.at("xr").get_to(p.workspace.xr);
  w.at("row_scale").get_to(p.workspace.row_scale);
  w.at("partial").get_to(p.workspace.partial);
  w.at("w_hat").get_to(p.workspace.w_hat);
}

void to_json(nlohmann::json& j, const Mxfp8Plan& p) {
  const auto& w = p.workspace;
  j = {{"m", p.m},
       {"path", mxfp8_path_name(p.path)},
       {"split_k", p.split_k},
       {"workspace", {{"bytes", w.bytes}, {"partial", w.partial}, {"w_bf16", w.w_bf16}}}};
}

void from_json(const nlohmann::json& j, Mxfp8Plan& p) {
  j.at("m").get_to(p.m);
  p.path = enum_of(j, "path", kMxfp8Paths, mxfp8_path_name);
  j.at("split_k").get_to(p.split_k);
  const auto& w = j.at("workspace");
  w.at("bytes").get_to(p.workspace.bytes);
  w.at("partial").get_to(p.workspace.partial);
  w.at("w_bf16").get_to(p.workspace.w_bf16);
}

}  // namespace exl3::cuda
