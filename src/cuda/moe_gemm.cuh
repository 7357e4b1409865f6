// Decode-once grouped MoE GEMM for prefill: each block decodes its expert's weight tiles once into
// shared memory and multiplies them against up to 128 route slots of that expert, where the
// grouped GEMV (moe_gemv.cuh) decodes every tile again for each group of 32 slots.
//
// Same arguments, grid and output as the grouped GEMV (MoeGemvArgs; x = column blocks of 128 x
// projections, y = split-K slices, z = groups), with groups of up to kMoeGemmSlots slots from the
// route-pack kernels. A block is 8 warps over 128 output columns x 128 slots:
//   - decode: warp w decodes tile column w of each k-step (the lane's A fragments of the swap-AB
//     form, see gemv.cuh) and stores them to shared memory in fragment order, 16 bytes per lane;
//   - activations: the slots' B rows are gathered with cp.async into padded shared rows (slots
//     past the group's count are zero-filled) and read back with ldmatrix;
//   - mma: warp (w % 2, w / 2) multiplies 4 tile columns (64 outputs) by 32 slots, skipping slot
//     quarters the group does not reach.
// Stages of 4 k-tiles are double-buffered, one barrier each: while a stage is multiplied, the next
// one's activations are in flight and its tiles are decoded from trellis words loaded a stage
// earlier.
//
// Per slot, every output is the same sum of the same mma products in the same k order as the
// grouped GEMV's paired decode for the same split plan, so the two kernels give the same bits.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/mma.cuh"
#include "cuda/moe_args.hpp"
#include "cuda/moe_store.cuh"
#include "cuda/pdl.cuh"
#include "cuda/trellis_decode.cuh"

namespace exl3::cuda::detail {

constexpr int kMoeGemmWarps = 8;
constexpr int kMoeGemmSlots = 128;     // route slots per group
constexpr int kMoeGemmTileCols = 8;    // tile columns per block: 128 outputs, one per warp
constexpr int kMoeGemmStageTiles = 4;  // k-tiles per pipeline stage (64 inputs)
// A staged activation row: the stage's 64 inputs plus 8 halves of padding, so the 8 rows an
// ldmatrix reads (144 bytes apart) fall in distinct banks.
constexpr int kMoeGemmRowHalves = 16 * kMoeGemmStageTiles + 8;

struct MoeGemmSmem {
  uint4 w[2][kMoeGemmStageTiles][kMoeGemmTileCols][32];  // decoded A fragments, per lane
  __half x[2][kMoeGemmSlots][kMoeGemmRowHalves];
  const __half* rows[kMoeGemmSlots];  // B row of each slot (zero-fill source past the count)
};

template <int K, tr::Codebook CB>
__device__ __forceinline__ void moe_gemm_block(const MoeGemvArgs& a, const MoeProj& proj,
                                               const uint32_t* __restrict__ w, int s0, int count,
                                               int cb, int kt_begin, int kt_end, MoeGemmSmem& s) {
  constexpr int kWords = 8 * K;
  constexpr int kLW = kLaneWords<K>;
  constexpr int kST = kMoeGemmStageTiles;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const LaneSpan<K> span(lane);
  const int64_t tile_stride = static_cast<int64_t>(proj.tiles_n) * kWords;
  // This warp decodes tile column cb * 8 + warp.
  const uint32_t* col_base = w + static_cast<int64_t>(cb * kMoeGemmTileCols + warp) * kWords;
  const int stages = (kt_end - kt_begin + kST - 1) / kST;

  uint32_t words[kST][kLW];
  auto load_words = [&](int st) {
    const int kt0 = kt_begin + st * kST;
#pragma unroll
    for (int kt = 0; kt < kST; ++kt) {
      if (kt0 + kt < kt_end) {
        const uint32_t* t = col_base + (kt0 + kt) * tile_stride;
        words[kt][0] = ld_stream(t + span.w0);
        words[kt][1] = ld_stream(t + span.w1);
        if constexpr (kLW == 3) words[kt][2] = ld_stream(t + span.w2);
      }
    }
  };
  auto decode = [&](int st) {
    const int kt0 = kt_begin + st * kST;
#pragma unroll
    for (int kt = 0; kt < kST; ++kt) {
      if (kt0 + kt < kt_end) {
        uint32_t b[4];
        decode_lane<K, CB>(words[kt][0], words[kt][1], kLW == 3 ? words[kt][kLW - 1] : 0u, span.off,
                           b);
        // A of the swap-AB form: (col g: rows 2c, 2c+1), (col g+8), (col g: rows 2c+8, 2c+9), ...
        s.w[st & 1][kt][warp][lane] = make_uint4(b[0], b[2], b[1], b[3]);
      }
    }
  };
  auto stage_x = [&](int st) {
    const int kt0 = kt_begin + st * kST;
    const int pieces = 2 * min(kST, kt_end - kt0);  // 16-byte pieces (8 inputs) per row
    for (int p = threadIdx.x; p < kMoeGemmSlots * 2 * kST; p += 32 * kMoeGemmWarps) {
      const int slot = p / (2 * kST), piece = p % (2 * kST);
      if (piece < pieces) {
        const __half* src = s.rows[slot];
        const bool live = slot < count;
        cp_async16_or_zero(&s.x[st & 1][slot][8 * piece], live ? src + 16 * kt0 + 8 * piece : src,
                           live);
      }
    }
    cp_async_commit();
  };

  // B rows of the group's slots (token rows of the shared input rotation, or per-slot rows).
  for (int i = threadIdx.x; i < kMoeGemmSlots; i += 32 * kMoeGemmWarps) {
    const int slot = s0 + (i < count ? i : 0);
    const int64_t row = (a.x_row_of_slot != nullptr ? a.x_row_of_slot[slot] : slot) / a.x_row_div;
    s.rows[i] = proj.x + row * a.x_stride;
  }
  load_words(0);
  __syncthreads();  // rows
  stage_x(0);
  decode(0);
  if (stages > 1) load_words(1);

  const int wc = warp & 1, ws = warp >> 1;  // tile columns 4 wc .. 4 wc + 3, slots 32 ws ..
  float acc[4][4][4];
#pragma unroll
  for (int t = 0; t < 4; ++t)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][n][i] = 0.0f;
  // ldmatrix rows of this lane: matrix q = lane / 8 is (slot group 2 p + q / 2, inputs 8 (q % 2)).
  const int lm_slot = 32 * ws + 8 * ((lane >> 3) >> 1) + (lane & 7);
  const int lm_col = 8 * ((lane >> 3) & 1);

