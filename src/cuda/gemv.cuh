// Swap-AB trellis GEMV for decode-sized batches: out^T[n, m] = W_hat^T[n, k] . x'^T[k, m].
//
// The weight tile is the mma.m16n8k16 A operand (16 output columns x 16 inputs) and up to 8
// tokens are the B operand, so a 1..8-token batch wastes no tensor-core rows on padding and the
// decoded weights never leave registers. Lane (g, c) of the format's tensor-core permutation
// holds exactly the A fragments of one tile: columns {g, g+8} x rows {2c, 2c+1, 2c+8, 2c+9}.
//
// Split halves (3INST, MCG): a codebook value is the sum of the two fp16 halves of one 32-bit
// word, so instead of pairing and adding halves (2 PRMT + HADD2 per two weights) the kernel
// feeds that word as an A pair (virtual k = 2 per weight) against the token's activation
// duplicated in both halves of B: two mma per tile, no pairing. MUL1 values are not a sum of
// halves and use the paired decode (one mma per tile).
//
// Grid: x = n / (16 * kGemvWarps * kGemvTiles) column blocks, y = split-K slices, z = groups of
// 8 * NT tokens. Each warp owns kGemvTiles adjacent tile columns and walks its split's k-tiles.
// Per token the arithmetic does not depend on m or on the other tokens (the split plan depends
// on (k, n) only), so rows are batch-invariant bit for bit across every m this kernel serves.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/had128.cuh"
#include "cuda/kernels.hpp"
#include "cuda/mma.cuh"
#include "cuda/pdl.cuh"
#include "cuda/trellis_decode.cuh"
#include "exl3/trellis/dispatch.hpp"

namespace exl3::cuda::detail {

constexpr int kGemvWarps = 4;
constexpr int kGemvTiles = 2;  // tile columns per warp
// k-steps in flight per warp: enough trellis bytes in flight to cover HBM latency at the
// occupancy the register budget allows.
constexpr int kGemvPrefetch = 4;

template <tr::Codebook CB>
constexpr bool kSplitHalves = CB != tr::Codebook::kMul1;

// One warp's share of a trellis GEMV: acc[t][nt] += x'[tokens of group nt] . W_hat[k-tiles
// kt_begin..kt_end, tile column j0 + t]. `w` is the projection's trellis as uint32 words
// ([k/16][n/16][8K]); xrow[nt] points at x' word c of the lane's token row (fp16 pairs); a lane
// whose token does not exist may point at any valid row (its B column only feeds its own,
// unstored output column). Shared by the dense GEMV and the MoE kernels.

// kSplit: multiply the unrounded half-pair words (3INST/MCG only; two mma per tile, cheapest
// decode) or the paired fp16 values (one mma per tile, cheaper when many token groups share the
// decode).
//
// The first kGemvPrefetch k-steps of trellis words are loaded before `prologue()` runs and the
// activations after it, so a caller may wait for its inputs there (PDL) or stage them: xrow[nt]
// then points at x' of k-tile x_kt0 (kSharedX: in shared memory, read with plain loads).
struct NoPrologue {
  __device__ void operator()() const {}
};

template <int K, tr::Codebook CB, int NT, bool kSplit = kSplitHalves<CB>, bool kSharedX = false,
          typename Prologue = NoPrologue>
__device__ __forceinline__ void gemv_accumulate(const uint32_t* __restrict__ w, int tiles_n, int j0,
                                                int kt_begin, int kt_end,
                                                const uint32_t* const (&xrow)[NT],
                                                float (&acc)[kGemvTiles][NT][4], int x_kt0 = 0,
                                                Prologue prologue = {}) {
  const int lane = threadIdx.x & 31;
  constexpr int kWords = 8 * K;
  constexpr int kLW = kLaneWords<K>;
  const LaneSpan<K> span(lane);
  const int64_t tile_stride = static_cast<int64_t>(tiles_n) * kWords;  // words per tile row
  // Running pointers, advanced once per loaded k-step (loads happen in k order), so the
  // addresses cost one 64-bit add each per step and the warp's tiles are immediate offsets.
  const uint32_t* col_base = w + static_cast<int64_t>(j0) * kWords + kt_begin * tile_stride;
  const uint32_t* wp[kLW];
  wp[0] = col_base + span.w0;
  wp[1] = col_base + span.w1;
  if constexpr (kLW == 3) wp[2] = col_base + span.w2;
  const uint32_t* xp[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xp[nt] = xrow[nt] + 8 * (kt_begin - x_kt0);

  struct Stage {
    uint32_t w[kGemvTiles][kLW];
    uint32_t x[NT][2];  // x'[tok][16kt + 2c .. 2c+1] and [.. 2c+8 .. 2c+9] as fp16 pairs
  };
  Stage ring[kGemvPrefetch];
  auto load_w = [&](Stage& st) {
#pragma unroll
    for (int i = 0; i < kLW; ++i) {
#pragma unroll
      for (int t = 0; t < kGemvTiles; ++t) st.w[t][i] = ld_stream(wp[i] + t * kWords);
      wp[i] += tile_stride;
    }
  };
  auto load_x = [&](Stage& st) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if constexpr (kSharedX) {
        st.x[nt][0] = xp[nt][0];
        st.x[nt][1] = xp[nt][4];
      } else {
        st.x[nt][0] = __ldg(xp[nt]);
        st.x[nt][1] = __ldg(xp[nt] + 4);
      }
      xp[nt] += 8;
    }
  };
#pragma unroll
  for (int d = 0; d < kGemvPrefetch; ++d)
    if (kt_begin + d < kt_end) load_w(ring[d]);
  prologue();
#pragma unroll
  for (int d = 0; d < kGemvPrefetch; ++d)
    if (kt_begin + d < kt_end) load_x(ring[d]);

