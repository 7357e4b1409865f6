// Plans of the CUDA layers: what one run at m rows does, as a plain value.
//
// A plan names the path (kernel family), the split-K counts, the prefill chunking and where each
// scratch buffer sits in the caller's workspace or arena. It is a pure function of the layer's
// shape, its options and device traits read once when the layer is built (SM count, the
// kernels' resident blocks per SM): no CUDA call, no state. Exl3LinearCuda, Mxfp8LinearCuda and
// MoeLayerCuda keep their traits, answer plan(m) with the functions below and run(plan, ...)
// only launches what the plan says, so a plan can be computed, printed, compared and tested on
// a machine without a GPU, and the CUDA layers' accessors (path_for, splits_for, workspace_bytes,
// ...) read the same functions: there is one planner per layer.
//
// This header and src/cuda/plan.cpp build without CUDA (library exl3_cuda_plan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include <nlohmann/json_fwd.hpp>

namespace exl3::cuda {

// Every sub-buffer of a workspace or arena starts on this boundary.
inline constexpr size_t kCarveAlign = 256;

// `bytes` rounded up to the carve boundary.
inline constexpr size_t carve_align_up(size_t bytes) {
  return (bytes + kCarveAlign - 1) / kCarveAlign * kCarveAlign;
}

// One sub-buffer: bytes [offset, offset + bytes) of the caller's workspace or arena. bytes == 0:
// the run does not use it (its pointer is null).
struct Span {
  size_t offset = 0;
  size_t bytes = 0;

