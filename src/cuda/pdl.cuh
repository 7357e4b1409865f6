// Programmatic dependent launch (Hopper): a kernel launched through launch_pdl may be scheduled
// while the kernel before it in the stream is still running, so the launch latency and block
// dispatch of the small kernels of a decode step (a few microseconds each, ~14 per layer) overlap
// the previous kernel instead of following it. CUDA graphs keep these programmatic edges when a
// step is captured.
//
// The contract, kept by every kernel launched this way: its first statement is pdl_begin(), which
// waits until the previous grid in the stream has completed and its memory is visible (so the
// kernel reads its inputs and writes its outputs exactly as with an ordinary launch), and then
// lets the next kernel be scheduled. Nothing is read or written before it, with one exception:
// a kernel may load weights (device memory no kernel writes while a model runs) before calling
// it, so the first trip to memory overlaps the previous kernel's tail (the staged EXL3 GEMV
// does). A kernel launched without the attribute passes the wait at once, so the same kernel
// may be launched both ways.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "exl3/cuda/launch.hpp"

namespace exl3::cuda {

// The two halves of pdl_begin, for a kernel that issues loads of constant data (weights) first.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The next kernel may now be scheduled; it waits in its own pdl_begin() for this grid to end.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_release();
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed
// (an ordinary launch when exl3::cuda::programmatic_launch() is off). Like <<<>>>, it returns
// nothing: a launch error is left for cudaGetLastError(), which every launcher reads after it.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = programmatic_launch() ? 1 : 0;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace exl3::cuda
