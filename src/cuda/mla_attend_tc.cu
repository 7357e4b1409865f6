// MLA attention over the latent cache on tensor cores (see mla_attend_tc.cuh): per block 16 heads
// of one token and one split of its positions. The positions go in passes of up to kSuper: the
// scores S = Q . latent^T of the pass (fp16 16x16x16 MMA, fp32 accumulation) land in shared
// memory, each head's row gets its running max and sum updated and its weights P written as fp16,
// the output tiles (kept in MMA accumulators across the whole range) are rescaled once per pass,
// and O += P . latent. The latents are read from the cache twice per pass (L2-resident), in
// chunks of kSub rows.
#include <mma.h>

#include <algorithm>

#include <cuda_fp16.h>

#include "cuda/mla_attend_tc.cuh"
#include "cuda/paged_kv.cuh"

namespace exl3::cuda::detail {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kThreads = 128;          // four warps
constexpr int kSub = 64;               // latent rows per shared-memory load
constexpr int kSuper = 512;            // positions per softmax pass
constexpr int kMaxTiles = 8;           // 16-channel output tiles per warp (kv_lora_rank <= 512)
constexpr int kScoreLd = kSuper + 4;   // floats; also the output staging's row stride
constexpr int kWeightLd = kSuper + 8;  // halves

// Shared memory carve (bytes), every piece 32-byte aligned as the MMA loads and stores need.
struct Carve {
  int kp = 0;   // latent width rounded up to 16 (zero padded)
  int ldk = 0;  // row stride of the query and latent tiles, halves
  size_t q = 0, lat = 0, scores = 0, weights = 0, rows = 0, total = 0;
};

__host__ __device__ inline Carve carve(const MlaShape& s) {
  Carve c;
  c.kp = (s.latent_width() + 15) / 16 * 16;
  c.ldk = c.kp + 8;
  c.q = 0;
  c.lat = c.q + static_cast<size_t>(kMlaTcHeads) * c.ldk * 2;
  c.scores = c.lat + static_cast<size_t>(kSub) * c.ldk * 2;
  c.weights = c.scores + static_cast<size_t>(kMlaTcHeads) * kScoreLd * 4;
  c.rows = c.weights + static_cast<size_t>(kMlaTcHeads) * kWeightLd * 2;
  c.total = c.rows + 3 * kMlaTcHeads * 4;
  return c;
}

using AccTile = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__global__ void __launch_bounds__(kThreads)
    mla_attend_tc_kernel(const float* q_lat, const float* q, const int32_t* selection,
                         int64_t sel_stride, const int32_t* count, TokenMeta meta, MlaShape s,
                         float scale, PagedKv kv, float* o_lat, float* part, float2* ml) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Carve c = carve(s);
  auto* qs = reinterpret_cast<__half*>(smem + c.q);
  auto* lat = reinterpret_cast<__half*>(smem + c.lat);
  auto* sc = reinterpret_cast<float*>(smem + c.scores);
  auto* ps = reinterpret_cast<__half*>(smem + c.weights);
  auto* row_max = reinterpret_cast<float*>(smem + c.rows);
  float* row_sum = row_max + kMlaTcHeads;
  float* row_corr = row_sum + kMlaTcHeads;
  const int64_t t = blockIdx.y;
  const int h0 = blockIdx.x * kMlaTcHeads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int width = s.latent_width(), qk = s.qk();

  for (int i = threadIdx.x; i < kMlaTcHeads * c.kp; i += kThreads) {
    const int r = i / c.kp, col = i % c.kp, h = h0 + r;
    float v = 0.0f;
    if (h < s.heads && col < width) {
      v = col < s.lora ? q_lat[(t * s.heads + h) * s.lora + col]
                       : q[(t * s.heads + h) * qk + s.nope + (col - s.lora)];
    }
    qs[r * c.ldk + col] = __float2half_rn(v);
  }
  if (threadIdx.x < kMlaTcHeads) {
    row_max[threadIdx.x] = kNegBig;
    row_sum[threadIdx.x] = 0.0f;
  }
  const int32_t seq = meta.seq_row[t];
  const int32_t total = selection != nullptr ? count[t] : meta.pos[t] + 1;
  const int splits = static_cast<int>(gridDim.z), split = static_cast<int>(blockIdx.z);
  const int32_t per = (total + splits - 1) / splits;
  const int32_t first = min(total, split * per), last = min(total, first + per);
  const int32_t* sel = selection != nullptr ? selection + t * sel_stride : nullptr;

  // Rows j < rows of the latent tile from position index `from` (zero past them and past the
  // latent width).
  const int pairs = c.kp / 2;
  const auto load_latents = [&](int32_t from, int rows) {
    for (int i = threadIdx.x; i < kSub * pairs; i += kThreads) {
      const int jj = i / pairs, w = i % pairs;
      __half2 v = __float2half2_rn(0.0f);
      if (jj < rows && 2 * w < width) {
        const int32_t p = sel != nullptr ? sel[from + jj] : from + jj;
        v = reinterpret_cast<const __half2*>(reinterpret_cast<const __half*>(kv.k) +
                                             kv_slot(kv, seq, p) * width)[w];
      }
      reinterpret_cast<__half2*>(lat + jj * c.ldk)[w] = v;
    }
  };

  const int tiles = s.lora / 64;  // output tiles of this warp: columns [warp * tiles * 16, ...)
  AccTile o[kMaxTiles];
#pragma unroll
  for (int f = 0; f < kMaxTiles; ++f) wmma::fill_fragment(o[f], 0.0f);

