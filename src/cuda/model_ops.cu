// Device kernels of the CUDA model runtime (see include/exl3/cuda/model_ops.hpp). Written for
// clarity first: the model's time goes to the EXL3 linears and the MoE layer; these kernels are
// elementwise, per-row or attention, each with its shape assumptions stated above it.
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/paged_kv.cuh"
#include "cuda/pdl.cuh"
#include "exl3/cpu/activation.hpp"
#include "exl3/cuda/model_ops.hpp"

namespace exl3::cuda {
namespace {

using namespace detail;  // kNegBig, kv_slot, warp/block sums, blocks_for (cuda/paged_kv.cuh)

__device__ __forceinline__ float load_as_f32(const void* p, DType t, int64_t i) {
  if (t == DType::kF32) return static_cast<const float*>(p)[i];
  if (t == DType::kF16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// ---- embeddings, norms, elementwise ---------------------------------------------------------

__global__ void embed_rows_kernel(const void* table, DType t, int64_t hidden, const int32_t* ids,
                                  float* out, float scale) {
  pdl_begin();
  const int64_t row = blockIdx.x;
  const int64_t src = static_cast<int64_t>(ids[row]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = load_as_f32(table, t, src + i);
    out[row * hidden + i] = scale == 1.0f ? v : v * scale;
  }
}

// One block per output row; the mean of squares in fp32 (the CPU reference sums in fp64; the
// difference is far below the tests' tolerances).
__global__ void add_rms_norm_kernel(float* x, const float* add, const float* w,
                                    const int32_t* row_index, int64_t n, float eps, float* y) {
  pdl_begin();
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t src = row_index ? row_index[r] : r;
  float* xr = x + src * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = xr[i];
    if (add) {
      v += add[src * n + i];
      xr[i] = v;
    }
    ss += v * v;
  }
  const float total = block_sum(ss, scratch);
  const float inv = rsqrtf(total / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[r * n + i] = xr[i] * inv * w[i];
}

// The same with the row held in registers: V float4 per thread (n / 4 <= V * blockDim.x), all
// loads of a row issued before the first reduction, the row read from memory once.
template <int V>
__global__ void __launch_bounds__(256)
    add_rms_norm_vec_kernel(float* __restrict__ x, const float* __restrict__ add,
                            const float* __restrict__ w, const int32_t* __restrict__ row_index,
                            int64_t n, float eps, float* __restrict__ y) {
  pdl_begin();
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t src = row_index ? row_index[r] : r;
  const int64_t n4 = n / 4;
  auto* xr = reinterpret_cast<float4*>(x + src * n);
  const auto* ar = add != nullptr ? reinterpret_cast<const float4*>(add + src * n) : nullptr;
  float4 v[V];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t idx = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (idx < n4) {
      v[i] = xr[idx];
      if (ar != nullptr) {
        const float4 a = ar[idx];
        v[i].x += a.x, v[i].y += a.y, v[i].z += a.z, v[i].w += a.w;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t idx = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (ar != nullptr && idx < n4) xr[idx] = v[i];
    ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(n) + eps);
  const auto* w4 = reinterpret_cast<const float4*>(w);
  auto* yr = reinterpret_cast<float4*>(y + r * n);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t idx = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (idx < n4) {
      const float4 g = w4[idx];
      yr[idx] = make_float4(v[i].x * inv * g.x, v[i].y * inv * g.y, v[i].z * inv * g.z,
                            v[i].w * inv * g.w);
    }
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
  pdl_begin();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  g[i] = exl3::cpu::silu(g[i]) * u[i];
}

__global__ void gelu_tanh_mul_kernel(float* g, const float* u, int64_t n) {
  pdl_begin();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) g[i] = exl3::cpu::gelu_tanh(g[i]) * u[i];
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  pdl_begin();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = exl3::cpu::softcap(x[i], cap);
}

__global__ void add_inplace_kernel(float* y, const float* x, int64_t n) {
  pdl_begin();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t m, int64_t n) {
  pdl_begin();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < m * n) y[i] += bias[i % n];
}

__global__ void convert_rows_kernel(const float* src, int64_t ld_src, void* dst, DType t,
                                    int64_t ld_dst, int64_t n) {
  pdl_begin();
  const int64_t r = blockIdx.y;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = src[r * ld_src + i];
    if (t == DType::kF32) {
      static_cast<float*>(dst)[r * ld_dst + i] = v;
    } else if (t == DType::kF16) {
      static_cast<__half*>(dst)[r * ld_dst + i] = __float2half_rn(v);
    } else {
      static_cast<__nv_bfloat16*>(dst)[r * ld_dst + i] = __float2bfloat16_rn(v);
    }
  }
}

// ---- q/k norm, RoPE, KV store ----------------------------------------------------------------

// The normalised Hadamard transform of one head held by a warp (lane owns channels lane + 32 j in
// x[j]), through the warp's stage buffer: the butterflies of trellis::fwht_inplace stage by stage,
// then the scale, so each value gets the host transform's operations in the same order (the same
// bits as cpu_ops::rotate_heads).
template <int HD>
__device__ __forceinline__ void rotate_head(float (&x)[HD / 32], float* sh, int lane) {
#pragma unroll
  for (int j = 0; j < HD / 32; ++j) sh[lane + 32 * j] = x[j];
  __syncwarp();
#pragma unroll
  for (int h = 1; h < HD; h <<= 1) {
#pragma unroll
    for (int p = lane; p < HD / 2; p += 32) {
      const int i = (p / h) * 2 * h + p % h;
      const float a = sh[i], b = sh[i + h];
      sh[i] = a + b;
      sh[i + h] = a - b;
    }
    __syncwarp();
  }
  const float rs = cpu::kv_rotation_scale(HD);
#pragma unroll
  for (int j = 0; j < HD / 32; ++j) x[j] = sh[lane + 32 * j] * rs;
  __syncwarp();  // the stage buffer is reused by the warp's next head
}

// One head in a quantized format: channel group j (channels 32 j .. 32 j + 31) is x[j] across the
// lanes; its scale and codes by the shared codec (exl3/cpu/kv_codec.hpp).
template <int HD>
__device__ __forceinline__ void store_quantized_head(cpu::KvFormat f, const float (&x)[HD / 32],
                                                     uint8_t* codes, uint16_t* scales, int lane) {
#pragma unroll
  for (int j = 0; j < HD / 32; ++j) {
    const uint16_t sb = cpu::kv_scale_bits(f, warp_max(fabsf(x[j])));
    const uint8_t c = cpu::kv_encode(f, x[j], cpu::kv_inverse_scale(sb));
    if (lane == 0) scales[j] = sb;
    if (f == cpu::KvFormat::kQ4) {
      const auto hi = static_cast<uint8_t>(__shfl_down_sync(0xffffffffu, c, 1));
      if ((lane & 1) == 0) codes[16 * j + lane / 2] = static_cast<uint8_t>(c | (hi << 4));
    } else {
      codes[32 * j + lane] = c;
    }
  }
}

// Grid (token, head quads): one warp per q, k or v head, so a decode step's few tokens still
// spread over many blocks. Each warp stages its head in shared memory (RoPE pairs channel i with
// i + half, which other lanes hold).
template <int HD>
__global__ void qk_norm_rope_store_kernel(float* q, const float* k, const float* v,
                                          const float* q_norm, const float* k_norm, float eps,
                                          const float* rope_cs, TokenMeta meta, AttnShape s,
                                          PagedKv kv) {
  pdl_begin();
  constexpr int kWarps = 4;
  __shared__ float stage[kWarps][HD];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t pos = meta.pos[t];
  const int64_t slot = kv_slot(kv, meta.seq_row[t], pos);
  const float* cs = rope_cs + static_cast<int64_t>(pos) * 2 * s.rotary_half;
  const int total = s.num_heads + 2 * s.num_kv_heads;
  for (int h = blockIdx.y * kWarps + warp; h < total; h += kWarps * gridDim.y) {
    const bool is_q = h < s.num_heads, is_k = !is_q && h < s.num_heads + s.num_kv_heads;
    const int kvh = is_q ? 0 : (is_k ? h - s.num_heads : h - s.num_heads - s.num_kv_heads);
    const float* src =
        is_q ? q + (t * s.num_heads + h) * HD : (is_k ? k : v) + (t * s.num_kv_heads + kvh) * HD;
    float* sh = stage[warp];
    float ss = 0.0f;
    for (int i = lane; i < HD; i += 32) {
      sh[i] = src[i];
      ss += sh[i] * sh[i];
    }
    const float* nw = is_q ? q_norm : (is_k ? k_norm : nullptr);
    if (nw != nullptr) {
      const float inv = rsqrtf(warp_sum(ss) / HD + eps);
      for (int i = lane; i < HD; i += 32) sh[i] = sh[i] * inv * nw[i];
    }
    __syncwarp();
    float out[HD / 32];
#pragma unroll
    for (int j = 0; j < HD / 32; ++j) {
      const int i = lane + 32 * j;
      float val = sh[i];
      if (!is_q && !is_k) {
        // v: stored as is
      } else if (i < s.rotary_half) {
        val = sh[i] * cs[i] - sh[i + s.rotary_half] * cs[s.rotary_half + i];
      } else if (i < 2 * s.rotary_half) {
        const int p = i - s.rotary_half;
        val = sh[i] * cs[p] + sh[p] * cs[s.rotary_half + p];
      }
      out[j] = val;
    }
    __syncwarp();
    const cpu::KvFormat f = kv.format;
    if (cpu::kv_rotates_keys(f) && (is_q || is_k)) rotate_head<HD>(out, sh, lane);
    if (is_q) {
      float* dst = q + (t * s.num_heads + h) * HD;
#pragma unroll
      for (int j = 0; j < HD / 32; ++j) dst[lane + 32 * j] = out[j];
    } else if (!cpu::kv_quantized(f)) {
      uint16_t* dst = (is_k ? kv.k : kv.v) + (slot * s.num_kv_heads + kvh) * HD;
#pragma unroll
      for (int j = 0; j < HD / 32; ++j)
        dst[lane + 32 * j] = __half_as_ushort(__float2half_rn(out[j]));
    } else {
      const int64_t head = slot * s.num_kv_heads + kvh;
      store_quantized_head<HD>(f, out, (is_k ? kv.kq : kv.vq) + head * cpu::kv_code_bytes(f, HD),
                               (is_k ? kv.ks : kv.vs) + head * (HD / cpu::kKvGroup), lane);
    }
  }
}

}  // namespace

cudaError_t embed_rows(const void* table, DType table_type, int64_t hidden, const int32_t* ids,
                       int64_t n, float* out, cudaStream_t stream, float scale) {
  if (n <= 0) return cudaSuccess;
  launch_pdl(embed_rows_kernel, static_cast<unsigned>(n), 256, 0, stream, table, table_type, hidden,
             ids, out, scale);
  return cudaGetLastError();
}

cudaError_t add_rms_norm(float* x, const float* add, const float* w, const int32_t* row_index,
                         int64_t rows, int64_t n, float eps, float* y, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const auto grid = static_cast<unsigned>(rows);
  const int64_t per = (n / 4 + 255) / 256;  // float4 per thread
  if (n % 4 == 0 && per <= 8 && aligned16(x) && aligned16(add) && aligned16(w) && aligned16(y)) {
    if (per <= 1) {
      launch_pdl(add_rms_norm_vec_kernel<1>, grid, 256, 0, stream, x, add, w, row_index, n, eps, y);
    } else if (per <= 2) {
      launch_pdl(add_rms_norm_vec_kernel<2>, grid, 256, 0, stream, x, add, w, row_index, n, eps, y);
    } else if (per <= 4) {
      launch_pdl(add_rms_norm_vec_kernel<4>, grid, 256, 0, stream, x, add, w, row_index, n, eps, y);
    } else {
      launch_pdl(add_rms_norm_vec_kernel<8>, grid, 256, 0, stream, x, add, w, row_index, n, eps, y);
    }
    return cudaGetLastError();
  }
  launch_pdl(add_rms_norm_kernel, grid, 256, 0, stream, x, add, w, row_index, n, eps, y);
  return cudaGetLastError();
}

cudaError_t qk_norm_rope_store(float* q, const float* k, const float* v, const float* q_norm,
                               const float* k_norm, float eps, const float* rope_cs, TokenMeta meta,
                               int64_t n, const AttnShape& shape, const PagedKv& kv,
                               cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(n),
                  blocks_for(shape.num_heads + 2 * shape.num_kv_heads, 4));
  return detail::with_head_dim(shape.head_dim, [&](auto hd) {
    launch_pdl(qk_norm_rope_store_kernel<decltype(hd)::value>, grid, 128, 0, stream, q, k, v,
               q_norm, k_norm, eps, rope_cs, meta, shape, kv);
    return cudaGetLastError();
  });
}

