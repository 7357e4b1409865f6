// Programmatic dependent launch (Hopper): a kernel launched through launch_pdl may be scheduled
// while the kernel before it in the stream is still running, so the launch latency and block
// dispatch of the small kernels of a decode step (a few microseconds each, ~14 per layer) overlap
// the previous kernel instead of following it. CUDA graphs keep these programmatic edges when a
// step is captured.
//
// The contract, kept by every kernel launched this way: its first statement is pdl_begin(), which
// waits until the previous grid in the stream has completed and its memory is visible (so the
// kernel reads its inputs and writes its outputs exactly as with an ordinary launch), and then
// lets the next kernel be scheduled. Nothing is read or written before it. A kernel launched
// without the attribute passes the wait at once, so the same kernel may be launched both ways.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "exl3/cuda/launch.hpp"

namespace exl3::cuda {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // The next kernel may now be scheduled; it waits in its own pdl_begin() for this grid to end.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
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
