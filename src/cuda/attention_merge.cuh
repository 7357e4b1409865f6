// The split-KV decode kernels' softmax-state merges (attention_decode.cu, CUDA cores, natural
// units; attention_decode_mma.cu, tensor cores, log2 units). A state is (m, l, O[HD]): the running
// max, the sum of exp(score - m) and the weighted sum of V rows over some keys; two states merge
// by rescaling both to the larger max. A block's warps merge in shared memory; a token's splits
// merge in the last of its blocks to finish, in split order, so the result is deterministic.
#pragma once

#include <cstdint>

#include "cuda/paged_kv.cuh"

namespace exl3::cuda::detail {

constexpr float kStateLn2 = 0.6931471805599453f;

// exp in the kernel's units, and a max in those units as the natural-unit max softmax_output takes.
template <bool Log2>
__device__ __forceinline__ float state_exp(float x) {
  return Log2 ? exp2f(x) : expf(x);
}
template <bool Log2>
__device__ __forceinline__ float state_max_natural(float m) {
  return Log2 ? m * kStateLn2 : m;
}

// Merges the W warps' states of `rows` query heads (wm / wl [W][stride], wo [W][stride][HD] in
// shared memory) into the block's state. With one active split that is the output: out_rows is
// head h0's output row, the others follow; else the state goes to `mine` ([rows][m, l, O[HD]]).
template <int HD, int W, bool Log2>
__device__ __forceinline__ void store_block_state(const float* wm, const float* wl, const float* wo,
                                                  int stride, int rows, bool single,
                                                  float* out_rows, float* mine, const float* sinks,
                                                  int h0) {
  for (int i = threadIdx.x; i < rows * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    float mx = kNegBig;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, wm[w * stride + r]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float f = state_exp<Log2>(wm[w * stride + r] - mx);
      num += wo[(w * stride + r) * HD + d] * f;
      den += wl[w * stride + r] * f;
    }
    if (single) {
      out_rows[r * HD + d] = softmax_output(state_max_natural<Log2>(mx), den, num, sinks, h0 + r);
    } else {
      float* st = mine + r * (HD + 2);
      if (d == 0) {
        st[0] = mx;
        st[1] = den;
      }
      st[2 + d] = num;
    }
  }
}

// Shared-memory floats merge_split_states needs for `rows` heads over `active` splits.
__host__ __device__ constexpr int split_merge_floats(int rows, int active) {
  return rows * active * 2 + rows * 2;
}

// The last block's merge of `active` split states of `rows` heads (split sp's state of head r at
// all + sp * split_floats + r * (HD + 2), written by other blocks: read through L2). Each head's
// max, split weights exp(m_sp - max) and denominator are computed once, in shared memory
// (`scratch`, split_merge_floats(rows, active) floats, free for the call), then each output
// channel sums its splits' numerators with those weights, in split order: the bits of
// recomputing the weights per channel, without its rows x HD x active x 3 loads.
template <int HD, bool Log2>
__device__ __forceinline__ void merge_split_states(const float* all, int64_t split_floats, int rows,
                                                   int active, float* scratch, float* out_rows,
                                                   const float* sinks, int h0) {
  float* sm = scratch;                 // [rows][active] m, then the split weights
  float* sl = sm + rows * active;      // [rows][active] l
  float* row_mx = sl + rows * active;  // [rows]
  float* row_den = row_mx + rows;      // [rows]
  for (int i = threadIdx.x; i < rows * active; i += blockDim.x) {
    const int r = i / active, sp = i % active;
    const float* st = all + sp * split_floats + r * (HD + 2);
    sm[i] = __ldcg(st);
    sl[i] = __ldcg(st + 1);
  }
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    float mx = kNegBig;
    for (int sp = 0; sp < active; ++sp) mx = fmaxf(mx, sm[r * active + sp]);
    float den = 0.0f;
    for (int sp = 0; sp < active; ++sp) {
      const float f = state_exp<Log2>(sm[r * active + sp] - mx);
      sm[r * active + sp] = f;
      den += sl[r * active + sp] * f;
    }
    row_mx[r] = mx;
    row_den[r] = den;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    float num = 0.0f;
#pragma unroll 8  // eight of a channel's L2 loads in flight
    for (int sp = 0; sp < active; ++sp)
      num += __ldcg(all + sp * split_floats + r * (HD + 2) + 2 + d) * sm[r * active + sp];
    out_rows[r * HD + d] =
        softmax_output(state_max_natural<Log2>(row_mx[r]), row_den[r], num, sinks, h0 + r);
  }
}

}  // namespace exl3::cuda::detail
