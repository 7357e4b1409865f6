// Gated DeltaNet kernels (see include/exl3/cuda/delta_net.hpp). Per layer:
//   1. the causal depthwise convolution + SiLU of every token, reading the inputs before a run's
//      first token from its slot's window;
//   2. each run's window advanced to its last conv_kernel - 1 inputs (after 1 has read it);
//   3. the recurrence, one block per (run, value head), ending in the head's gated RMSNorm: in a
//      decode step token by token with S in registers (thread (j, g) holds column j of rows g,
//      g + G, ... where G = 256 / head_v_dim), in a step with longer runs by chunks of 32 tokens
//      in shared memory, up to 32 value channels per block (chunk_scan_kernel), then the gated
//      norm (gated_norm_kernel).
#include <algorithm>
#include <cstdint>

#include "cuda/paged_kv.cuh"
#include "cuda/pdl.cuh"
#include "exl3/cpu/activation.hpp"
#include "exl3/cuda/delta_net.hpp"

namespace exl3::cuda {
namespace {

using detail::block_sum;

constexpr int kThreads = 256;
constexpr int kMaxRows = 64;  // key rows of S per thread
constexpr int kMaxTaps = 8;

// Channel c (< conv_dim) of token t's convolution input [q | k | v]: in Qwen3-Next's layout each
// key head g owns [q_g, k_g, v of its value heads, z of its value heads] in qkvz.
__device__ __forceinline__ float conv_input(const DeltaNetShape& s, const float* const* in,
                                            int64_t t, int c) {
  if (s.split_inputs) return in[0][t * s.conv_dim() + c];
  const int dk = s.head_k_dim, kd = s.key_dim(), r = s.num_v_heads / s.num_k_heads;
  const int group = 2 * dk + 2 * r * s.head_v_dim;
  int g, off;
  if (c < kd) {
    g = c / dk;
    off = c % dk;
  } else if (c < 2 * kd) {
    g = (c - kd) / dk;
    off = dk + (c - kd) % dk;
  } else {
    const int cv = c - 2 * kd, vw = r * s.head_v_dim;
    g = cv / vw;
    off = 2 * dk + cv % vw;
  }
  const int64_t width = 2 * static_cast<int64_t>(kd) + 2 * s.value_dim();
  return in[0][t * width + g * group + off];
}

struct Inputs {
  const float* p[4];
};

__global__ void conv_kernel(DeltaNetShape s, Inputs in, DeltaNetWeightsDev w, DeltaNetRuns runs,
                            DeltaNetStatePool pool, float* conv_out) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int c = static_cast<int>(blockIdx.y) * blockDim.x + threadIdx.x;
  const int cd = s.conv_dim(), taps = s.conv_kernel;
  if (c >= cd) return;
  const int run = runs.token_run[t];
  const int64_t j = t - runs.first[run];  // token t's place in its run
  const float* window = pool.base + runs.slot[run] * pool.slot_floats + pool.layer_offset +
                        static_cast<int64_t>(s.num_v_heads) * s.head_k_dim * s.head_v_dim;
  const float* wc = w.conv + static_cast<int64_t>(c) * taps;
  float acc = wc[taps - 1] * conv_input(s, in.p, t, c);
  for (int d = 1; d < taps; ++d) {  // the input d tokens back
    const float x = j >= d ? conv_input(s, in.p, t - d, c)
                           : window[static_cast<int64_t>(taps - 1 - (d - j)) * cd + c];
    acc += wc[taps - 1 - d] * x;
  }
  conv_out[t * cd + c] = cpu::silu(acc);
}

// Row q of the new window is the input taps - 1 - q tokens before the run's end: from the run
// when it is long enough, else row q + len of the old window (rows are rewritten in increasing
// order, and each reads a later one).
__global__ void conv_window_kernel(DeltaNetShape s, Inputs in, DeltaNetRuns runs,
                                   DeltaNetStatePool pool) {
  pdl_begin();
  const int run = blockIdx.x;
  const int c = static_cast<int>(blockIdx.y) * blockDim.x + threadIdx.x;
  const int cd = s.conv_dim(), keep = s.conv_kernel - 1;
  if (c >= cd) return;
  const int64_t first = runs.first[run], len = runs.len[run];
  float* window = pool.base + runs.slot[run] * pool.slot_floats + pool.layer_offset +
                  static_cast<int64_t>(s.num_v_heads) * s.head_k_dim * s.head_v_dim;
  for (int q = 0; q < keep; ++q) {
    const int64_t back = keep - q;  // tokens before the run's end
    window[static_cast<int64_t>(q) * cd + c] =
        len >= back ? conv_input(s, in.p, first + len - back, c) : window[(q + len) * cd + c];
  }
}

__global__ void __launch_bounds__(kThreads)
    scan_kernel(DeltaNetShape s, Inputs in, const float* conv_out, DeltaNetWeightsDev w,
                DeltaNetRuns runs, DeltaNetStatePool pool, float* out) {
  pdl_begin();
  __shared__ float qs[kThreads], ks[kThreads], vs[kThreads], zs[kThreads], red[kThreads],
      delta[kThreads], scratch[32];
  const int run = blockIdx.x, h = blockIdx.y;
  const int dk = s.head_k_dim, dv = s.head_v_dim, kd = s.key_dim(), vd = s.value_dim();
  const int cd = s.conv_dim(), r = s.num_v_heads / s.num_k_heads, kh = h / r, hj = h % r;
  const int groups = kThreads / dv, tid = threadIdx.x, col = tid % dv, g = tid / dv;
  float* S = pool.base + runs.slot[run] * pool.slot_floats + pool.layer_offset +
             static_cast<int64_t>(h) * dk * dv;
  float st[kMaxRows];
#pragma unroll
  for (int q = 0; q < kMaxRows; ++q) {
    const int i = g + q * groups;
    st[q] = i < dk ? S[static_cast<int64_t>(i) * dv + col] : 0.0f;
  }
  const float q_scale = rsqrtf(static_cast<float>(dk));
  const float a = w.a[h], dt_bias = w.dt_bias[h];
  const int64_t first = runs.first[run], last = first + runs.len[run];
  const int64_t qkvz_w = 2 * static_cast<int64_t>(kd) + 2 * vd, group = 2 * dk + 2 * r * dv;
  for (int64_t t = first; t < last; ++t) {
    const float* x = conv_out + t * cd;
    float bt, at;
    if (s.split_inputs) {
      bt = in.p[2][t * s.num_v_heads + h];
      at = in.p[3][t * s.num_v_heads + h];
    } else {
      bt = in.p[1][t * 2 * s.num_v_heads + kh * 2 * r + hj];
      at = in.p[1][t * 2 * s.num_v_heads + kh * 2 * r + r + hj];
    }
    const float beta = cpu::sigmoid(bt), decay = expf(-a * cpu::softplus(at + dt_bias));
    float qv = 0.0f, kv = 0.0f;
    if (tid < dk) {
      qv = x[kh * dk + tid];
      kv = x[kd + kh * dk + tid];
      qs[tid] = qv;
      ks[tid] = kv;
    }
    if (tid < dv) {
      vs[tid] = x[2 * kd + h * dv + tid];
      zs[tid] = s.split_inputs ? in.p[1][t * vd + h * dv + tid]
                               : in.p[0][t * qkvz_w + kh * group + 2 * dk + r * dv + hj * dv + tid];
    }
    // L2 norms of q and k over the head (+1e-6 inside the root, as the reference).
    const float q_inv = rsqrtf(block_sum(qv * qv, scratch) + 1e-6f) * q_scale;
    const float k_inv = rsqrtf(block_sum(kv * kv, scratch) + 1e-6f);
    // S decays, then S^T k.
    float part = 0.0f;
#pragma unroll
    for (int q = 0; q < kMaxRows; ++q) {
      const int i = g + q * groups;
      if (i < dk) {
        st[q] *= decay;
        part += st[q] * ks[i];
      }
    }
    red[tid] = part * k_inv;
    __syncthreads();
    if (g == 0) {
      float sum = 0.0f;
      for (int gg = 0; gg < groups; ++gg) sum += red[gg * dv + col];
      delta[col] = (vs[col] - sum) * beta;
    }
    __syncthreads();
    // S += k delta^T, then o = S^T q.
    const float dj = delta[col] * k_inv;
    float o = 0.0f;
#pragma unroll
    for (int q = 0; q < kMaxRows; ++q) {
      const int i = g + q * groups;
      if (i < dk) {
        st[q] += ks[i] * dj;
        o += st[q] * qs[i];
      }
    }
    red[tid] = o * q_inv;  // the reads of red above ended before the last barrier
    __syncthreads();
    float oj = 0.0f;
    if (g == 0)
      for (int gg = 0; gg < groups; ++gg) oj += red[gg * dv + col];
    // The gated RMSNorm over the head: norm, weight, then silu(z).
    const float ms = block_sum(g == 0 ? oj * oj : 0.0f, scratch) / static_cast<float>(dv);
    if (g == 0) {
      const float inv = rsqrtf(ms + s.norm_eps);
      out[t * vd + h * dv + col] = oj * inv * w.norm[col] * cpu::silu(zs[col]);
    }
    __syncthreads();  // qs / ks / vs / zs are rewritten by the next token
  }
#pragma unroll
  for (int q = 0; q < kMaxRows; ++q) {
    const int i = g + q * groups;
    if (i < dk) S[static_cast<int64_t>(i) * dv + col] = st[q];
  }
}

// The same recurrence over chunks of up to C tokens of a run (transformers' chunked form, in
// fp32): with G_i the cumulative log decay of the chunk's tokens up to i and S0 the state before
// it, the write strengths u_i = beta_i (v_i - e^G_i S0^T k_i) - sum_{j<i} A_ij u_j (A_ij =
// beta_i e^(G_i - G_j) k_i.k_j) come by forward substitution, the outputs are
// o_i = e^G_i S0^T q_i + sum_{j<=i} e^(G_i - G_j) (q_i.k_j) u_j, and the state becomes
// e^G_last S0 + sum_j e^(G_last - G_j) k_j u_j^T. A chunk costs a few small matrix products in
// shared memory (S, the chunk's q / k / u and the C x C products) and a dozen barriers, where the
// token-by-token kernel pays a handful of barriers per token.
constexpr int kChunk = 32;
constexpr size_t kChunkSmemLimit = 200 * 1024;
// Rows of a thread's register tiles. A block has at most 32 value channels (chunk_cols), so at
// least kThreads / 8 = 32 row groups: one chunk token per thread, and the state's rows (head_k_dim
// <= kThreads) in passes of SR rows per thread, SR = 4 when head_k_dim <= 4 row groups (128 at 32
// channels), else 8. Tiles sized for a whole head (8 x 16 rows) spilled to local memory: 128
// registers and 0.8 M local requests per launch under Nsight Compute.
constexpr int kTileRows = 1;
static_assert(kThreads / (32 / 4) >= kChunk, "one chunk token per thread row");
constexpr int kMaxStateRows = 8;
static_assert(kMaxStateRows * (kThreads / (32 / 4)) >= kThreads, "head_k_dim <= kThreads rows");

template <int C, int kStateRows>
__global__ void __launch_bounds__(kThreads)
    chunk_scan_kernel(DeltaNetShape s, Inputs in, const float* conv_out, DeltaNetWeightsDev w,
                      DeltaNetRuns runs, DeltaNetStatePool pool, int cols, float* out) {
  pdl_begin();
  extern __shared__ float sm[];
  // Block (run, h, cb) owns value channels c_base .. c_base + cols - 1 of head h: S's columns are
  // independent (the chunk's k / q products are recomputed by each column block).
  const int run = blockIdx.x, h = blockIdx.y, c_base = static_cast<int>(blockIdx.z) * cols;
  const int dk = s.head_k_dim, dv = s.head_v_dim, kd = s.key_dim(), vd = s.value_dim();
  const int cd = s.conv_dim(), r = s.num_v_heads / s.num_k_heads, kh = h / r, hj = h % r;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, warps = kThreads / 32;
  // Register tiles of the chunk's products: thread (cg, rg) owns value channels cg + jj *
  // col_groups (jj < 4) of rows rg + ii * row_groups.
  const int col_groups = cols / 4, row_groups = kThreads / col_groups;
  const int dkp = dk + 1;  // q / k rows padded: threads of a warp read several rows at once
  const int cg = tid % col_groups, rg = tid / col_groups;
  float* sS = sm;              // [dk, cols]
  float* sK = sS + dk * cols;  // [C, dkp], L2-normed
  float* sQ = sK + C * dkp;    // [C, dkp], L2-normed and scaled
  float* sU = sQ + C * dkp;    // [C, cols]: v, then u
  float* sW = sU + C * cols;   // [C, cols]: S0^T k, then the outputs
  float* sA = sW + C * cols;   // [C, C]
  float* sP = sA + C * C;      // [C, C]
  float* sG = sP + C * C;      // [C]: cumulative log decay
  float* sB = sG + C;          // [C]: beta
  float* sE = sB + C;          // [C]: e^G_i
  float* sD = sE + C;          // [C]: e^(G_last - G_i)
  float* S = pool.base + runs.slot[run] * pool.slot_floats + pool.layer_offset +
             static_cast<int64_t>(h) * dk * dv;
  for (int e = tid; e < dk * cols; e += kThreads) sS[e] = S[(e / cols) * dv + c_base + e % cols];
  const float q_scale = rsqrtf(static_cast<float>(dk));
  const float a = w.a[h], dt_bias = w.dt_bias[h];
  const int64_t first = runs.first[run], last = first + runs.len[run];
  for (int64_t c0 = first; c0 < last; c0 += C) {
    const int L = static_cast<int>(last - c0 < C ? last - c0 : C);
    __syncthreads();                         // the previous chunk is done with the shared arrays
    for (int i = warp; i < L; i += warps) {  // a warp per token: q, k normed; v; beta, log decay
      const int64_t t = c0 + i;
      const float* x = conv_out + t * cd;
      float sq = 0.0f, sk = 0.0f;
      for (int d = lane; d < dk; d += 32) {
        const float qv = x[kh * dk + d], kv = x[kd + kh * dk + d];
        sQ[i * dkp + d] = qv;
        sK[i * dkp + d] = kv;
        sq += qv * qv;
        sk += kv * kv;
      }
      sq = detail::warp_sum(sq);
      sk = detail::warp_sum(sk);
      const float qi = rsqrtf(sq + 1e-6f) * q_scale, ki = rsqrtf(sk + 1e-6f);
      for (int d = lane; d < dk; d += 32) {
        sQ[i * dkp + d] *= qi;
        sK[i * dkp + d] *= ki;
      }
      for (int d = lane; d < cols; d += 32) sU[i * cols + d] = x[2 * kd + h * dv + c_base + d];
      if (lane == 0) {
        float bt, at;
        if (s.split_inputs) {
          bt = in.p[2][t * s.num_v_heads + h];
          at = in.p[3][t * s.num_v_heads + h];
        } else {
          bt = in.p[1][t * 2 * s.num_v_heads + kh * 2 * r + hj];
          at = in.p[1][t * 2 * s.num_v_heads + kh * 2 * r + r + hj];
        }
        sB[i] = cpu::sigmoid(bt);
        sG[i] = -a * cpu::softplus(at + dt_bias);
      }
    }
    __syncthreads();
    if (tid == 0) {
      for (int i = 1; i < L; ++i) sG[i] += sG[i - 1];
    }
    __syncthreads();
    if (tid < L) {
      sE[tid] = expf(sG[tid]);
      sD[tid] = expf(sG[L - 1] - sG[tid]);
    }
    // S0^T k_i for every token (register tiles: 4 value channels by up to 8 tokens per thread);
    // then a warp per pair (i, j <= i) for k_i.k_j and q_i.k_j.
    {
      float acc[kTileRows][4] = {};
      for (int q = 0; q < dk; ++q) {
        float b[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) b[jj] = sS[q * cols + cg + jj * col_groups];
#pragma unroll
        for (int ii = 0; ii < kTileRows; ++ii) {
          const int i = rg + ii * row_groups;
          if (i < L) {
            const float av = sK[i * dkp + q];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) acc[ii][jj] += av * b[jj];
          }
        }
      }
#pragma unroll
      for (int ii = 0; ii < kTileRows; ++ii) {
        const int i = rg + ii * row_groups;
        if (i < L) {
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) sW[i * cols + cg + jj * col_groups] = acc[ii][jj];
        }
      }
    }
    for (int p = warp; p < L * L; p += warps) {
      const int i = p / L, j = p % L;
      if (j > i) continue;
      float kk = 0.0f, qk = 0.0f;
      for (int d = lane; d < dk; d += 32) {
        const float kj = sK[j * dkp + d];
        kk += sK[i * dkp + d] * kj;
        qk += sQ[i * dkp + d] * kj;
      }
      kk = detail::warp_sum(kk);
      qk = detail::warp_sum(qk);
      if (lane == 0) {
        const float e = expf(sG[i] - sG[j]);
        sP[i * C + j] = e * qk;
        if (j < i) sA[i * C + j] = sB[i] * e * kk;
      }
    }
    __syncthreads();
    // u by forward substitution, one value channel per thread.
    for (int j = tid; j < cols; j += kThreads) {
      for (int i = 0; i < L; ++i) {
        float u = sB[i] * (sU[i * cols + j] - sE[i] * sW[i * cols + j]);
        for (int m = 0; m < i; ++m) u -= sA[i * C + m] * sU[m * cols + j];
        sU[i * cols + j] = u;
      }
    }
    __syncthreads();
    // Outputs into sW (the same tiles).
    {
      float acc[kTileRows][4] = {};
      for (int q = 0; q < dk; ++q) {
        float b[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) b[jj] = sS[q * cols + cg + jj * col_groups];
#pragma unroll
        for (int ii = 0; ii < kTileRows; ++ii) {
          const int i = rg + ii * row_groups;
          if (i < L) {
            const float av = sQ[i * dkp + q];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) acc[ii][jj] += av * b[jj];
          }
        }
      }
#pragma unroll
      for (int ii = 0; ii < kTileRows; ++ii) {
        const int i = rg + ii * row_groups;
        if (i >= L) continue;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) acc[ii][jj] *= sE[i];
        for (int m = 0; m <= i; ++m) {
          const float pm = sP[i * C + m];
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) acc[ii][jj] += pm * sU[m * cols + cg + jj * col_groups];
        }
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) sW[i * cols + cg + jj * col_groups] = acc[ii][jj];
      }
    }
    // Every thread has read S0 and written its outputs before S moves on and sW is read back.
    __syncthreads();
    // The state moves to the chunk's end; the outputs go out.
    const float e_last = sE[L - 1];
    for (int q0 = 0; q0 < dk; q0 += kStateRows * row_groups) {  // rows q0 + rg + ii * row_groups
      float acc[kStateRows][4];
#pragma unroll
      for (int ii = 0; ii < kStateRows; ++ii) {
        const int q = q0 + rg + ii * row_groups;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          acc[ii][jj] = q < dk ? e_last * sS[q * cols + cg + jj * col_groups] : 0.0f;
      }
      for (int m = 0; m < L; ++m) {
        float b[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) b[jj] = sU[m * cols + cg + jj * col_groups];
        const float dm = sD[m];
#pragma unroll
        for (int ii = 0; ii < kStateRows; ++ii) {
          const int q = q0 + rg + ii * row_groups;
          if (q < dk) {
            const float kq = dm * sK[m * dkp + q];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) acc[ii][jj] += kq * b[jj];
          }
        }
      }