  for (int kt = kt_begin; kt < kt_end; kt += kGemvPrefetch) {
#pragma unroll
    for (int d = 0; d < kGemvPrefetch; ++d) {
      const int step = kt + d;
      if (step < kt_end) {
        Stage& cur = ring[d];
#pragma unroll
        for (int t = 0; t < kGemvTiles; ++t) {
          const uint32_t u2 = kLW == 3 ? cur.w[t][kLW - 1] : 0u;
          if constexpr (kSplit) {
            static_assert(kSplitHalves<CB>, "MUL1 has no split-halves form");
            uint32_t y[8];
            decode_lane_halves<K, CB>(cur.w[t][0], cur.w[t][1], u2, span.off, y);
            // mma s takes rows 2c+s and 2c+8+s: positions s, s+4 (column g+8), s+2, s+6.
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              const uint32_t sel = s == 0 ? 0x1010u : 0x3232u;  // duplicate the low / high half
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                mma16816(acc[t][nt], y[s], y[s + 4], y[s + 2], y[s + 6],
                         __byte_perm(cur.x[nt][0], 0u, sel), __byte_perm(cur.x[nt][1], 0u, sel));
              }
            }
          } else {
            uint32_t b[4];
            decode_lane<K, CB>(cur.w[t][0], cur.w[t][1], u2, span.off, b);
            // A = (col g: rows 2c,2c+1), (col g+8: rows 2c,2c+1), (col g: rows 2c+8,2c+9), (col
            // g+8: ...).
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              mma16816(acc[t][nt], b[0], b[2], b[1], b[3], cur.x[nt][0], cur.x[nt][1]);
            }
          }
        }
        if (step + kGemvPrefetch < kt_end) {
          load_w(cur);
          load_x(cur);
        }
      }
    }
  }
}