  for (int st = 0; st < stages; ++st) {
    cp_async_wait<0>();
    __syncthreads();  // stage st's tiles and rows are in; stage st - 1's readers are done
    if (st + 1 < stages) {
      stage_x(st + 1);
      decode(st + 1);
      if (st + 2 < stages) load_words(st + 2);
    }
    if (32 * ws < count) {
      const int nkt = min(kST, kt_end - (kt_begin + st * kST));
      const int buf = st & 1;
#pragma unroll
      for (int kt = 0; kt < kST; ++kt) {
        if (kt < nkt) {
          uint4 af[4];
#pragma unroll
          for (int t = 0; t < 4; ++t) af[t] = s.w[buf][kt][4 * wc + t][lane];
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            if (32 * ws + 16 * p < count) {
              uint32_t bf[4];
              ldmatrix_x4(bf, &s.x[buf][lm_slot + 16 * p][16 * kt + lm_col]);
#pragma unroll
              for (int t = 0; t < 4; ++t) {
                mma16816(acc[t][2 * p], af[t].x, af[t].y, af[t].z, af[t].w, bf[0], bf[1]);
                mma16816(acc[t][2 * p + 1], af[t].x, af[t].y, af[t].z, af[t].w, bf[2], bf[3]);
              }
            }
          }
        }
      }
    }
  }

  // C of the swap-AB form: c0, c1 = (output column g, slots 2c, 2c+1), c2, c3 = (column g + 8).
  float* out = a.partial + blockIdx.y * a.split_stride + proj.col_offset;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int col = 16 * (cb * kMoeGemmTileCols + 4 * wc + t) + g;
#pragma unroll
    for (int n = 0; n < 4; ++n)
      store_slot_pair(out, a.out_cols, s0, 32 * ws + 8 * n + 2 * c, count, col, acc[t][n]);
  }
}

// Two blocks per SM: 64 accumulators per thread, 70 KB of shared memory per block.
template <tr::Codebook CB>
__global__ void __launch_bounds__(32 * kMoeGemmWarps, 2)
    moe_gemm_kernel(const __grid_constant__ MoeGemvArgs a) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  MoeGemmSmem& s = *reinterpret_cast<MoeGemmSmem*>(smem_raw);
  const int grp = blockIdx.z;
  if (grp >= *a.num_groups) return;
  const int expert = a.group_expert[grp];
  if (expert < 0 || expert >= a.num_experts) return;  // invalid ids are skipped (see moe.hpp)
  const int p = blockIdx.x / a.col_blocks;
  const MoeProj& proj = a.proj[p];
  const int bits = proj.bits[expert];
  if (a.fixed_k != 0 && bits != a.fixed_k) return;  // another tier's pass
  const int s0 = a.group_begin[grp], count = a.group_count[grp];
  const int cb = blockIdx.x % a.col_blocks;
  const int tiles_k = a.k >> 4;
  const int kt_begin = static_cast<int>(static_cast<int64_t>(tiles_k) * blockIdx.y / a.splits);
  const int kt_end = static_cast<int>(static_cast<int64_t>(tiles_k) * (blockIdx.y + 1) / a.splits);
  const uint32_t* w = proj.trellis[expert];
  switch (bits) {
#define EXL3_MOE_GEMM_CASE(KK)                                              \
  case KK:                                                                  \
    moe_gemm_block<KK, CB>(a, proj, w, s0, count, cb, kt_begin, kt_end, s); \
    break;
    EXL3_MOE_GEMM_CASE(1)
    EXL3_MOE_GEMM_CASE(2)
    EXL3_MOE_GEMM_CASE(3)
    EXL3_MOE_GEMM_CASE(4)
    EXL3_MOE_GEMM_CASE(5)
    EXL3_MOE_GEMM_CASE(6)
    EXL3_MOE_GEMM_CASE(7)
    EXL3_MOE_GEMM_CASE(8)
#undef EXL3_MOE_GEMM_CASE
    default:
      return;  // K was validated at upload
  }
}

template <tr::Codebook CB>
cudaError_t launch_moe_gemm_cb(const MoeGemvArgs& a, int max_groups, cudaStream_t stream) {
  constexpr size_t kSmem = sizeof(MoeGemmSmem);
  // Per launch rather than once: the attribute belongs to the current device.
  cudaError_t e =
      cudaFuncSetAttribute(moe_gemm_kernel<CB>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(a.col_blocks * a.nproj), static_cast<unsigned>(a.splits),
                  static_cast<unsigned>(max_groups));
  launch_pdl(moe_gemm_kernel<CB>, grid, 32 * kMoeGemmWarps, kSmem, stream, a);
  return cudaGetLastError();
}

}  // namespace exl3::cuda::detail