  template <typename T>
  T* in(void* base) const {
    return bytes == 0 ? nullptr : reinterpret_cast<T*>(static_cast<char*>(base) + offset);
  }
  bool operator==(const Span&) const = default;
};

// ---- EXL3 linear (Exl3LinearCuda, exl3/cuda/linear.hpp) ---------------------------------------

enum class LinearPath : uint8_t { kGemv, kMma, kCublas };

// "gemv" | "mma" | "cublas".
const char* path_name(LinearPath p);

struct LinearOptions {
  int64_t max_m = 4096;     // largest batch the workspace is sized for
  int64_t gemv_max_m = 16;  // m up to this uses the swap-AB GEMV (0 = never)
  int64_t mma_max_m = 128;  // m above this uses the cuBLAS path (crossover measured on H200)
  int split_k = 0;          // 0 = planned from (k, n) and the SM count
  // Bounds of the planned GEMV split-K (the mma path keeps 16 splits of >= 8 k-tiles): at most
  // gemv_max_splits slices of at least gemv_min_split_tiles k-tiles of 16 each. A decode-sized
  // layer (4096 -> 2048: 16 column blocks) fills the GPU only with many short splits, and each
  // warp's k-tiles are a chain of dependent loads, so fewer tiles per warp is less latency.
  // CLI: EXL3_GEMV_MAX_SPLITS, EXL3_GEMV_MIN_SPLIT_TILES.
  int gemv_max_splits = 16;
  int gemv_min_split_tiles = 8;
  // Decode-sized GEMV runs rotate their input in the kernel's prologue (one launch per linear
  // instead of two) where that stays cheap: see LinearPlan::staged_chunks. Off until it has been
  // run and measured on a GPU (docs/cuda-linear.md). CLI: EXL3_GEMV_FUSED_ROTATION=1.
  bool gemv_fused_rotation = false;
};

struct LinearShape {
  int64_t in = 0, out = 0;  // features; multiples of 128
};

// Read from the device once per layer. The occupancies are of the kernels the split-K rule plans
// for (the 16-row tensor-core GEMM and the single-group GEMV at the layer's K and codebook).
struct LinearTraits {
  int sms = 132;
  int mma_blocks_per_sm = 1;
  int gemv_blocks_per_sm = 1;
};

// The workspace of one run, in carve order. w_hat (the decoded weight) is used by the cuBLAS
// path only; on that path `partial` is the fp32 GEMM output (or the cast buffer of the folded
// path).
struct LinearWorkspace {
  Span xr;         // fp16 [m, in]: the rotated, range-guarded input
  Span row_scale;  // fp32 [m]: each row's power-of-two guard
  Span partial;    // fp32 [split_k, m, out]: split-K partial sums
  Span w_hat;      // fp16/bf16 [in, out]
  size_t bytes = 0;
  bool operator==(const LinearWorkspace&) const = default;
};

struct LinearPlan {
  int64_t m = 0;
  LinearPath path = LinearPath::kGemv;
  int split_k = 1;  // split-K slices (1 on the cuBLAS path)
  // GEMV path only: > 0 when the GEMV rotates its own input (no rotation launch). Every block
  // then stages the 128-element chunks its k slice touches, rotated, in shared memory: at most
  // staged_chunks per row (see gemv_staged_chunks), m rows. 0: a rotation kernel writes xr first.
  int staged_chunks = 0;
  LinearWorkspace workspace;
  bool operator==(const LinearPlan&) const = default;
};

// The split-K rule, from the shape and the device only (never from m, so rows stay
// batch-invariant). Each split gets >= min_tiles k-tiles of 16; among 1..max_splits splits take
// the fewest whose last wave of blocks is well filled (>= 88% over all waves, waves = (n / 128) *
// splits / (sms * blocks_per_sm)), since a nearly empty last wave nearly doubles the time; when
// none is, the best filled. Both small-m kernels use 128-column blocks.
int linear_split_k(int64_t k, int64_t n, int sms, int blocks_per_sm, int max_splits = 16,
                   int min_tiles = 8);
// Path at m: gemv up to gemv_max_m, mma up to mma_max_m, cuBLAS above.
LinearPath linear_path(const LinearOptions& opts, int64_t m);
// Split-K of a path: opts.split_k when set, else the rule with that kernel's occupancy.
int linear_splits(const LinearShape& s, const LinearOptions& opts, const LinearTraits& t,
                  LinearPath p);
LinearPlan plan_linear(const LinearShape& s, const LinearOptions& opts, const LinearTraits& t,
                       int64_t m);
// The fused rotation's bounds. Each GEMV block reads its rows whole for the range guard (the
// power-of-two divisor depends on the row's maximum) and keeps its slice rotated in shared
// memory, so the rotation is fused only while both stay small: at most kGemvStagedMaxRows rows
// (one 8-token B group), m * k * 4 bytes of activations read per block and m * chunks * 256
// bytes of shared memory.
inline constexpr int64_t kGemvStagedMaxRows = 8;
inline constexpr int64_t kGemvStagedMaxReadBytes = 32 * 1024;
inline constexpr int64_t kGemvStagedMaxSmemBytes = 16 * 1024;
// The most 128-element chunks one split-K slice of k (k / 16 tiles cut as the GEMV cuts them:
// slice s is tiles [tiles * s / splits, tiles * (s + 1) / splits)) touches.
int gemv_staged_chunks(int64_t k, int splits);
// The workspace every m in 1..max_m fits in (the largest m of each reachable path bounds it,
// since every carve grows with m inside a path).
size_t linear_workspace_bytes(const LinearShape& s, const LinearOptions& opts,
                              const LinearTraits& t);

// ---- MXFP8 linear (Mxfp8LinearCuda, exl3/cuda/mxfp8.hpp) --------------------------------------

enum class Mxfp8Path : uint8_t { kGemv, kCublas };
const char* mxfp8_path_name(Mxfp8Path p);  // "gemv" | "cublas"

// Tunables: plain fields. The library reads no environment; the exl3 CLI fills gemv_max_m from
// the variable named beside it (tools/env_options.hpp, docs/environment.md).
struct Mxfp8Options {
  int64_t max_m = 4096;  // largest batch the workspace is sized for
  // m up to this (0..64) uses the tensor-core GEMV, above: dequant + cuBLAS (H200: GEMV faster up
  // to 32 on 7 shapes, slower at 64 on 5; docs/mxfp8.md). CLI: EXL3_MXFP8_GEMV_MAX_M.
  int64_t gemv_max_m = 32;
  int split_k = 0;  // GEMV split-K; 0 = planned from (in, out) and the SM count
};

struct Mxfp8Shape {
  int64_t in = 0, out = 0;  // features; in a multiple of 32
  bool bias = false;        // the cuBLAS path adds a bias through fp32 partials
};

struct Mxfp8Traits {
  int sms = 132;
};

// Rows of one GEMV weight tile (the split-K rule counts tiles).
inline constexpr int kMxfp8PlanTileRows = 16;

struct Mxfp8Workspace {
  Span partial;  // fp32 [split_k, m, out]: GEMV split-K partials (split_k > 1), or the cuBLAS
                 // output a bias is added to
  Span w_bf16;   // bf16 [out, in]: the dequantized weight (cuBLAS path)
  size_t bytes = 0;
  bool operator==(const Mxfp8Workspace&) const = default;
};

struct Mxfp8Plan {
  int64_t m = 0;
  Mxfp8Path path = Mxfp8Path::kGemv;
  int split_k = 1;  // GEMV split-K (1 on the cuBLAS path)
  Mxfp8Workspace workspace;
  bool operator==(const Mxfp8Plan&) const = default;
};

// The split-K rule, from the shape and the device only. One 8-warp block per 16-row tile already
// streams at copy bandwidth once there is a tile per SM (tiles >= sms: 1); below that split K for
// about 4 blocks per SM, ceil(4 * sms / tiles), each warp of a split keeping >= 2 of its 32-input
// blocks (at most k / 512, at most 16, at least 1).
int mxfp8_split_k(int64_t k, int64_t n, int sms);
Mxfp8Path mxfp8_path(const Mxfp8Options& opts, int64_t m);
int mxfp8_splits(const Mxfp8Shape& s, const Mxfp8Options& opts, const Mxfp8Traits& t, Mxfp8Path p);
Mxfp8Plan plan_mxfp8(const Mxfp8Shape& s, const Mxfp8Options& opts, const Mxfp8Traits& t,
                     int64_t m);
size_t mxfp8_workspace_bytes(const Mxfp8Shape& s, const Mxfp8Options& opts, const Mxfp8Traits& t);

// ---- fused MoE (MoeLayerCuda, exl3/cuda/moe.hpp) ----------------------------------------------

// Tunables: plain fields. The library reads no environment; the exl3 CLI fills the fields below
// from the EXL3_MOE_* variables named beside them (tools/env_options.hpp, docs/environment.md).
struct MoeOptions {
  int64_t capacity = 0;       // most tokens per run(); required (0 is an error: no guessing)
  int64_t decode_max_m = 32;  // EXL3_MOE_DECODE_MAX_M: m up to this uses the decode path
  int64_t prefill_chunk = 0;  // EXL3_MOE_PREFILL_CHUNK: tokens per prefill pass; 0 = fit budget
  int64_t arena_budget_mib = 256;  // EXL3_MOE_ARENA_MIB: prefill_chunk = 0 sizes chunks to this
  // EXL3_MOE_TIERS: how the expert GEMVs meet mixed bit widths (K3 + K4 tiers). kGrid: one grid,
  // each block switching to its expert's K; kPasses: one homogeneous pass per K present, each a
  // kernel built for that K alone; kAuto: the grid on both paths (measured faster at every m:
  // docs/performance.md). A layer of one K always runs that K's own kernel.
  enum class Tiers : uint8_t { kAuto, kGrid, kPasses };
  Tiers tiers = Tiers::kAuto;
  // EXL3_MOE_MIN_SPLIT_TILES: the fewest k-tiles of 16 a decode split walks (moe_split_k).
  int64_t decode_min_split_tiles = 8;
  // EXL3_MOE_PREFILL_GROUP: route slots per prefill group, 32 (the grouped GEMV) or 128 (the
  // decode-once grouped GEMM). Each group's blocks decode their expert's tiles once for all its
  // slots, so larger groups decode less where experts get many routes, and leave tensor-core
  // columns idle where they get few; 0 = moe_prefill_group.
  int64_t prefill_group = 0;
};

enum class MoePath : uint8_t { kDecode, kPrefill };
const char* moe_path_name(MoePath p);  // "decode" | "prefill"

struct MoeShape {
  int64_t hidden = 0, intermediate = 0;  // H, I (per rank); multiples of 128
  int experts = 0, top_k = 0;
  bool shared_h = false;  // hidden-side rotations per token (shared_h_v1), not per route
  int tier_count = 1;     // distinct K among the experts
};

struct MoeTraits {
  int sms = 132;
};

// Slots per prefill group: the grouped GEMV's 4 B groups of 8 tokens, or the decode-once grouped
// GEMM's 128 (src/cuda/moe_gemm.cuh). The arena's group tables are sized for the smaller (more
// groups).
inline constexpr int kMoePrefillGroup = 32;
inline constexpr int kMoePrefillGroupGemm = 128;
inline constexpr int64_t kMoeGemmMinRoutesPerExpert = 64;
// The values MoeOptions::prefill_group takes: 0 (automatic) or one of the two group sizes.
constexpr bool moe_prefill_group_valid(int64_t v) {
  return v == 0 || v == kMoePrefillGroup || v == kMoePrefillGroupGemm;
}

// The arena of one path, laid out for the path's capacity in tokens (min(decode_max_m,
// capacity) on decode, the chunk on prefill) so that a pass of any live size fits, including a
// prefill pass's split-K partials (splits * live routes <= capacity routes). The route-packing
// tables (counts .. route_of_slot) exist on prefill only.
struct MoeArena {
  Span counts, fill, offsets;                   // int32 [E]
  Span num_groups;                              // int32 scalar
  Span group_expert, group_begin, group_count;  // int32 [capacity routes / 32 + E]
  Span slot_of_route, route_of_slot;            // int32 [capacity routes]
  Span xg, xu;            // fp16 [rotation rows, H]: capacity tokens (shared-H) or routes
  Span scale_g, scale_u;  // fp32 [rotation rows]
  Span partial1;          // fp32 [split_fc1, capacity routes, 2I]
  Span act;               // fp16 [capacity routes, I]
  Span act_scale;         // fp32 [capacity routes]
  Span partial2;          // fp32 [split_fc2, capacity routes, H]
  size_t bytes = 0;
  bool operator==(const MoeArena&) const = default;
};

// `count` consecutive passes of `tokens` tokens each (count 0: none).
struct MoePass {
  int64_t tokens = 0;
  int64_t count = 0;
  int split_fc1 = 1, split_fc2 = 1;  // split-K of FC1 (gate | up) and FC2 (down)
  int64_t routes = 0;                // tokens * top_k
  int64_t max_groups = 0;            // the grouped GEMV's grid rows (decode: one per route)
  int group = 1;                     // route slots per group (decode 1; prefill 32 or 128)
  bool operator==(const MoePass&) const = default;
};

struct MoePlan {
  int64_t m = 0;
  MoePath path = MoePath::kDecode;
  bool tier_passes = false;  // one GEMV pass per K present (else one grid, or a single K)
  int64_t chunk = 0;         // tokens per prefill pass (0: the layer has no prefill path)
  // Runs `full`'s passes, then `tail`'s, over consecutive tokens. Decode: full = one pass of m.
  MoePass full, tail;
  MoeArena arena;          // carve of this path (all passes share it; the stream orders them)
  size_t arena_bytes = 0;  // arena size run() requires, for any m <= capacity
  bool operator==(const MoePlan&) const = default;
};

MoePath moe_path(const MoeOptions& opts, int64_t m);
// Slots per group of a prefill pass of `routes` routes: opts.prefill_group when set (32 or 128,
// anything else is refused), else 128 (the grouped GEMM) where the pass averages at least
// kMoeGemmMinRoutesPerExpert routes per expert.
int moe_prefill_group(const MoeShape& s, const MoeOptions& opts, int64_t routes);
// Split-K for about 8 blocks (32 warps) per SM: each warp's k-chain is a serial sequence of
// decode -> mma steps, so short chains on many warps beat long ones on few (more splits cost the
// activation and combine kernels more partials to sum). ceil(8 * sms / base_blocks), clamped to
// 1..min(max_splits, k_tiles / min_tiles).
int moe_split_k(int64_t base_blocks, int64_t k_tiles, int sms, int64_t max_splits = 32,
                int64_t min_tiles = 8);
// Decode split-K of FC1 and FC2 (base blocks: 2 * I / 128 * top_k and H / 128 * top_k), each
// split at least opts.decode_min_split_tiles k-tiles long.
std::pair<int, int> moe_decode_splits(const MoeShape& s, const MoeOptions& opts,
                                      const MoeTraits& t);
// The carve of one path for `cap_tokens` tokens; split_fc1/split_fc2 size the partials (prefill
// passes give 1: a pass splits only as far as its live routes leave room in the capacity's).
MoeArena moe_arena(const MoeShape& s, MoePath p, int64_t cap_tokens, int split_fc1, int split_fc2);
// Tokens per prefill pass: opts.prefill_chunk (at most capacity) when set, else the most tokens
// whose prefill arena fits arena_budget_mib; 0 when capacity <= decode_max_m (no prefill path).
int64_t moe_prefill_chunk(const MoeShape& s, const MoeOptions& opts);
// Whether a path runs the experts' K tiers as separate GEMV passes.
bool moe_tier_passes(MoeOptions::Tiers tiers, int tier_count, MoePath p);
// The arena every m in 1..capacity fits in (the larger of the two paths' carves).
size_t moe_arena_bytes(const MoeShape& s, const MoeOptions& opts, const MoeTraits& t);
MoePlan plan_moe(const MoeShape& s, const MoeOptions& opts, const MoeTraits& t, int64_t m);

// ---- JSON (stable field names: docs/cuda-linear.md, *Plans*) ----------------------------------

void to_json(nlohmann::json& j, const Span& s);
void from_json(const nlohmann::json& j, Span& s);
void to_json(nlohmann::json& j, const LinearPlan& p);
void from_json(const nlohmann::json& j, LinearPlan& p);
void to_json(nlohmann::json& j, const Mxfp8Plan& p);
void from_json(const nlohmann::json& j, Mxfp8Plan& p);
void to_json(nlohmann::json& j, const MoePass& p);
void from_json(const nlohmann::json& j, MoePass& p);
void to_json(nlohmann::json& j, const MoePlan& p);
void from_json(const nlohmann::json& j, MoePlan& p);

}  // namespace exl3::cuda