// The fused input rotation of a staged GEMV block (m <= 8 rows, 4 warps): x [m, k] * suh, rotated
// per 128-chunk and range-guarded exactly as rotate_input_kernel does it (the guard's divisor from
// the whole row, so every block of the grid finds the same one), for the chunks c_lo .. c_lo +
// chunks - 1 only, into s_x [m][row_words] (fp16 pairs); the divisors into s_scale[m]. Ends with
// the block synchronised. Inlined: as a call it held the trellis words already in flight in
// preserved registers (80 per thread at K4 against 72 unstaged, ptxas); inlined, the staged kernels
// take the unstaged ones' registers at every K.
static __device__ __forceinline__ void stage_rotated_rows(const void* x, DType in_type,
                                                          const uint16_t* suh, int m, int k,
                                                          int c_lo, int chunks, int row_words,
                                                          uint32_t* s_x, float* s_scale) {
  __shared__ float s_red[kGemvWarps][8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = 0; t < m; ++t) {
    float mx = 0.0f;
#pragma unroll 4
    for (int64_t i = 4 * threadIdx.x; i < k; i += 4 * 32 * kGemvWarps)
      mx = guard_max4(x, in_type, static_cast<int64_t>(t) * k + i, suh, i, mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
    if (lane == 0) s_red[warp][t] = mx;
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < m) {
    float row_max = 0.0f;
#pragma unroll
    for (int w = 0; w < kGemvWarps; ++w) row_max = fmaxf(row_max, s_red[w][threadIdx.x]);
    s_scale[threadIdx.x] = guard_divisor(row_max * kHadGain);
  }
  __syncthreads();
  for (int p = warp; p < m * chunks; p += kGemvWarps) {
    const int t = p / chunks, ch = c_lo + p % chunks;
    const int64_t col =
        static_cast<int64_t>(ch) * 128 + 4 * lane;  // ch < ceil(kt_end / 8) <= k / 128
    const float mul = exl3::trellis::kHadScale / s_scale[t];
    const uint2 v =
        rotate_chunk_lane4(x, in_type, static_cast<int64_t>(t) * k + col, suh, col, mul, lane);
    *reinterpret_cast<uint2*>(s_x + t * row_words + (p % chunks) * 64 + 2 * lane) = v;
  }
  __syncthreads();
}

// One launch for up to kGemvGroupMax linears that share their input rows (q/k/v, or one linear
// alone): blockIdx.x walks the members' 128-column blocks, y the split-K slices (a member with
// fewer splits leaves the rest idle), z groups of 8 * NT tokens. Each block writes its split's
// partial [split][m][n]; the last of a column block's splits to finish (a per-member counter,
// reset by that block) runs the epilogue for those 128 columns: sum of the splits in split
// order, output rotation, scales, bias. So a linear is its input rotation plus this one kernel,
// and the rows keep the unfused arithmetic bit for bit.
static_assert(16 * kGemvWarps * kGemvTiles == 128, "a GEMV column block is one Hadamard chunk");

// kStaged (one token group, m <= 8): the block rotates its rows' k slice itself
// (stage_rotated_rows) instead of reading xr and row_scale, so the linear is this one kernel,
// and it loads its first trellis words before waiting for the previous kernel (the weights are
// constant; see pdl.cuh), so that trip to memory overlaps the previous kernel's tail.
template <int K, tr::Codebook CB, int NT, bool kStaged>
__global__ void __launch_bounds__(32 * kGemvWarps)
    gemv_kernel(const __grid_constant__ GemvGroupArgs a) {
  static_assert(!kStaged || NT == 1, "staging covers one 8-token group");
  if constexpr (!kStaged) pdl_begin();
  extern __shared__ __align__(16) uint32_t s_x[];  // kStaged: [m][staged_chunks * 64] fp16 pairs
  __shared__ float s_scale[8];
  __shared__ int s_last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  int mi = 0;
  while (mi + 1 < a.count && static_cast<int>(blockIdx.x) >= a.member[mi + 1].block_begin) ++mi;
  const GemvMember& mem = a.member[mi];
  const int split = blockIdx.y;
  if (split >= mem.splits) {
    if constexpr (kStaged) pdl_begin();  // nothing to do, but the PDL contract stands
    return;
  }
  const int m = a.m, k = a.k, n = mem.n;
  const int cb = static_cast<int>(blockIdx.x) - mem.block_begin;
  const int tiles_k = k >> 4;
  const int j0 = (cb * kGemvWarps + warp) * kGemvTiles;
  const int tok0 = blockIdx.z * 8 * NT;
  const int kt_begin = static_cast<int>(static_cast<int64_t>(tiles_k) * split / mem.splits);
  const int kt_end = static_cast<int>(static_cast<int64_t>(tiles_k) * (split + 1) / mem.splits);

  // B fragments come from x' rows tok0 + 8 nt + g. Lanes of tokens >= m read row 0 instead:
  // B column g only feeds output column (token) g, which is never stored, so no masking.
  const uint32_t* xrow[NT];
  const int c_lo = kt_begin >> 3;  // first 128-chunk of the slice (8 k-tiles per chunk)
  const int row_words = a.staged_chunks * 64;
  if constexpr (kStaged) {
    xrow[0] = s_x + (g < m ? g : 0) * row_words + c;
  } else {
    const uint32_t* xr32 = reinterpret_cast<const uint32_t*>(mem.xr);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int tok = tok0 + 8 * nt + g;
      xrow[nt] = xr32 + static_cast<int64_t>(tok < m ? tok : 0) * (k >> 1) + c;
    }
  }
  auto prologue = [&] {
    if constexpr (kStaged) {
      pdl_begin();
      stage_rotated_rows(a.x, a.in_type, mem.suh, m, k, c_lo, ((kt_end + 7) >> 3) - c_lo, row_words,
                         s_x, s_scale);
    }
  };
  auto row_scale = [&](int tok) { return kStaged ? s_scale[tok] : mem.row_scale[tok]; };

  float acc[kGemvTiles][NT][4];
#pragma unroll
  for (int t = 0; t < kGemvTiles; ++t)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][nt][i] = 0.0f;
  gemv_accumulate<K, CB, NT, kSplitHalves<CB>, kStaged>(
      mem.trellis, n >> 4, j0, kt_begin, kt_end, xrow, acc, kStaged ? 8 * c_lo : 0, prologue);

  // C fragment: c0, c1 = (column g, tokens 2c, 2c+1), c2, c3 = (column g+8, same tokens).
  float* out = mem.partial + static_cast<int64_t>(split) * m * n;