  for (int32_t base = first; base < last; base += kSuper) {
    const int cnt = min(kSuper, last - base), cnt16 = (cnt + 15) & ~15;
    for (int sub = 0; sub < cnt; sub += kSub) {
      __syncthreads();  // the latent tile is free
      load_latents(base + sub, min(kSub, cnt - sub));
      __syncthreads();
      if (sub + warp * 16 < cnt) {
        AccTile acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int k = 0; k < c.kp; k += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
          wmma::load_matrix_sync(a, qs + k, c.ldk);
          wmma::load_matrix_sync(b, lat + warp * 16 * c.ldk + k, c.ldk);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(sc + sub + warp * 16, acc, kScoreLd, wmma::mem_row_major);
      }
    }
    __syncthreads();
    {  // eight threads per head row: running max and sum, the pass's weights as fp16
      const int r = threadIdx.x >> 3, part8 = threadIdx.x & 7;
      const float* row = sc + r * kScoreLd;
      float mx = kNegBig;
      for (int j = part8; j < cnt; j += 8) mx = fmaxf(mx, row[j] * scale);
      for (int o8 = 4; o8 > 0; o8 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o8));
      const float m_old = row_max[r], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int j = part8; j < cnt16; j += 8) {
        const float p = j < cnt ? __expf(row[j] * scale - m_new) : 0.0f;
        ps[r * kWeightLd + j] = __float2half_rn(p);
        sum += p;
      }
      for (int o8 = 4; o8 > 0; o8 >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o8);
      __syncwarp();
      if (part8 == 0) {
        const float corr = __expf(m_old - m_new);
        row_corr[r] = corr;
        row_sum[r] = row_sum[r] * corr + sum;
        row_max[r] = m_new;
      }
    }
    __syncthreads();
    if (base != first) {  // rescale this warp's output columns to the new maxima
#pragma unroll
      for (int f = 0; f < kMaxTiles; ++f) {
        if (f < tiles)
          wmma::store_matrix_sync(sc + (warp * tiles + f) * 16, o[f], kScoreLd,
                                  wmma::mem_row_major);
      }
      __syncwarp();
      for (int i = lane; i < kMlaTcHeads * tiles * 16; i += 32) {
        const int r = i / (tiles * 16), col = warp * tiles * 16 + i % (tiles * 16);
        sc[r * kScoreLd + col] *= row_corr[r];
      }
      __syncwarp();
#pragma unroll
      for (int f = 0; f < kMaxTiles; ++f) {
        if (f < tiles)
          wmma::load_matrix_sync(o[f], sc + (warp * tiles + f) * 16, kScoreLd, wmma::mem_row_major);
      }
    }
    for (int sub = 0; sub < cnt; sub += kSub) {
      __syncthreads();
      load_latents(base + sub, min(kSub, cnt - sub));
      __syncthreads();
      const int kmax = min(kSub, cnt16 - sub);
      for (int kk = 0; kk < kmax; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::load_matrix_sync(a, ps + sub + kk, kWeightLd);
#pragma unroll
        for (int f = 0; f < kMaxTiles; ++f) {
          if (f < tiles) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
            wmma::load_matrix_sync(b, lat + kk * c.ldk + (warp * tiles + f) * 16, c.ldk);
            wmma::mma_sync(o[f], a, b, o[f]);
          }
        }
      }
    }
  }
  __syncthreads();  // the scores are consumed: stage the output there
#pragma unroll
  for (int f = 0; f < kMaxTiles; ++f) {
    if (f < tiles)
      wmma::store_matrix_sync(sc + (warp * tiles + f) * 16, o[f], kScoreLd, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kMlaTcHeads * s.lora; i += kThreads) {
    const int r = i / s.lora, col = i % s.lora, h = h0 + r;
    if (h >= s.heads) continue;
    const float v = sc[r * kScoreLd + col];
    if (splits == 1) {
      o_lat[(t * s.heads + h) * s.lora + col] = v / row_sum[r];
    } else {
      part[((t * splits + split) * s.heads + h) * s.lora + col] = v;
    }
  }
  if (splits > 1 && threadIdx.x < kMlaTcHeads && h0 + static_cast<int>(threadIdx.x) < s.heads) {
    ml[(t * splits + split) * s.heads + h0 + threadIdx.x] =
        make_float2(row_max[threadIdx.x], row_sum[threadIdx.x]);
  }
}

}  // namespace

bool mla_tc_supports(const MlaShape& s) {
  return s.lora % 64 == 0 && s.lora <= kMaxTiles * 64 && s.lora <= kSuper &&
         carve(s).total <= 200 * 1024;
}

size_t mla_tc_smem_bytes(const MlaShape& s) {
  return carve(s).total;
}

cudaError_t mla_tc_prepare(const MlaShape& s) {
  if (!mla_tc_supports(s)) return cudaSuccess;
  return cudaFuncSetAttribute(mla_attend_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(200 * 1024));
}

cudaError_t launch_mla_attend_tc(dim3 grid, const float* q_lat, const float* q,
                                 const int32_t* selection, int64_t sel_stride, const int32_t* count,
                                 TokenMeta meta, const MlaShape& s, float scale, const PagedKv& kv,
                                 float* o_lat, float* part, float2* ml, cudaStream_t stream) {
  mla_attend_tc_kernel<<<grid, kThreads, carve(s).total, stream>>>(
      q_lat, q, selection, sel_stride, count, meta, s, scale, kv, o_lat, part, ml);
  return cudaGetLastError();
}

}  // namespace exl3::cuda::detail