#pragma unroll
      for (int ii = 0; ii < kStateRows; ++ii) {
        const int q = q0 + rg + ii * row_groups;
        if (q < dk) {
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) sS[q * cols + cg + jj * col_groups] = acc[ii][jj];
        }
      }
    }
    for (int e = tid; e < L * cols; e += kThreads) {  // normed and gated by gated_norm_kernel
      out[(c0 + e / cols) * vd + h * dv + c_base + e % cols] = sW[e];
    }
  }
  __syncthreads();
  for (int e = tid; e < dk * cols; e += kThreads) S[(e / cols) * dv + c_base + e % cols] = sS[e];
}

// The gated RMSNorm of the chunked path's outputs, one block per (token, value head): o is normed
// over the head, weighted, then multiplied by silu(z).
__global__ void gated_norm_kernel(DeltaNetShape s, Inputs in, DeltaNetWeightsDev w, float* out) {
  pdl_begin();
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, j = threadIdx.x, dv = s.head_v_dim, dk = s.head_k_dim;
  const int kd = s.key_dim(), vd = s.value_dim(), r = s.num_v_heads / s.num_k_heads;
  const int kh = h / r, hj = h % r;
  const float o = j < dv ? out[t * vd + h * dv + j] : 0.0f;
  const float ms = detail::block_sum(o * o, scratch) / static_cast<float>(dv);
  if (j >= dv) return;
  const int64_t qkvz_w = 2 * static_cast<int64_t>(kd) + 2 * vd, group = 2 * dk + 2 * r * dv;
  const float z = s.split_inputs ? in.p[1][t * vd + h * dv + j]
                                 : in.p[0][t * qkvz_w + kh * group + 2 * dk + r * dv + hj * dv + j];
  out[t * vd + h * dv + j] = o * rsqrtf(ms + s.norm_eps) * w.norm[j] * cpu::silu(z);
}

