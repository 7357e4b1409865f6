// Grouped trellis GEMV for the fused MoE: one launch runs every (expert group x column block x
// split) of a projection set, each block decoding its own expert's trellis at that expert's K
// (mixed K3/K4 tiers share one grid: the K switch is per block, uniform inside it), or in
// homogeneous per-tier passes of a kernel built for one K (KF > 0): no switch, so the kernel's
// registers are those of its own K rather than the widest case's.
//
// A group is one expert and up to 8 * NT consecutive route slots; the decode plan uses one
// group per route (slot = route, expert = topk_ids[route]), the prefill plan the expert-packed
// groups of the route-pack kernels (32 slots: the paired decode, one mma per 8 slots, since the
// decode is shared by four token groups). The B operand rows are gathered per slot (token rows of
// the shared-H input rotation, or per-slot rows), so no activation is copied per expert.
#pragma once

#include <cstdint>

#include "cuda/gemv.cuh"
#include "cuda/moe_args.hpp"
#include "cuda/moe_store.cuh"
#include "cuda/pdl.cuh"

namespace exl3::cuda::detail {

template <tr::Codebook CB, int NT, int KF>
__global__ void __launch_bounds__(32 * kGemvWarps)
    moe_gemv_kernel(const __grid_constant__ MoeGemvArgs a) {
  pdl_begin();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int grp = blockIdx.z;
  int expert, s0, count;
  if (a.group_expert == nullptr) {
    expert = a.topk_ids[grp];
    s0 = grp;
    count = 1;
  } else {
    if (grp >= *a.num_groups) return;
    expert = a.group_expert[grp];
    s0 = a.group_begin[grp];
    count = a.group_count[grp];
  }
  if (expert < 0 || expert >= a.num_experts) return;  // invalid ids are skipped (see moe.hpp)
  const int p = blockIdx.x / a.col_blocks;
  const MoeProj& proj = a.proj[p];
  if (KF != 0 && proj.bits[expert] != KF) return;  // another tier's pass
  const int j0 = ((blockIdx.x % a.col_blocks) * kGemvWarps + warp) * kGemvTiles;
  const int tiles_k = a.k >> 4;
  const int split = blockIdx.y;
  const int kt_begin = static_cast<int>(static_cast<int64_t>(tiles_k) * split / a.splits);
  const int kt_end = static_cast<int>(static_cast<int64_t>(tiles_k) * (split + 1) / a.splits);

  const uint32_t* xr32 = reinterpret_cast<const uint32_t*>(proj.x);
  const uint32_t* xrow[NT];  // lanes past the group's slots read slot s0 (unstored columns)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int i = 8 * nt + g;
    const int slot = s0 + (i < count ? i : 0);
    const int64_t row = (a.x_row_of_slot != nullptr ? a.x_row_of_slot[slot] : slot) / a.x_row_div;
    xrow[nt] = xr32 + row * (a.x_stride >> 1) + c;
  }
  float acc[kGemvTiles][NT][4];
#pragma unroll
  for (int t = 0; t < kGemvTiles; ++t)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][nt][i] = 0.0f;

  const uint32_t* w = proj.trellis[expert];
  if constexpr (KF != 0) {
    gemv_accumulate<KF, CB, NT, kSplitHalves<CB> && NT == 1>(w, proj.tiles_n, j0, kt_begin, kt_end,
                                                             xrow, acc);
  } else {
    switch (proj.bits[expert]) {
#define EXL3_MOE_CASE(KK)                                                                   \
  case KK:                                                                                  \
    gemv_accumulate<KK, CB, NT, kSplitHalves<CB> && NT == 1>(w, proj.tiles_n, j0, kt_begin, \
                                                             kt_end, xrow, acc);            \
    break;
      EXL3_MOE_CASE(1)
      EXL3_MOE_CASE(2)
      EXL3_MOE_CASE(3)
      EXL3_MOE_CASE(4)
      EXL3_MOE_CASE(5)
      EXL3_MOE_CASE(6)
      EXL3_MOE_CASE(7)
      EXL3_MOE_CASE(8)
#undef EXL3_MOE_CASE
      default:
        return;  // K was validated at upload
    }
  }

  float* out = a.partial + split * a.split_stride + proj.col_offset;
#pragma unroll
  for (int t = 0; t < kGemvTiles; ++t) {
    const int col = 16 * (j0 + t) + g;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      store_slot_pair(out, a.out_cols, s0, 8 * nt + 2 * c, count, col, acc[t][nt]);
  }
}

template <tr::Codebook CB, int KF>
void launch_moe_gemv_k(const MoeGemvArgs& a, int nt, const dim3& grid, cudaStream_t stream) {
  if (nt == 1) {
    launch_pdl(moe_gemv_kernel<CB, 1, KF>, grid, 32 * kGemvWarps, 0, stream, a);
  } else {
    launch_pdl(moe_gemv_kernel<CB, 4, KF>, grid, 32 * kGemvWarps, 0, stream, a);
  }
}

template <tr::Codebook CB>
cudaError_t launch_moe_gemv_cb(const MoeGemvArgs& a, int nt, int max_groups, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.col_blocks * a.nproj), static_cast<unsigned>(a.splits),
                  static_cast<unsigned>(max_groups));
  switch (a.fixed_k) {
    case 0:
      launch_moe_gemv_k<CB, 0>(a, nt, grid, stream);
      break;
    case 1:
      launch_moe_gemv_k<CB, 1>(a, nt, grid, stream);
      break;
    case 2:
      launch_moe_gemv_k<CB, 2>(a, nt, grid, stream);
      break;
    case 3:
      launch_moe_gemv_k<CB, 3>(a, nt, grid, stream);
      break;
    case 4:
      launch_moe_gemv_k<CB, 4>(a, nt, grid, stream);
      break;
    case 5:
      launch_moe_gemv_k<CB, 5>(a, nt, grid, stream);
      break;
    case 6:
      launch_moe_gemv_k<CB, 6>(a, nt, grid, stream);
      break;
    case 7:
      launch_moe_gemv_k<CB, 7>(a, nt, grid, stream);
      break;
    case 8:
      launch_moe_gemv_k<CB, 8>(a, nt, grid, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace exl3::cuda::detail
