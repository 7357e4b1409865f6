// CUDA tile encoder: one 1024-thread block per tile in flight, the algorithm of
// src/cuda/viterbi_body.hpp (shared with the CPU emulator in the tests), device executor below.
//
// Per block: the fp16 codebook table (K >= 2, 128 KiB) and the trellis costs live in shared
// memory; back-pointers (one byte per position and out-edge) go to this block's slice of the
// workspace; blocks take tiles blockIdx.x, blockIdx.x + gridDim.x, ... so any n runs in one launch.
#include <cuda_fp16.h>

#include "cuda/viterbi_body.hpp"
#include "exl3/cuda/viterbi.hpp"
#include "exl3/trellis/dispatch.hpp"

namespace exl3::cuda {
namespace {

namespace tr = exl3::trellis;
using vit::Cfg;
using vit::kThreads;

template <int K>
struct DeviceExec {
  float regs[Cfg<K>::kStagedRegs];

  // The thread index is read with a volatile asm so the compiler cannot hoist everything derived
  // from it (codebook values, addresses) out of the 256-step loops: that would need more registers
  // than 1024-thread blocks have (64 per thread) and spill.
  template <class F>
  __device__ __forceinline__ void each(F&& f) {
    unsigned t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    f(static_cast<int>(t));
  }
  __device__ __forceinline__ void sync() { __syncthreads(); }
  template <class F>
  __device__ __forceinline__ void single(F&& f) {
    if (threadIdx.x == 0) f();
  }
  __device__ __forceinline__ float* staged(int) { return regs; }
  __device__ __forceinline__ void fail(unsigned* failures) {
    if (failures != nullptr) atomicAdd(failures, 1u);
  }

  // Block-wide argmin of cost[0..n): the smallest index among equal minima (every comparison is
  // lexicographic on (cost, index), so the reduction order does not matter). All threads return
  // the result.
  __device__ uint32_t argmin(const float* cost, int n, unsigned char* red_c_raw,
                             unsigned char* red_i_raw) {
    auto* red_c = reinterpret_cast<float*>(red_c_raw);
    auto* red_i = reinterpret_cast<uint32_t*>(red_i_raw);
    const int t = static_cast<int>(threadIdx.x);
    float bc = vit::inf_f();
    uint32_t bi = 0xFFFFFFFFu;
    for (int e = t; e < n; e += kThreads) {
      const float c = cost[e];
      if (c < bc || (c == bc && static_cast<uint32_t>(e) < bi)) {
        bc = c;
        bi = static_cast<uint32_t>(e);
      }
    }
    auto merge = [&](float oc, uint32_t oi) {
      if (oc < bc || (oc == bc && oi < bi)) {
        bc = oc;
        bi = oi;
      }
    };
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float oc = __shfl_xor_sync(0xFFFFFFFFu, bc, off);
      const uint32_t oi = __shfl_xor_sync(0xFFFFFFFFu, bi, off);
      merge(oc, oi);
    }
    const int warp = t >> 5, lane = t & 31;
    if (lane == 0) {
      red_c[warp] = bc;
      red_i[warp] = bi;
    }
    __syncthreads();
    bc = red_c[lane];  // kThreads / 32 == 32 warps
    bi = red_i[lane];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float oc = __shfl_xor_sync(0xFFFFFFFFu, bc, off);
      const uint32_t oi = __shfl_xor_sync(0xFFFFFFFFu, bi, off);
      merge(oc, oi);
    }
    __syncthreads();  // red_* may be reused by the next call
    return bi;
  }
};
static_assert(kThreads == 1024, "DeviceExec::argmin assumes 32 warps");