// Value channels per block of the chunked path: 32 where a head has at least 64 (more blocks per
// head, smaller shared arrays), else the whole head.
int chunk_cols(const DeltaNetShape& s) {
  return s.head_v_dim >= 64 && s.head_v_dim % 32 == 0 ? 32 : s.head_v_dim;
}

size_t chunk_smem_bytes(const DeltaNetShape& s) {
  const size_t dk = static_cast<size_t>(s.head_k_dim), cols = static_cast<size_t>(chunk_cols(s));
  return (dk * cols + kChunk * (2 * (dk + 1) + 2 * cols) + 2 * kChunk * kChunk + 4 * kChunk) * 4;
}

__global__ void split_query_gate_kernel(const float* qg, int64_t rows, int64_t heads,
                                        int64_t head_dim, float* q, float* gate) {
  pdl_begin();
  const int64_t width = heads * head_dim;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t row = i / width, h = (i % width) / head_dim, d = i % head_dim;
  const float* src = qg + row * 2 * width + h * 2 * head_dim;
  q[i] = src[d];
  gate[i] = src[head_dim + d];
}

__global__ void sigmoid_gate_kernel(float* y, const float* gate, int64_t rows, int64_t width,
                                    int64_t gate_width) {
  pdl_begin();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t row = i / width;
  y[i] *= cpu::sigmoid(gate[row * gate_width + (gate_width == 1 ? 0 : i % width)]);
}

}  // namespace

