// Original-basis weight for the large-m path: W = diag(suh) . B . W_hat . B . diag(svh) (B the
// block-diagonal H128 / sqrt(128)), decoded, rotated on both sides and scaled in one pass and
// written once as fp16 or bf16, so cuBLAS multiplies the raw activations and writes the output
// itself (no input rotation, no fp32 partials, no output rotation over m rows).
//
// One block per 128x128 region (one Hadamard block on each side): 8 warps decode its 64 tiles
// into shared memory as fp32 (register decode, trellis_decode.cuh), transform the columns, then
// the rows, each lane holding elements lane, lane+32, lane+64, lane+96 of a 128-vector (5
// shuffle stages + 2 in-register stages), and store rows with the scales applied.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/had128.cuh"
#include "cuda/kernels.hpp"
#include "cuda/trellis_decode.cuh"
#include "exl3/trellis/dispatch.hpp"
#include "exl3/trellis/hadamard.hpp"

namespace exl3::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kPitch = 129;  // floats per shared row: odd, so column walks spread over banks
constexpr size_t kSmemBytes = 128 * kPitch * sizeof(float);

// Hadamard-128 of v[i] = element 32 i + lane: the 5 lane bits by xor-shuffles, the 2 register
// bits in registers. Sylvester H128 is the tensor product of H2 over the index bits, so the
// stages may run in any order. Strided ownership keeps both shared-memory walks (down a column
// and along a row) free of bank conflicts with an odd pitch.
__device__ __forceinline__ void had128_strided(float (&v)[4], int lane) {
  had_lane_stages(v, lane);
  had_register_stages(v);
}

template <typename T>
__device__ __forceinline__ T to_out(float v);
template <>
__device__ __forceinline__ __half to_out<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 to_out<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <int K, tr::Codebook CB, typename OutT>
__global__ void __launch_bounds__(32 * kWarps)
    reconstruct_folded_kernel(const uint32_t* __restrict__ trellis, int k, int n,
                              const __half* __restrict__ suh, const __half* __restrict__ svh,
                              OutT* __restrict__ out) {
  extern __shared__ float s[];  // [128][kPitch]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int k0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
  const int tiles_n = n >> 4;
  constexpr int kWords = 8 * K;
  const LaneSpan<K> span(lane);

  // Decode: warp w takes tile row w of the region (8 tiles across).
  for (int tj = 0; tj < 8; ++tj) {
    const int64_t tile = static_cast<int64_t>(k0 / 16 + warp) * tiles_n + n0 / 16 + tj;
    const uint32_t* t = trellis + tile * kWords;
    uint32_t b[4];
    decode_lane<K, CB>(__ldg(t + span.w0), __ldg(t + span.w1), __ldg(t + span.w2), span.off, b);
    // b[q] holds positions 2q, 2q+1: rows 2c + (j & 1) + 8 ((j >> 1) & 1), columns g + 8 (j >> 2).
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const __half2 h = *reinterpret_cast<const __half2*>(&b[q]);
      const int j = 2 * q;
      const int row = 16 * warp + 2 * c + 8 * ((j >> 1) & 1);
      const int col = 16 * tj + g + 8 * (j >> 2);
      s[row * kPitch + col] = __low2float(h);
      s[(row + 1) * kPitch + col] = __high2float(h);
    }
  }
  __syncthreads();

  // Columns (the input-side rotation): warp w transforms columns 16w .. 16w+15.
  for (int col = 16 * warp; col < 16 * warp + 16; ++col) {
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = s[(32 * i + lane) * kPitch + col];
    had128_strided(v, lane);
#pragma unroll
    for (int i = 0; i < 4; ++i) s[(32 * i + lane) * kPitch + col] = v[i];
  }
  __syncthreads();

  // Rows (the output-side rotation), then scales: both Hadamards' 1/sqrt(128) make 1/128.
  float sv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) sv[i] = __half2float(svh[n0 + 32 * i + lane]) * (1.0f / 128.0f);
  for (int row = 16 * warp; row < 16 * warp + 16; ++row) {
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = s[row * kPitch + 32 * i + lane];
    had128_strided(v, lane);
    const float su = __half2float(suh[k0 + row]);
    OutT* o = out + static_cast<int64_t>(k0 + row) * n + n0 + lane;
#pragma unroll
    for (int i = 0; i < 4; ++i) o[32 * i] = to_out<OutT>(v[i] * su * sv[i]);
  }
}

template <int K, typename OutT>
cudaError_t launch_folded(bool prepare, const uint16_t* trellis, tr::Codebook cb, int64_t k,
                          int64_t n, const uint16_t* suh, const uint16_t* svh, OutT* out,
                          cudaStream_t stream) {
  const auto* t32 = reinterpret_cast<const uint32_t*>(trellis);
  const auto* su = reinterpret_cast<const __half*>(suh);
  const auto* sv = reinterpret_cast<const __half*>(svh);
  const dim3 grid(static_cast<unsigned>(n / 128), static_cast<unsigned>(k / 128)),
      block(32 * kWarps);
  auto go = [&](auto kernel) {
    if (prepare)
      return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    kernel<<<grid, block, kSmemBytes, stream>>>(t32, static_cast<int>(k), static_cast<int>(n), su,
                                                sv, out);
    return cudaGetLastError();
  };
  return tr::with_codebook(
      cb, [&](auto c) { return go(reconstruct_folded_kernel<K, decltype(c)::value, OutT>); });
}

template <typename OutT>
cudaError_t dispatch_folded(bool prepare, const uint16_t* trellis, int K, tr::Codebook cb,
                            int64_t k, int64_t n, const uint16_t* suh, const uint16_t* svh,
                            OutT* out, cudaStream_t stream) {
  return tr::with_bits(K, cudaErrorInvalidValue, [&](auto bits) {
    return launch_folded<decltype(bits)::value>(prepare, trellis, cb, k, n, suh, svh, out, stream);
  });
}

}  // namespace

cudaError_t reconstruct_folded_prepare(int K, trellis::Codebook cb) {
  const cudaError_t e =
      dispatch_folded<__half>(true, nullptr, K, cb, 0, 0, nullptr, nullptr, nullptr, nullptr);
  return e != cudaSuccess ? e
                          : dispatch_folded<__nv_bfloat16>(true, nullptr, K, cb, 0, 0, nullptr,
                                                           nullptr, nullptr, nullptr);
}

cudaError_t reconstruct_folded(const uint16_t* trellis, int K, trellis::Codebook cb, int64_t k,
                               int64_t n, const uint16_t* suh, const uint16_t* svh, bool bf16,
                               void* out, cudaStream_t stream) {
  if (k <= 0 || n <= 0 || k % 128 != 0 || n % 128 != 0 || k / 128 > 65535)
    return cudaErrorInvalidValue;
  return bf16 ? dispatch_folded(false, trellis, K, cb, k, n, suh, svh,
                                static_cast<__nv_bfloat16*>(out), stream)
              : dispatch_folded(false, trellis, K, cb, k, n, suh, svh, static_cast<__half*>(out),
                                stream);
}

}  // namespace exl3::cuda::detail
