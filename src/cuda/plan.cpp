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

// Hands out consecutive aligned spans.
class Carver {
 public:
  Span take(size_t bytes) {
    const Span s{off_, bytes};
    off_ += carve_align_up(bytes);
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

int linear_split_k(int64_t k, int64_t n, int sms, int blocks_per_sm, int max_splits,
                   int min_tiles) {
  const int64_t slots = static_cast<int64_t>(sms) * blocks_per_sm;
  const int64_t blocks_x = n / 128;
  const int64_t cap = std::max<int64_t>(
      1, std::min<int64_t>(std::max(1, max_splits), k / 16 / std::max(1, min_tiles)));
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
  if (p == LinearPath::kGemv) {
    return linear_split_k(s.in, s.out, t.sms, t.gemv_blocks_per_sm, opts.gemv_max_splits,
                          opts.gemv_min_split_tiles);
  }
  return linear_split_k(s.in, s.out, t.sms, t.mma_blocks_per_sm);
}

int gemv_staged_chunks(int64_t k, int splits) {
  const int64_t tiles = k / 16;
  int most = 0;
  for (int64_t sp = 0; sp < splits; ++sp) {
    const int64_t begin = tiles * sp / splits, end = tiles * (sp + 1) / splits;
    most = std::max(most, static_cast<int>((end + 7) / 8 - begin / 8));
  }
  return most;
}

LinearPlan plan_linear(const LinearShape& s, const LinearOptions& opts, const LinearTraits& t,
                       int64_t m) {
  LinearPlan p;
  p.m = m;
  p.path = linear_path(opts, m);
  p.split_k = linear_splits(s, opts, t, p.path);
  const int64_t k = s.in, n = s.out;
  if (p.path == LinearPath::kGemv && opts.gemv_fused_rotation && m <= kGemvStagedMaxRows &&
      m * k * 4 <= kGemvStagedMaxReadBytes) {
    const int chunks = gemv_staged_chunks(k, p.split_k);
    if (m * chunks * 256 <= kGemvStagedMaxSmemBytes) p.staged_chunks = chunks;
  }
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

// ---- fused MoE ---------------------------------------------------------------------------------

const char* moe_path_name(MoePath p) {
  return p == MoePath::kDecode ? "decode" : "prefill";
}

MoePath moe_path(const MoeOptions& opts, int64_t m) {
  return m <= opts.decode_max_m ? MoePath::kDecode : MoePath::kPrefill;
}

int moe_split_k(int64_t base_blocks, int64_t k_tiles, int sms, int64_t max_splits,
                int64_t min_tiles) {
  const int64_t target = 8LL * sms;
  const int64_t cap = std::max<int64_t>(
      1, std::min<int64_t>(max_splits, k_tiles / std::max<int64_t>(1, min_tiles)));
  const int64_t s = (target + base_blocks - 1) / base_blocks;
  return static_cast<int>(std::clamp<int64_t>(s, 1, cap));
}

std::pair<int, int> moe_decode_splits(const MoeShape& s, const MoeOptions& opts,
                                      const MoeTraits& t) {
  const int64_t min_tiles = opts.decode_min_split_tiles;
  return {moe_split_k(2 * (s.intermediate / 128) * s.top_k, s.hidden / 16, t.sms, 32, min_tiles),
          moe_split_k((s.hidden / 128) * s.top_k, s.intermediate / 16, t.sms, 32, min_tiles)};
}

MoeArena moe_arena(const MoeShape& s, MoePath p, int64_t cap_tokens, int split_fc1, int split_fc2) {
  MoeArena a;
  Carver c;
  const int64_t H = s.hidden, I = s.intermediate;
  const int64_t cap = cap_tokens * s.top_k;  // route slots
  const int64_t rot_rows = s.shared_h ? cap_tokens : cap;
  if (p == MoePath::kPrefill) {
    const int64_t max_groups = cap / kMoePrefillGroup + s.experts;
    a.counts = c.take(4 * static_cast<size_t>(s.experts));
    a.fill = c.take(4 * static_cast<size_t>(s.experts));
    a.offsets = c.take(4 * static_cast<size_t>(s.experts));
    a.num_groups = c.take(4);
    a.group_expert = c.take(4 * static_cast<size_t>(max_groups));
    a.group_begin = c.take(4 * static_cast<size_t>(max_groups));
    a.group_count = c.take(4 * static_cast<size_t>(max_groups));
    a.slot_of_route = c.take(4 * static_cast<size_t>(cap));
    a.route_of_slot = c.take(4 * static_cast<size_t>(cap));
  }
  a.xg = c.take(2 * static_cast<size_t>(rot_rows * H));
  a.xu = c.take(2 * static_cast<size_t>(rot_rows * H));
  a.scale_g = c.take(4 * static_cast<size_t>(rot_rows));
  a.scale_u = c.take(4 * static_cast<size_t>(rot_rows));
  a.partial1 = c.take(4 * static_cast<size_t>(split_fc1 * cap * 2 * I));
  a.act = c.take(2 * static_cast<size_t>(cap * I));
  a.act_scale = c.take(4 * static_cast<size_t>(cap));
  a.partial2 = c.take(4 * static_cast<size_t>(split_fc2 * cap * H));
  a.bytes = c.bytes();
  return a;
}

int64_t moe_prefill_chunk(const MoeShape& s, const MoeOptions& opts) {
  if (opts.capacity <= opts.decode_max_m) return 0;
  if (opts.prefill_chunk > 0) return std::min(opts.prefill_chunk, opts.capacity);
  // The most tokens whose arena fits the budget (at least 1).
  const size_t budget = static_cast<size_t>(opts.arena_budget_mib) << 20;
  int64_t lo = 1, hi = opts.capacity;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (moe_arena(s, MoePath::kPrefill, mid, 1, 1).bytes <= budget) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

bool moe_tier_passes(MoeOptions::Tiers tiers, int tier_count, MoePath p) {
  if (tier_count <= 1) return true;  // one K: its own kernel, one pass
  switch (tiers) {
    case MoeOptions::Tiers::kGrid:
      return false;
    case MoeOptions::Tiers::kPasses:
      return true;
    case MoeOptions::Tiers::kAuto:
      break;
  }
  // Measured on the H200 (GLM-5.2 geometry, 148 K3 + 108 K4,
  // bench/results/2026-11-29_h200_moe_tiers_*): per-K passes are 4-24% slower than the one grid at
  // every m from 1 to 3072 (each pass pays its own launch, fill and tail), so auto keeps the grid
  // on both paths.
  (void)p;
  return false;
}

namespace {

int64_t decode_cap_tokens(const MoeOptions& opts) {
  return std::min(opts.decode_max_m, opts.capacity);
}

size_t arena_bytes_with(const MoeShape& s, const MoeOptions& opts, const MoeTraits& t,
                        int64_t chunk) {
  const auto [s1, s2] = moe_decode_splits(s, opts, t);
  size_t bytes = moe_arena(s, MoePath::kDecode, decode_cap_tokens(opts), s1, s2).bytes;
  if (chunk > 0) bytes = std::max(bytes, moe_arena(s, MoePath::kPrefill, chunk, 1, 1).bytes);
  return bytes;
}

// A prefill pass of `tokens` live tokens: split-K from its grid, within the arena (partials hold
// chunk * top_k routes per split).
MoePass prefill_pass(const MoeShape& s, const MoeOptions& opts, const MoeTraits& t, int64_t chunk,
                     int64_t tokens, int64_t count) {
  MoePass p;
  p.tokens = tokens;
  p.count = count;
  p.routes = tokens * s.top_k;
  p.group = moe_prefill_group(s, opts, p.routes);
  p.max_groups = p.routes / p.group + std::min<int64_t>(s.experts, p.routes);
  const int64_t room = std::max<int64_t>(1, chunk / tokens);
  p.split_fc1 = moe_split_k(2 * (s.intermediate / 128) * p.max_groups, s.hidden / 16, t.sms, room);
  p.split_fc2 = moe_split_k((s.hidden / 128) * p.max_groups, s.intermediate / 16, t.sms, room);
  return p;
}

}  // namespace

int moe_prefill_group(const MoeShape& s, const MoeOptions& opts, int64_t routes) {
  if (!moe_prefill_group_valid(opts.prefill_group)) {
    fail("MoE options: prefill_group {} is not 0 (automatic), {} or {}", opts.prefill_group,
         kMoePrefillGroup, kMoePrefillGroupGemm);
  }
  if (opts.prefill_group != 0) return static_cast<int>(opts.prefill_group);
  return routes >= kMoeGemmMinRoutesPerExpert * s.experts ? kMoePrefillGroupGemm : kMoePrefillGroup;
}

size_t moe_arena_bytes(const MoeShape& s, const MoeOptions& opts, const MoeTraits& t) {
  return arena_bytes_with(s, opts, t, moe_prefill_chunk(s, opts));
}

MoePlan plan_moe(const MoeShape& s, const MoeOptions& opts, const MoeTraits& t, int64_t m) {
  MoePlan p;
  p.m = m;
  p.path = moe_path(opts, m);
  p.tier_passes = moe_tier_passes(opts.tiers, s.tier_count, p.path);
  p.chunk = moe_prefill_chunk(s, opts);
  p.arena_bytes = arena_bytes_with(s, opts, t, p.chunk);
  if (p.path == MoePath::kDecode) {
    const auto [s1, s2] = moe_decode_splits(s, opts, t);
    p.arena = moe_arena(s, MoePath::kDecode, decode_cap_tokens(opts), s1, s2);
    p.full.tokens = m;
    p.full.count = 1;
    p.full.split_fc1 = s1;
    p.full.split_fc2 = s2;
    p.full.routes = m * s.top_k;
    p.full.max_groups = p.full.routes;
    return p;
  }
  p.arena = moe_arena(s, MoePath::kPrefill, p.chunk, 1, 1);
  if (p.chunk < 1 || m < 1) return p;  // no prefill path here: run() refuses this m
  if (m / p.chunk > 0) p.full = prefill_pass(s, opts, t, p.chunk, p.chunk, m / p.chunk);
  if (m % p.chunk > 0) p.tail = prefill_pass(s, opts, t, p.chunk, m % p.chunk, 1);
  return p;
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
constexpr MoePath kMoePaths[] = {MoePath::kDecode, MoePath::kPrefill};

// The arena's spans by name, in carve order (one list for both directions).
template <typename Arena, typename F>
void for_each_span(Arena& a, F f) {
  f("counts", a.counts);
  f("fill", a.fill);
  f("offsets", a.offsets);
  f("num_groups", a.num_groups);
  f("group_expert", a.group_expert);
  f("group_begin", a.group_begin);
  f("group_count", a.group_count);
  f("slot_of_route", a.slot_of_route);
  f("route_of_slot", a.route_of_slot);
  f("xg", a.xg);
  f("xu", a.xu);
  f("scale_g", a.scale_g);
  f("scale_u", a.scale_u);
  f("partial1", a.partial1);
  f("act", a.act);
  f("act_scale", a.act_scale);
  f("partial2", a.partial2);
}

}  // namespace

void to_json(nlohmann::json& j, const Span& s) {
  j = {{"offset", s.offset}, {"bytes", s.bytes}};
}

void from_json(const nlohmann::json& j, Span& s) {
  j.at("offset").get_to(s.offset);
  j.at("bytes").get_to(s.bytes);
}

void to_json(nlohmann::json& j, const MoePass& p) {
  j = {{"tokens", p.tokens},       {"count", p.count},   {"split_fc1", p.split_fc1},
       {"split_fc2", p.split_fc2}, {"routes", p.routes}, {"max_groups", p.max_groups},
       {"group", p.group}};
}

void from_json(const nlohmann::json& j, MoePass& p) {
  j.at("tokens").get_to(p.tokens);
  j.at("count").get_to(p.count);
  j.at("split_fc1").get_to(p.split_fc1);
  j.at("split_fc2").get_to(p.split_fc2);
  j.at("routes").get_to(p.routes);
  j.at("max_groups").get_to(p.max_groups);
  j.at("group").get_to(p.group);
}

void to_json(nlohmann::json& j, const LinearPlan& p) {
  const auto& w = p.workspace;
  j = {{"m", p.m},
       {"path", path_name(p.path)},
       {"split_k", p.split_k},
       {"staged_chunks", p.staged_chunks},
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
  j.at("staged_chunks").get_to(p.staged_chunks);
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

void to_json(nlohmann::json& j, const MoePlan& p) {
  nlohmann::json arena = {{"bytes", p.arena.bytes}};
  for_each_span(p.arena, [&](const char* name, const Span& s) { arena[name] = s; });
  j = {{"m", p.m},
       {"path", moe_path_name(p.path)},
       {"tier_passes", p.tier_passes},
       {"chunk", p.chunk},
       {"full", p.full},
       {"tail", p.tail},
       {"arena", arena},
       {"arena_bytes", p.arena_bytes}};
}

void from_json(const nlohmann::json& j, MoePlan& p) {
  j.at("m").get_to(p.m);
  p.path = enum_of(j, "path", kMoePaths, moe_path_name);
  j.at("tier_passes").get_to(p.tier_passes);
  j.at("chunk").get_to(p.chunk);
  j.at("full").get_to(p.full);
  j.at("tail").get_to(p.tail);
  const auto& arena = j.at("arena");
  arena.at("bytes").get_to(p.arena.bytes);
  for_each_span(p.arena, [&](const char* name, Span& s) { arena.at(name).get_to(s); });
  j.at("arena_bytes").get_to(p.arena_bytes);
}

}  // namespace exl3::cuda