bool delta_net_supports(const DeltaNetShape& s) {
  if (s.num_k_heads <= 0 || s.num_v_heads <= 0 || s.num_v_heads % s.num_k_heads != 0) return false;
  if (s.head_v_dim <= 0 || s.head_v_dim > kThreads || kThreads % s.head_v_dim != 0) return false;
  if (s.head_k_dim <= 0 || s.head_k_dim > kThreads) return false;
  if (s.head_k_dim > kMaxRows * (kThreads / s.head_v_dim)) return false;
  return s.conv_kernel >= 1 && s.conv_kernel <= kMaxTaps;
}

cudaError_t delta_net_forward(const DeltaNetShape& s, const DeltaNetWeightsDev& w,
                              const float* const in[4], int64_t tokens, const DeltaNetRuns& runs,
                              const DeltaNetStatePool& pool, float* conv_ws, float* out,
                              cudaStream_t stream) {
  if (!delta_net_supports(s)) return cudaErrorInvalidValue;
  if (tokens <= 0 || runs.runs <= 0) return cudaSuccess;
  const Inputs x{{in[0], in[1], in[2], in[3]}};
  const unsigned chunks = static_cast<unsigned>((s.conv_dim() + kThreads - 1) / kThreads);
  launch_pdl(conv_kernel, dim3(static_cast<unsigned>(tokens), chunks), kThreads, 0, stream, s, x, w,
             runs, pool, conv_ws);
  if (s.conv_kernel > 1) {
    launch_pdl(conv_window_kernel, dim3(static_cast<unsigned>(runs.runs), chunks), kThreads, 0,
               stream, s, x, runs, pool);
  }
  const dim3 grid(static_cast<unsigned>(runs.runs), static_cast<unsigned>(s.num_v_heads));
  const size_t smem = chunk_smem_bytes(s);
  // Decode steps (one token per run) walk S in registers; a step with a longer run goes by
  // chunks where the chunk's arrays fit in shared memory. The choice depends on the counts only,
  // so a graph captured for a step shape replays the same kernel.
  if (tokens == runs.runs || smem > kChunkSmemLimit || s.head_v_dim < 4) {
    launch_pdl(scan_kernel, grid, kThreads, 0, stream, s, x, static_cast<const float*>(conv_ws), w,
               runs, pool, out);
    return cudaGetLastError();
  }
  const int cols = chunk_cols(s);
  const int row_groups = kThreads / (cols / 4);
  auto* kernel = s.head_k_dim <= 4 * row_groups ? chunk_scan_kernel<kChunk, 4>
                                                : chunk_scan_kernel<kChunk, kMaxStateRows>;
  // Per launch, as the attention kernels do: the attribute belongs to the current device.
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  launch_pdl(kernel, dim3(grid.x, grid.y, static_cast<unsigned>(s.head_v_dim / cols)), kThreads,
             smem, stream, s, x, static_cast<const float*>(conv_ws), w, runs, pool, cols, out);
  launch_pdl(gated_norm_kernel, dim3(static_cast<unsigned>(tokens), grid.y),
             static_cast<unsigned>((s.head_v_dim + 31) / 32 * 32), 0, stream, s, x, w, out);
  return cudaGetLastError();
}

cudaError_t split_query_gate(const float* qg, int64_t rows, int64_t heads, int64_t head_dim,
                             float* q, float* gate, cudaStream_t stream) {
  const int64_t n = rows * heads * head_dim;
  if (n <= 0) return cudaSuccess;
  launch_pdl(split_query_gate_kernel, detail::blocks_for(n, 256), 256, 0, stream, qg, rows, heads,
             head_dim, q, gate);
  return cudaGetLastError();
}

cudaError_t sigmoid_gate(float* y, const float* gate, int64_t rows, int64_t width,
                         int64_t gate_width, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n <= 0) return cudaSuccess;
  launch_pdl(sigmoid_gate_kernel, detail::blocks_for(n, 256), 256, 0, stream, y, gate, rows, width,
             gate_width);
  return cudaGetLastError();
}

}  // namespace exl3::cuda
