// MoeLayerCuda: upload once, plan decode/prefill from the geometry and the device, then run
// with only kernel launches and memsets (graph-capturable).
#include "exl3/cuda/moe.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "cuda/env_option.hpp"
#include "cuda/moe_kernels.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/error.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/trellis/bitstream.hpp"

namespace exl3::cuda {

namespace {

constexpr size_t kAlign = 256;
constexpr int kPrefillGroup = 32;  // slots per prefill group (the GEMV's 4 x 8-token B groups)

size_t align_up(size_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

// Split-K so that about 8 blocks (32 warps) per SM are launched: each warp's k-chain is a serial
// sequence of decode -> mma steps, so short chains on many warps beat long ones on few (more
// splits cost the activation and combine kernels more partials to sum).
int plan_splits(int64_t base_blocks, int64_t k_tiles, int sms, int64_t max_splits = 32) {
  const int64_t target = 8LL * sms;
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(max_splits, k_tiles / 8));
  const int64_t s = (target + base_blocks - 1) / base_blocks;
  return static_cast<int>(std::clamp<int64_t>(s, 1, cap));
}

}  // namespace

MoeOptions moe_options_from_env(MoeOptions base) {
  detail::env_override("EXL3_MOE_DECODE_MAX_M", base.decode_max_m);
  detail::env_override("EXL3_MOE_PREFILL_CHUNK", base.prefill_chunk);
  detail::env_override("EXL3_MOE_ARENA_MIB", base.arena_budget_mib);
  if (const char* v = std::getenv("EXL3_MOE_TIERS"); v != nullptr) {
    std::string s(v);
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t") + 1);
    if (s == "auto") {
      base.tiers = MoeOptions::Tiers::kAuto;
    } else if (s == "grid") {
      base.tiers = MoeOptions::Tiers::kGrid;
    } else if (s == "passes") {
      base.tiers = MoeOptions::Tiers::kPasses;
    } else if (!s.empty()) {
      fail(
          "environment variable EXL3_MOE_TIERS='{}' is not one of auto, grid, passes (unset it or "
          "give e.g. "
          "EXL3_MOE_TIERS=passes)",
          v);
    }
  }
  return base;
}

const char* moe_plan_name(MoePlan p) {
  return p == MoePlan::kDecode ? "decode" : "prefill";
}

// Sub-buffers of the arena for one pass of `tokens` tokens on one plan.
struct MoeLayerCuda::Carve {
  int32_t *counts = nullptr, *fill = nullptr, *offsets = nullptr, *num_groups = nullptr;
  int32_t *group_expert = nullptr, *group_begin = nullptr, *group_count = nullptr;
  int32_t *slot_of_route = nullptr, *route_of_slot = nullptr;
  __half *xg = nullptr, *xu = nullptr;
  float *scale_g = nullptr, *scale_u = nullptr;
  float* partial1 = nullptr;
  __half* act = nullptr;
  float* act_scale = nullptr;
  float* partial2 = nullptr;
  int64_t routes = 0, max_groups = 0;
  size_t bytes = 0;
};

// Buffers are laid out for the plan's capacity (decode_max_m tokens, or chunk_ tokens per prefill
// pass) so that a pass of any live size fits, including a prefill pass's split-K partials
// (splits * live routes <= capacity routes).
MoeLayerCuda::Carve MoeLayerCuda::carve(void* base, int64_t tokens, MoePlan plan) const {
  Carve c;
  auto* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* at = p == nullptr ? nullptr : p + off;
    off += align_up(bytes);
    return at;
  };
  const bool prefill = plan == MoePlan::kPrefill;
  const int64_t cap_tokens = prefill ? chunk_ : std::min(opts_.decode_max_m, opts_.capacity);
  const int64_t cap = cap_tokens * k_;  // route slots
  const int s1 = prefill ? 1 : split1_, s2 = prefill ? 1 : split2_;
  c.routes = tokens * k_;
  const int64_t rot_rows = shared_h_ ? cap_tokens : cap;
  if (prefill) {
    c.max_groups = cap / kPrefillGroup + E_;
    c.counts = reinterpret_cast<int32_t*>(take(4 * static_cast<size_t>(E_)));
    c.fill = reinterpret_cast<int32_t*>(take(4 * static_cast<size_t>(E_)));
    c.offsets = reinterpret_cast<int32_t*>(take(4 * static_cast<size_t>(E_)));
    c.num_groups = reinterpret_cast<int32_t*>(take(4));
    c.group_expert = reinterpret_cast<int32_t*>(take(4 * static_cast<size_t>(c.max_groups)));
    c.group_begin = reinterpret_cast<int32_t*>(take(4 * static_cast<size_t>(c.max_groups)));
    c.group_count = reinterpret_cast<int32_t*>(take(4 * static_cast<size_t>(c.max_groups)));
    c.slot_of_route = reinterpret_cast<int32_t*>(take(4 * static_cast<size_t>(cap)));
    c.route_of_slot = reinterpret_cast<int32_t*>(take(4 * static_cast<size_t>(cap)));
    c.max_groups = c.routes / kPrefillGroup + std::min<int64_t>(E_, c.routes);  // this pass's grid
  } else {
    c.max_groups = c.routes;
  }
  c.xg = reinterpret_cast<__half*>(take(2 * static_cast<size_t>(rot_rows * H_)));
  c.xu = reinterpret_cast<__half*>(take(2 * static_cast<size_t>(rot_rows * H_)));
  c.scale_g = reinterpret_cast<float*>(take(4 * static_cast<size_t>(rot_rows)));
  c.scale_u = reinterpret_cast<float*>(take(4 * static_cast<size_t>(rot_rows)));
  c.partial1 = reinterpret_cast<float*>(take(4 * static_cast<size_t>(s1 * cap * 2 * I_)));
  c.act = reinterpret_cast<__half*>(take(2 * static_cast<size_t>(cap * I_)));
  c.act_scale = reinterpret_cast<float*>(take(4 * static_cast<size_t>(cap)));
  c.partial2 = reinterpret_cast<float*>(take(4 * static_cast<size_t>(s2 * cap * H_)));
  c.bytes = off;
  return c;
}

