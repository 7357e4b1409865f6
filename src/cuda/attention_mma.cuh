// The tensor-core attention kernels' shared step (attention_prefill.cu's fp16 path and
// attention_decode_mma.cu): a warp owns 16 query rows as the M rows of mma.m16n8k16, so lane
// (g, c) = (lane / 4, lane % 4) holds rows g and g + 8 of each score n-tile and each O fragment.
// Scores are in log2 units (q pre-scaled by scale * log2 e), so each weight is one exp2.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/mma.cuh"
#include "cuda/paged_kv.cuh"

namespace exl3::cuda::detail {

// One online-softmax step over NT score n-tiles of 8 keys (masked scores already kNegBig): the
// running max of rows g and g + 8 (a quad holds a row), O and the running sums rescaled to it,
// then the scores replaced by their weights exp2(s - max) (0 where masked) and added to the sums,
// n-tile by n-tile.
template <int HD, int NT>
__device__ __forceinline__ void online_softmax_step(float (&sc)[NT][4], float (&o)[HD / 8][4],
                                                    float& ma, float& mb, float& la, float& lb) {
  float xa = kNegBig, xb = kNegBig;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      xa = fmaxf(xa, sc[n][e]);
      xb = fmaxf(xb, sc[n][2 + e]);
    }
  }
#pragma unroll
  for (int sh = 1; sh <= 2; sh <<= 1) {
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, sh));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, sh));
  }
  const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
  const float fa = exp2f(ma - na), fb = exp2f(mb - nb);
  ma = na;
  mb = nb;
  la *= fa;
  lb *= fb;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    o[n][0] *= fa;
    o[n][1] *= fa;
    o[n][2] *= fb;
    o[n][3] *= fb;
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      sc[n][e] = sc[n][e] == kNegBig ? 0.0f : exp2f(sc[n][e] - na);
      sc[n][2 + e] = sc[n][2 + e] == kNegBig ? 0.0f : exp2f(sc[n][2 + e] - nb);
      la += sc[n][e];
      lb += sc[n][2 + e];
    }
  }
}

// O += P V over NT n-tiles of weights (NT / 2 steps of 16 keys: two n-tiles' S fragments are the
// A fragment of one step). sv is the first key's staged V row, LD halves per row; the weights are
// split into fp16 hi + lo and both halves multiplied.
template <int HD, int NT, int LD>
__device__ __forceinline__ void accumulate_pv(const float (&p)[NT][4], float (&o)[HD / 8][4],
                                              const __half* sv, int lane) {
  static_assert(NT % 2 == 0, "whole 16-key steps");
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    uint32_t ph[4], pl[4];
    split_pair(p[2 * kk][0], p[2 * kk][1], ph[0], pl[0]);
    split_pair(p[2 * kk][2], p[2 * kk][3], ph[1], pl[1]);
    split_pair(p[2 * kk + 1][0], p[2 * kk + 1][1], ph[2], pl[2]);
    split_pair(p[2 * kk + 1][2], p[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
    for (int x0 = 0; x0 < HD; x0 += 16) {
      uint32_t vb[4];  // b0, b1 of channels x0 .. x0 + 7, then of x0 + 8 .. x0 + 15
      ldmatrix_x4_trans(
          vb, sv + (16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + x0 + 8 * (lane >> 4));
      mma16816(o[x0 / 8], ph, vb[0], vb[1]);
      mma16816(o[x0 / 8], pl, vb[0], vb[1]);
      mma16816(o[x0 / 8 + 1], ph, vb[2], vb[3]);
      mma16816(o[x0 / 8 + 1], pl, vb[2], vb[3]);
    }
  }
}

}  // namespace exl3::cuda::detail