#pragma unroll
  for (int t = 0; t < kGemvTiles; ++t) {
    const int col = 16 * (j0 + t) + g;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int ta = tok0 + 8 * nt + 2 * c, tb = ta + 1;
      if (ta < m) {
        out[static_cast<int64_t>(ta) * n + col] = acc[t][nt][0];
        out[static_cast<int64_t>(ta) * n + col + 8] = acc[t][nt][2];
      }
      if (tb < m) {
        out[static_cast<int64_t>(tb) * n + col] = acc[t][nt][1];
        out[static_cast<int64_t>(tb) * n + col + 8] = acc[t][nt][3];
      }
    }
  }

  int32_t* counter = mem.counters + static_cast<int64_t>(blockIdx.z) * (n >> 7) + cb;
  if (mem.splits > 1) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(counter, 1) == mem.splits - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
  } else {
    __syncthreads();
  }
  const int tok_end = min(m, tok0 + 8 * NT);
  const int64_t col0 = static_cast<int64_t>(cb) * 128;
  if (tok_end - tok0 >= kGemvWarps || mem.splits <= kSplitSums) {
    for (int tok = tok0 + warp; tok < tok_end; tok += kGemvWarps) {
      finish_output_chunk(mem.partial, mem.splits, m, n, tok, col0, row_scale(tok), mem.svh,
                          mem.bias, mem.y, a.out_type, lane);
    }
  } else {
    // Fewer tokens than warps (decode): each warp builds one of a token's running split sums, so
    // the 128 columns' reduction is four short load chains instead of one long one.
    static_assert(kGemvWarps == kSplitSums, "one running sum per warp");
    __shared__ float4 s_sum[kSplitSums][32];
    for (int tok = tok0; tok < tok_end; ++tok) {
      const int64_t idx = static_cast<int64_t>(tok) * n + col0 + 4 * lane;
      s_sum[warp][lane] =
          split_sum(mem.partial, mem.splits, warp, static_cast<int64_t>(m) * n, idx);
      __syncthreads();
      if (warp == 0) {
        float4 p[kSplitSums];
#pragma unroll
        for (int j = 0; j < kSplitSums; ++j) p[j] = s_sum[j][lane];
        float v[4];
        add_split_sums(p, v);
        finish_summed_chunk(v, n, tok, col0, row_scale(tok), mem.svh, mem.bias, mem.y, a.out_type,
                            lane);
      }
      __syncthreads();
    }
  }
  if (mem.splits > 1 && threadIdx.x == 0) *counter = 0;  // ready for the next run
}

template <int K, tr::Codebook CB, int NT, bool kStaged = false>
cudaError_t launch_gemv_nt(const GemvGroupArgs& a, cudaStream_t stream) {
  int blocks = 0, splits = 1;
  for (int i = 0; i < a.count; ++i) {
    blocks += a.member[i].n / 128;
    splits = a.member[i].splits > splits ? a.member[i].splits : splits;
  }
  const unsigned gz = static_cast<unsigned>((a.m + 8 * NT - 1) / (8 * NT));
  const size_t smem = kStaged ? static_cast<size_t>(a.m) * a.staged_chunks * 256 : 0;
  launch_pdl(gemv_kernel<K, CB, NT, kStaged>,
             dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(splits), gz),
             dim3(32 * kGemvWarps), smem, stream, a);
  return cudaGetLastError();
}

// Token groups: one 8-token B fragment per group for m <= 8, two for m <= 16, four beyond
// (the grid's z covers any m; the planner keeps this path to small m).
template <int K, tr::Codebook CB>
cudaError_t launch_gemv_cb(const GemvGroupArgs& a, cudaStream_t stream) {
  if (a.staged_chunks > 0) {
    if (a.m > 8 || a.x == nullptr) return cudaErrorInvalidValue;
    return launch_gemv_nt<K, CB, 1, true>(a, stream);
  }
  if (a.m <= 8) return launch_gemv_nt<K, CB, 1>(a, stream);
  if (a.m <= 16) return launch_gemv_nt<K, CB, 2>(a, stream);
  return launch_gemv_nt<K, CB, 4>(a, stream);
}

template <int K>
cudaError_t gemv_k(tr::Codebook cb, const GemvGroupArgs& a, cudaStream_t stream) {
  return tr::with_codebook(
      cb, [&](auto c) { return launch_gemv_cb<K, decltype(c)::value>(a, stream); });
}

// Resident blocks per SM of the single-group variant, for the split-K planner.
template <int K>
int gemv_blocks_per_sm_k(tr::Codebook cb) {
  int blocks = 0;
  const cudaError_t e = tr::with_codebook(cb, [&](auto c) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, gemv_kernel<K, decltype(c)::value, 1, false>, 32 * kGemvWarps, 0);
  });
  return e == cudaSuccess && blocks > 0 ? blocks : 1;
}

}  // namespace exl3::cuda::detail