MoeLayerCuda::MoeLayerCuda(const moe::MoeLayerWeights& w, int top_k, const MoeOptions& opts)
    : H_(w.hidden),
      I_(w.intermediate),
      E_(w.num_experts()),
      k_(top_k),
      shared_h_(w.rotations.h_rows == 1 && w.num_experts() > 1),
      cb_(w.codebook),
      opts_(opts) {
  const std::string where = fmt::format("CUDA MoE layer {} rank {}", w.layer, w.rank);
  if (E_ < 1) fail("{}: no experts", where);
  if (k_ < 1 || k_ > E_) fail("{}: top_k {} outside 1..{}", where, k_, E_);
  if (H_ <= 0 || I_ <= 0 || H_ % 128 != 0 || I_ % 128 != 0 || I_ > 8192 || H_ > 8192) {
    fail(
        "{}: hidden {} / intermediate {} must be multiples of 128 and at most 8192 (the rotation "
        "and activation "
        "kernels stage one row per block)",
        where, H_, I_);
  }
  if (opts_.capacity < 1) {
    fail(
        "{}: capacity (max tokens per call) is {}: refusing to guess a capacity; set it from the "
        "scheduler's "
        "max batched tokens",
        where, opts_.capacity);
  }
  if (opts_.decode_max_m < 1 || opts_.prefill_chunk < 0 || opts_.arena_budget_mib < 1) {
    fail(
        "{}: decode_max_m {} and arena_budget_mib {} must be positive, prefill_chunk {} "
        "non-negative",
        where, opts_.decode_max_m, opts_.arena_budget_mib, opts_.prefill_chunk);
  }
  const auto& rot = w.rotations;
  const int64_t h_rows = rot.h_rows;
  if (h_rows != 1 && h_rows != E_)
    fail("{}: hidden-side rotation rows {} (expected 1 or {})", where, h_rows, E_);
  if (static_cast<int64_t>(rot.gate_suh.size()) != h_rows * H_ ||
      static_cast<int64_t>(rot.up_suh.size()) != h_rows * H_ ||
      static_cast<int64_t>(rot.down_svh.size()) != h_rows * H_ ||
      static_cast<int64_t>(rot.intermediate.size()) != static_cast<int64_t>(E_) * 3 * I_) {
    fail("{}: rotation tables do not match H={} I={} E={}", where, H_, I_, E_);
  }

  int dev = 0, sms = 132;
  EXL3_CUDA_CHECK(cudaGetDevice(&dev), "CUDA MoE: cudaGetDevice");
  EXL3_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                  "CUDA MoE: querying SMs");
  sms_ = sms;
  split1_ = plan_splits(2 * (I_ / 128) * k_, H_ / 16, sms);
  split2_ = plan_splits((H_ / 128) * k_, I_ / 16, sms);

  // Prefill chunk: as given, else the most tokens whose arena fits the budget.
  if (opts_.capacity > opts_.decode_max_m) {
    if (opts_.prefill_chunk > 0) {
      chunk_ = std::min(opts_.prefill_chunk, opts_.capacity);
    } else {
      const size_t budget = static_cast<size_t>(opts_.arena_budget_mib) << 20;
      int64_t lo = 1, hi = opts_.capacity;
      while (lo < hi) {
        chunk_ = (lo + hi + 1) / 2;
        if (carve(nullptr, chunk_, MoePlan::kPrefill).bytes <= budget) {
          lo = chunk_;
        } else {
          hi = chunk_ - 1;
        }
      }
      chunk_ = lo;
    }
  }

  // Upload: one slab for every expert's three trellises.
  size_t slab_bytes = 0;
  for (const auto& e : w.experts) {
    for (const auto* p : {&e.gate, &e.up, &e.down}) slab_bytes += align_up(p->trellis.size() * 2);
  }
  slab_ = DeviceBuffer(slab_bytes, "the CUDA MoE trellis slab");
  std::vector<const void*> ptrs(3 * static_cast<size_t>(E_));
  std::vector<int8_t> bits(3 * static_cast<size_t>(E_));
  size_t off = 0;
  for (int e = 0; e < E_; ++e) {
    const auto& ex = w.experts[static_cast<size_t>(e)];
    const moe::ProjWeights* projs[3] = {&ex.gate, &ex.up, &ex.down};
    for (int p = 0; p < 3; ++p) {
      const auto& pw = *projs[p];
      const int64_t in = p < 2 ? H_ : I_, out = p < 2 ? I_ : H_;
      if (pw.in_features != in || pw.out_features != out || !trellis::valid_bits(pw.bits) ||
          static_cast<int64_t>(pw.trellis.size()) != in / 16 * (out / 16) * 16 * pw.bits) {
        fail("{}: expert {} {} is {}x{} K={} (expected {}x{})", where, e,
             moe::proj_name(moe::kProjs[p]), pw.in_features, pw.out_features, pw.bits, in, out);
      }
      char* dst = slab_.as<char>() + off;
      EXL3_CUDA_CHECK(
          cudaMemcpy(dst, pw.trellis.data(), pw.trellis.size() * 2, cudaMemcpyHostToDevice),
          "CUDA MoE: uploading trellis");
      ptrs[static_cast<size_t>(p) * E_ + e] = dst;
      bits[static_cast<size_t>(p) * E_ + e] = static_cast<int8_t>(pw.bits);
      off += align_up(pw.trellis.size() * 2);
    }
  }
  auto upload = [&](const auto& host, const char* what) {
    auto buf = DeviceBuffer::upload(host, fmt::format("the CUDA MoE {}", what));
    device_bytes_ += buf.bytes();
    return buf;
  };
  device_bytes_ = slab_bytes;
  ptrs_ = upload(ptrs, "trellis pointers");
  bits_ = upload(bits, "bit widths");
  for (const int8_t b : bits) {
    if (std::find(tiers_.begin(), tiers_.end(), b) == tiers_.end()) tiers_.push_back(b);
  }
  std::sort(tiers_.begin(), tiers_.end());
  gate_suh_ = upload(rot.gate_suh, "gate suh");
  up_suh_ = upload(rot.up_suh, "up suh");
  down_svh_ = upload(rot.down_svh, "down svh");
  intermediate_ = upload(rot.intermediate, "intermediate rotations");
}

