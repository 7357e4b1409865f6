// MoeLayerCuda: upload once and read the device traits, then run the plan of each m
// (exl3/cuda/plan.hpp: decode/prefill, split-K, chunks, the arena's carve) with only kernel
// launches and memsets (graph-capturable).
#include "exl3/cuda/moe.hpp"

#include <algorithm>
#include <string>

#include "cuda/moe_kernels.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/plan.hpp"
#include "exl3/error.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/trellis/bitstream.hpp"

namespace exl3::cuda {

MoeLayerCuda::MoeLayerCuda(const moe::MoeLayerWeights& w, int top_k, const MoeOptions& opts,
                           const MoeExpertExtras& extras)
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
  if (!moe_prefill_group_valid(opts_.prefill_group)) {
    fail("{}: prefill_group {} is not 0 (automatic), {} or {}", where, opts_.prefill_group,
         kMoePrefillGroup, kMoePrefillGroupGemm);
  }
  if (opts_.decode_max_m < 1 || opts_.prefill_chunk < 0 || opts_.arena_budget_mib < 1 ||
      opts_.decode_min_split_tiles < 1) {
    fail(
        "{}: decode_max_m {}, arena_budget_mib {} and decode_min_split_tiles {} must be positive, "
        "prefill_chunk {} non-negative",
        where, opts_.decode_max_m, opts_.arena_budget_mib, opts_.decode_min_split_tiles,
        opts_.prefill_chunk);
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
  traits_.sms = sms;

  // Upload: one slab for every expert's three trellises.
  size_t slab_bytes = 0;
  for (const auto& e : w.experts) {
    for (const auto* p : {&e.gate, &e.up, &e.down})
      slab_bytes += carve_align_up(p->trellis.size() * 2);
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
      off += carve_align_up(pw.trellis.size() * 2);
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
  shape_ = {H_, I_, E_, k_, shared_h_, static_cast<int>(tiers_.size())};
  gate_suh_ = upload(rot.gate_suh, "gate suh");
  up_suh_ = upload(rot.up_suh, "up suh");
  down_svh_ = upload(rot.down_svh, "down svh");
  intermediate_ = upload(rot.intermediate, "intermediate rotations");
  upload_extras(extras, where);
}

// The biases go up as [E, I] / [E, H] with zeros past their widths (a padded layer's channels),
// so the kernels index them like the rotation tables.
void MoeLayerCuda::upload_extras(const MoeExpertExtras& x, const std::string& where) {
  const bool biased = !x.gate_bias.empty() || !x.up_bias.empty() || !x.down_bias.empty();
  if (biased && shared_h_) fail("{}: expert biases with shared-H rotations are not built", where);
  auto padded = [&](const std::vector<float>& b, int64_t width, int64_t full, const char* what) {
    if (width < 1 || width > full || static_cast<int64_t>(b.size()) != E_ * width) {
      fail("{}: {} bias has {} values, expected {} experts x a width in 1..{} (given {})", where,
           what, b.size(), E_, full, width);
    }
    std::vector<float> out(static_cast<size_t>(E_ * full), 0.0f);
    for (int64_t e = 0; e < E_; ++e)
      std::copy_n(b.begin() + e * width, width, out.begin() + e * full);
    auto buf = DeviceBuffer::upload(out, fmt::format("the CUDA MoE {} bias", what));
    device_bytes_ += buf.bytes();
    return buf;
  };
  if (!x.gate_bias.empty()) gate_bias_ = padded(x.gate_bias, x.gate_up_width, I_, "gate");
  if (!x.up_bias.empty()) up_bias_ = padded(x.up_bias, x.gate_up_width, I_, "up");
  if (!x.down_bias.empty()) down_bias_ = padded(x.down_bias, x.down_width, H_, "down");
  if (x.swiglu_limit < 0.0f || (x.swiglu_limit > 0.0f && !(x.swiglu_alpha > 0.0f))) {
    fail("{}: clamped SwiGLU limit {} / alpha {} must be positive", where, x.swiglu_limit,
         x.swiglu_alpha);
  }
  if (x.valid_intermediate < 0 || x.valid_intermediate > I_) {
    fail("{}: {} valid intermediate channels of {}", where, x.valid_intermediate, I_);
  }
  swiglu_alpha_ = x.swiglu_alpha;
  swiglu_limit_ = x.swiglu_limit;
  valid_intermediate_ = x.valid_intermediate;
}

MoePlan MoeLayerCuda::plan(int64_t m) const {
  return plan_moe(shape_, opts_, traits_, m);
}

int64_t MoeLayerCuda::prefill_chunk() const {
  return moe_prefill_chunk(shape_, opts_);
}

MoePath MoeLayerCuda::path_for(int64_t m) const {
  return moe_path(opts_, m);
}

std::pair<int, int> MoeLayerCuda::decode_splits() const {
  return moe_decode_splits(shape_, opts_, traits_);
}

bool MoeLayerCuda::tier_passes(MoePath p) const {
  return moe_tier_passes(opts_.tiers, shape_.tier_count, p);
}

size_t MoeLayerCuda::arena_bytes() const {
  return moe_arena_bytes(shape_, opts_, traits_);
}

cudaError_t MoeLayerCuda::run(const void* x, DType in_type, const int32_t* topk_ids,
                              const float* topk_weights, float* out, int64_t m, void* arena,
                              size_t arena_size, cudaStream_t stream) const {
  return run(plan(m), x, in_type, topk_ids, topk_weights, out, arena, arena_size, stream);
}

cudaError_t MoeLayerCuda::run(const MoePlan& plan, const void* x, DType in_type,
                              const int32_t* topk_ids, const float* topk_weights, float* out,
                              void* arena, size_t arena_size, cudaStream_t stream) const {
  if (plan.m < 1 || plan.m > opts_.capacity || x == nullptr || topk_ids == nullptr ||
      topk_weights == nullptr || out == nullptr || arena == nullptr ||
      arena_size < plan.arena_bytes) {
    return cudaErrorInvalidValue;
  }
  // The passes run over consecutive tokens and share the arena (the stream orders them).
  const size_t elt = dtype_size(in_type);
  int64_t t0 = 0;
  for (const MoePass* pass : {&plan.full, &plan.tail}) {
    for (int64_t i = 0; i < pass->count; ++i, t0 += pass->tokens) {
      const cudaError_t e = run_pass(
          static_cast<const char*>(x) + static_cast<size_t>(t0 * H_) * elt, in_type,
          topk_ids + t0 * k_, topk_weights + t0 * k_, out + t0 * H_, plan, *pass, arena, stream);
      if (e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

// The grouped GEMV (groups of 1 or 32 slots) or the decode-once grouped GEMM (128), as one grid
// over every tier or one homogeneous pass per K (each block of a pass whose expert has another K
// exits; the passes write disjoint slot rows).
cudaError_t MoeLayerCuda::grouped_matmul(detail::MoeGemvArgs& a, int group, int max_groups,
                                         bool per_k_passes, cudaStream_t stream) const {
  auto launch = [&] {
    if (group == kMoePrefillGroupGemm) return detail::moe_gemm(cb_, a, max_groups, stream);
    return detail::moe_gemv(cb_, a, group == 1 ? 1 : kMoePrefillGroup / 8, max_groups, stream);
  };
  if (!per_k_passes) {
    a.fixed_k = 0;
    return launch();
  }
  for (const int k : tiers_) {
    a.fixed_k = k;
    const cudaError_t e = launch();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t MoeLayerCuda::run_pass(const void* x, DType in_type, const int32_t* ids,
                                   const float* weights, float* out, const MoePlan& plan,
                                   const MoePass& pass, void* arena, cudaStream_t stream) const {
  const bool prefill = plan.path == MoePath::kPrefill;
  const MoeArena& c = plan.arena;
  const int64_t m = pass.tokens, routes = pass.routes;
  const int s1 = pass.split_fc1, s2 = pass.split_fc2;
  auto* counts = c.counts.in<int32_t>(arena);
  auto* fill = c.fill.in<int32_t>(arena);
  auto* offsets = c.offsets.in<int32_t>(arena);
  auto* num_groups = c.num_groups.in<int32_t>(arena);
  auto* group_expert = c.group_expert.in<int32_t>(arena);
  auto* group_begin = c.group_begin.in<int32_t>(arena);
  auto* group_count = c.group_count.in<int32_t>(arena);
  auto* slot_of_route = c.slot_of_route.in<int32_t>(arena);
  auto* route_of_slot = c.route_of_slot.in<int32_t>(arena);
  auto* xg = c.xg.in<__half>(arena);
  auto* xu = c.xu.in<__half>(arena);
  auto* scale_g = c.scale_g.in<float>(arena);
  auto* scale_u = c.scale_u.in<float>(arena);
  auto* partial1 = c.partial1.in<float>(arena);
  auto* act = c.act.in<__half>(arena);
  auto* act_scale = c.act_scale.in<float>(arena);
  auto* partial2 = c.partial2.in<float>(arena);
  detail::MoeSlots slots;
  cudaError_t e = cudaSuccess;
  if (prefill) {
    e = cudaMemsetAsync(counts, 0, 4 * static_cast<size_t>(E_), stream);
    if (e != cudaSuccess) return e;
    // Slots past the valid routes (ids outside [0, E) get none) must read as empty (-1).
    e = cudaMemsetAsync(route_of_slot, 0xFF, 4 * static_cast<size_t>(routes), stream);
    if (e != cudaSuccess) return e;
    e = detail::moe_pack_routes(ids, routes, E_, pass.group, counts, fill, offsets, group_expert,
                                group_begin, group_count, num_groups, slot_of_route, route_of_slot,
                                stream);
    if (e != cudaSuccess) return e;
    slots.slot_of_route = slot_of_route;
    slots.route_of_slot = route_of_slot;
  }
  e = detail::moe_rotate_input(x, in_type, m, k_, H_, shared_h_, ids, E_, slots,
                               gate_suh_.as<uint16_t>(), up_suh_.as<uint16_t>(), xg, xu, scale_g,
                               scale_u, stream);
  if (e != cudaSuccess) return e;

  const auto* ptrs = ptrs_.as<const uint32_t* const>();
  const auto* bits = bits_.as<const int8_t>();
  detail::MoeGemvArgs a;
  a.num_experts = E_;
  a.topk_ids = ids;
  if (prefill) {
    a.group_expert = group_expert;
    a.group_begin = group_begin;
    a.group_count = group_count;
    a.num_groups = num_groups;
  }
  const int group = prefill ? pass.group : 1;
  const int max_groups = static_cast<int>(pass.max_groups);

  // FC1: gate and up in one grid (column blocks of gate, then of up). B rows are the rotated
  // tokens (shared-H: token = route / k, through the pack's route table on prefill) or the
  // per-slot rotated rows.
  a.k = static_cast<int>(H_);
  a.splits = s1;
  a.col_blocks = static_cast<int>(I_ / 128);
  a.out_cols = 2 * I_;
  a.split_stride = routes * 2 * I_;
  a.partial = partial1;
  a.x_stride = H_;
  a.x_row_of_slot = shared_h_ ? slots.route_of_slot : nullptr;
  a.x_row_div = shared_h_ ? k_ : 1;
  a.nproj = 2;
  for (int p = 0; p < 2; ++p) {
    a.proj[p] = {ptrs + static_cast<size_t>(p) * E_, bits + static_cast<size_t>(p) * E_,
                 static_cast<int>(I_ / 16), static_cast<int>(p * I_), p == 0 ? xg : xu};
  }
  e = grouped_matmul(a, group, max_groups, plan.tier_passes, stream);
  if (e != cudaSuccess) return e;
  detail::MoeActivation fn;
  fn.gate_bias = gate_bias_.as<float>();
  fn.up_bias = up_bias_.as<float>();
  fn.alpha = swiglu_alpha_;
  fn.limit = swiglu_limit_;
  if (valid_intermediate_ > 0) fn.valid = valid_intermediate_;
  e = detail::moe_activate(partial1, s1, routes, routes, k_, I_, shared_h_, ids, E_, slots, scale_g,
                           scale_u, intermediate_.as<uint16_t>(), fn, act, act_scale, stream);
  if (e != cudaSuccess) return e;

  // FC2: B rows are the activation rows (one per slot).
  a.k = static_cast<int>(I_);
  a.splits = s2;
  a.col_blocks = static_cast<int>(H_ / 128);
  a.out_cols = H_;
  a.split_stride = routes * H_;
  a.partial = partial2;
  a.x_stride = I_;
  a.x_row_of_slot = nullptr;
  a.x_row_div = 1;
  a.nproj = 1;
  a.proj[0] = {ptrs + 2 * static_cast<size_t>(E_), bits + 2 * static_cast<size_t>(E_),
               static_cast<int>(H_ / 16), 0, act};
  e = grouped_matmul(a, group, max_groups, plan.tier_passes, stream);
  if (e != cudaSuccess) return e;
  return detail::moe_combine(partial2, s2, routes, m, k_, H_, shared_h_, ids, weights, E_, slots,
                             act_scale, down_svh_.as<uint16_t>(), down_bias_.as<float>(), out,
                             stream);
}

}  // namespace exl3::cuda