bool attention_supports_head_dim(int head_dim) {
  return detail::with_head_dim(head_dim, [](auto) { return cudaSuccess; }) == cudaSuccess;
}

cudaError_t silu_mul(float* g, const float* u, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  launch_pdl(silu_mul_kernel, blocks_for(n, 256), 256, 0, stream, g, u, n);
  return cudaGetLastError();
}

cudaError_t gelu_tanh_mul(float* g, const float* u, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  launch_pdl(gelu_tanh_mul_kernel, blocks_for(n, 256), 256, 0, stream, g, u, n);
  return cudaGetLastError();
}

cudaError_t softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!(cap > 0.0f)) return cudaErrorInvalidValue;
  launch_pdl(softcap_kernel, blocks_for(n, 256), 256, 0, stream, x, n, cap);
  return cudaGetLastError();
}

cudaError_t add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  launch_pdl(add_inplace_kernel, blocks_for(n, 256), 256, 0, stream, y, x, n);
  return cudaGetLastError();
}

cudaError_t add_bias(float* y, const float* bias, int64_t m, int64_t n, cudaStream_t stream) {
  if (m * n <= 0) return cudaSuccess;
  launch_pdl(add_bias_kernel, blocks_for(m * n, 256), 256, 0, stream, y, bias, m, n);
  return cudaGetLastError();
}

cudaError_t convert_rows(const float* src, int64_t ld_src, void* dst, DType dst_type,
                         int64_t ld_dst, int64_t m, int64_t n, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 64)),
                  static_cast<unsigned>(m));
  launch_pdl(convert_rows_kernel, grid, 256, 0, stream, src, ld_src, dst, dst_type, ld_dst, n);
  return cudaGetLastError();
}

}  // namespace exl3::cuda
