// The spin kernel of the benchmark timer (exl3/cuda/bench_timer.hpp); GpuTimer itself is in
// bench_timer.cpp (host code: fmt does not compile under nvcc).
#include "exl3/cuda/bench_timer.hpp"


namespace exl3::cuda {
namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t spin(cudaStream_t stream, double microseconds) {
  int dev = 0, khz = 1980000;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<long long>(microseconds * khz / 1000.0));
  return cudaGetLastError();
}

}  // namespace exl3::cuda