template <int K, tr::Codebook CB>
__global__ void __launch_bounds__(kThreads, 1)
    viterbi_kernel(const float* __restrict__ tiles, int64_t n, uint8_t* __restrict__ bp_ws,
                   unsigned* __restrict__ failures, uint16_t* __restrict__ states_out,
                   float* __restrict__ decoded_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  DeviceExec<K> ex;
  vit::build_lut<K, CB>(ex, smem);
  uint8_t* bp = bp_ws + static_cast<size_t>(blockIdx.x) * Cfg<K>::kBpBytes;
  for (int64_t tile = blockIdx.x; tile < n; tile += gridDim.x) {
    const int64_t off = tile * vit::kPositions;
    vit::encode_tile_body<K, CB>(ex, smem, tiles + off, bp, states_out + off,
                                 decoded_out != nullptr ? decoded_out + off : nullptr, failures);
  }
}

template <int K, tr::Codebook CB>
cudaError_t launch(const float* tiles, int64_t n, int64_t grid, uint8_t* bp, unsigned* failures,
                   uint16_t* states, float* decoded, cudaStream_t stream) {
  constexpr size_t smem = Cfg<K>::kSmemBytes;
  const auto kernel = viterbi_kernel<K, CB>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(tiles, n, bp, failures, states,
                                                                  decoded);
  return cudaGetLastError();
}

template <int K>
cudaError_t launch_cb(tr::Codebook cb, const float* tiles, int64_t n, int64_t grid, uint8_t* bp,
                      unsigned* failures, uint16_t* states, float* decoded, cudaStream_t stream) {
  return tr::with_codebook(cb, [&](auto c) {
    return launch<K, decltype(c)::value>(tiles, n, grid, bp, failures, states, decoded, stream);
  });
}

template <int K>
int blocks_per_sm() {
  int blocks = 0;
  const auto kernel = viterbi_kernel<K, tr::Codebook::kMcg>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Cfg<K>::kSmemBytes)) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads,
                                                    Cfg<K>::kSmemBytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks;
}

}  // namespace

size_t encode_tiles_cuda_workspace(int64_t n_tiles_in_flight, int K) {
  if (!tr::valid_bits(K) || n_tiles_in_flight < 1) return 0;
  return vit::kStatusBytes + static_cast<size_t>(n_tiles_in_flight) * vit::bp_bytes_per_tile(K);
}

int64_t encode_tiles_cuda_resident_tiles(int K) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const int per_sm =
      tr::with_bits(K, 0, [](auto k) { return blocks_per_sm<decltype(k)::value>(); });
  return static_cast<int64_t>(sms) * per_sm;
}

cudaError_t encode_tiles_cuda(const float* d_tiles, int64_t n, int K, trellis::Codebook cb,
                              uint16_t* d_states_out, float* d_decoded_out, void* d_workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (!tr::valid_bits(K) || n < 0) return cudaErrorInvalidValue;
  if (d_workspace == nullptr || workspace_bytes < encode_tiles_cuda_workspace(1, K))
    return cudaErrorInvalidValue;
  auto* failures = static_cast<unsigned*>(d_workspace);
  cudaError_t e = cudaMemsetAsync(failures, 0, sizeof(unsigned), stream);
  if (e != cudaSuccess || n == 0) return e;
  if (d_tiles == nullptr || d_states_out == nullptr) return cudaErrorInvalidValue;
  const auto capacity =
      static_cast<int64_t>((workspace_bytes - vit::kStatusBytes) / vit::bp_bytes_per_tile(K));
  int64_t grid = n < capacity ? n : capacity;
  if (grid > 0x7FFFFFFF) grid = 0x7FFFFFFF;
  auto* bp = static_cast<uint8_t*>(d_workspace) + vit::kStatusBytes;
  return tr::with_bits(K, cudaErrorInvalidValue, [&](auto k) {
    return launch_cb<decltype(k)::value>(cb, d_tiles, n, grid, bp, failures, d_states_out,
                                         d_decoded_out, stream);
  });
}

cudaError_t encode_tiles_cuda_failures(const void* d_workspace, uint32_t* count,
                                       cudaStream_t stream) {
  if (d_workspace == nullptr || count == nullptr) return cudaErrorInvalidValue;
  cudaError_t e =
      cudaMemcpyAsync(count, d_workspace, sizeof(uint32_t), cudaMemcpyDeviceToHost, stream);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(stream);
}

}  // namespace exl3::cuda