bool MoeLayerCuda::tier_passes(MoePlan p) const {
  if (tiers_.size() <= 1) return true;  // one K: its own kernel, one pass
  switch (opts_.tiers) {
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
  // on both plans.
  (void)p;
  return false;
}

MoePlan MoeLayerCuda::plan_for(int64_t m) const {
  return m <= opts_.decode_max_m ? MoePlan::kDecode : MoePlan::kPrefill;
}

size_t MoeLayerCuda::arena_bytes() const {
  size_t bytes =
      carve(nullptr, std::min(opts_.decode_max_m, opts_.capacity), MoePlan::kDecode).bytes;
  if (chunk_ > 0) bytes = std::max(bytes, carve(nullptr, chunk_, MoePlan::kPrefill).bytes);
  return bytes;
}

cudaError_t MoeLayerCuda::run(const void* x, DType in_type, const int32_t* topk_ids,
                              const float* topk_weights, float* out, int64_t m, void* arena,
                              size_t arena_size, cudaStream_t stream) const {
  if (m < 1 || m > opts_.capacity || x == nullptr || topk_ids == nullptr ||
      topk_weights == nullptr || out == nullptr || arena == nullptr || arena_size < arena_bytes()) {
    return cudaErrorInvalidValue;
  }
  const MoePlan plan = plan_for(m);
  if (plan == MoePlan::kDecode) {
    return run_pass(x, in_type, topk_ids, topk_weights, out, m, plan, carve(arena, m, plan),
                    stream);
  }
  // Prefill: chunks of chunk_ tokens share the arena (the stream orders them).
  const size_t elt = dtype_size(in_type);
  for (int64_t t0 = 0; t0 < m; t0 += chunk_) {
    const int64_t n = std::min(chunk_, m - t0);
    const cudaError_t e = run_pass(static_cast<const char*>(x) + static_cast<size_t>(t0 * H_) * elt,
                                   in_type, topk_ids + t0 * k_, topk_weights + t0 * k_,
                                   out + t0 * H_, n, plan, carve(arena, n, plan), stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// The grouped GEMV as one grid over every tier, or one homogeneous pass per K (each block of a
// pass whose expert has another K exits; the passes write disjoint slot rows).
cudaError_t MoeLayerCuda::gemv_tiers(detail::MoeGemvArgs& a, int nt, int max_groups, MoePlan plan,
                                     cudaStream_t stream) const {
  if (!tier_passes(plan)) {
    a.fixed_k = 0;
    return detail::moe_gemv(cb_, a, nt, max_groups, stream);
  }
  for (const int k : tiers_) {
    a.fixed_k = k;
    const cudaError_t e = detail::moe_gemv(cb_, a, nt, max_groups, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t MoeLayerCuda::run_pass(const void* x, DType in_type, const int32_t* ids,
                                   const float* weights, float* out, int64_t m, MoePlan plan,
                                   const Carve& c, cudaStream_t stream) const {
  const bool prefill = plan == MoePlan::kPrefill;
  int s1 = split1_, s2 = split2_;
  if (prefill) {
    // Split-K from this pass's size, within the arena: partials hold chunk_ * k rows per split.
    const int64_t routes = m * k_, groups = routes / kPrefillGroup + std::min<int64_t>(E_, routes);
    const int64_t room = std::max<int64_t>(1, chunk_ / m);
    s1 = plan_splits(2 * (I_ / 128) * groups, H_ / 16, sms_, room);
    s2 = plan_splits((H_ / 128) * groups, I_ / 16, sms_, room);
  }
  detail::MoeSlots slots;
  cudaError_t e = cudaSuccess;
  if (prefill) {
    e = cudaMemsetAsync(c.counts, 0, 4 * static_cast<size_t>(E_), stream);
    if (e != cudaSuccess) return e;
    // Slots past the valid routes (ids outside [0, E) get none) must read as empty (-1).
    e = cudaMemsetAsync(c.route_of_slot, 0xFF, 4 * static_cast<size_t>(c.routes), stream);
    if (e != cudaSuccess) return e;
    e = detail::moe_pack_routes(ids, c.routes, E_, kPrefillGroup, c.counts, c.fill, c.offsets,
                                c.group_expert, c.group_begin, c.group_count, c.num_groups,
                                c.slot_of_route, c.route_of_slot, stream);
    if (e != cudaSuccess) return e;
    slots.slot_of_route = c.slot_of_route;
    slots.route_of_slot = c.route_of_slot;
  }
  e = detail::moe_rotate_input(x, in_type, m, k_, H_, shared_h_, ids, E_, slots,
                               gate_suh_.as<uint16_t>(), up_suh_.as<uint16_t>(), c.xg, c.xu,
                               c.scale_g, c.scale_u, stream);
  if (e != cudaSuccess) return e;

  const auto* ptrs = ptrs_.as<const uint32_t* const>();
  const auto* bits = bits_.as<const int8_t>();
  detail::MoeGemvArgs a;
  a.num_experts = E_;
  a.topk_ids = ids;
  if (prefill) {
    a.group_expert = c.group_expert;
    a.group_begin = c.group_begin;
    a.group_count = c.group_count;
    a.num_groups = c.num_groups;
  }
  const int nt = prefill ? 4 : 1;
  const int max_groups = static_cast<int>(c.max_groups);

  // FC1: gate and up in one grid (column blocks of gate, then of up). B rows are the rotated
  // tokens (shared-H: token = route / k, through the pack's route table on prefill) or the
  // per-slot rotated rows.
  a.k = static_cast<int>(H_);
  a.splits = s1;
  a.col_blocks = static_cast<int>(I_ / 128);
  a.out_cols = 2 * I_;
  a.split_stride = c.routes * 2 * I_;
  a.partial = c.partial1;
  a.x_stride = H_;
  a.x_row_of_slot = shared_h_ ? slots.route_of_slot : nullptr;
  a.x_row_div = shared_h_ ? k_ : 1;
  a.nproj = 2;
  for (int p = 0; p < 2; ++p) {
    a.proj[p] = {ptrs + static_cast<size_t>(p) * E_, bits + static_cast<size_t>(p) * E_,
                 static_cast<int>(I_ / 16), static_cast<int>(p * I_), p == 0 ? c.xg : c.xu};
  }
  e = gemv_tiers(a, nt, max_groups, plan, stream);
  if (e != cudaSuccess) return e;
  e = detail::moe_activate(c.partial1, s1, c.routes, c.routes, k_, I_, shared_h_, ids, E_, slots,
                           c.scale_g, c.scale_u, intermediate_.as<uint16_t>(), c.act, c.act_scale,
                           stream);
  if (e != cudaSuccess) return e;

  // FC2: B rows are the activation rows (one per slot).
  a.k = static_cast<int>(I_);
  a.splits = s2;
  a.col_blocks = static_cast<int>(H_ / 128);
  a.out_cols = H_;
  a.split_stride = c.routes * H_;
  a.partial = c.partial2;
  a.x_stride = I_;
  a.x_row_of_slot = nullptr;
  a.x_row_div = 1;
  a.nproj = 1;
  a.proj[0] = {ptrs + 2 * static_cast<size_t>(E_), bits + 2 * static_cast<size_t>(E_),
               static_cast<int>(H_ / 16), 0, c.act};
  e = gemv_tiers(a, nt, max_groups, plan, stream);
  if (e != cudaSuccess) return e;
  return detail::moe_combine(c.partial2, s2, c.routes, m, k_, H_, shared_h_, ids, weights, E_,
                             slots, c.act_scale, down_svh_.as<uint16_t>(), out, stream);
}

}  // namespace exl3::cuda
