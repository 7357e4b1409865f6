// GpuTimer (see exl3/cuda/bench_timer.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "exl3/cuda/bench_timer.hpp"
#include "exl3/error.hpp"

namespace exl3::cuda {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("GPU timer: {}: {}", what, cudaGetErrorString(e));
}

}  // namespace

GpuTimer::GpuTimer() {
  ck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the stream");
  ck(cudaEventCreate(&a_), "creating an event");
  ck(cudaEventCreate(&b_), "creating an event");
}

GpuTimer::~GpuTimer() {
  cudaEventDestroy(a_);
  cudaEventDestroy(b_);
  cudaStreamDestroy(stream_);
}

double GpuTimer::median_us(int reps, const std::function<void(int)>& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps + 3; ++r) {
    ck(spin(stream_, 50.0), "spin");
    ck(cudaEventRecord(a_, stream_), "recording");
    fn(r);
    ck(cudaEventRecord(b_, stream_), "recording");
    ck(cudaEventSynchronize(b_), "waiting for the timed work");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, a_, b_), "reading the events");
    if (r >= 3) t.push_back(ms * 1000.0);
  }
  std::sort(t.begin(), t.end());
  return t.empty() ? 0.0 : t[t.size() / 2];
}

double GpuTimer::copy_bandwidth_gbs() {
  const size_t bytes = 2ull << 30;
  void *a = nullptr, *b = nullptr;
  ck(cudaMalloc(&a, bytes), "allocating the copy buffers");
  ck(cudaMalloc(&b, bytes), "allocating the copy buffers");
  ck(cudaMemset(a, 1, bytes), "filling");
  const double us = median_us(10, [&](int) {
    ck(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
  });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6) / 1e9;
}

}  // namespace exl3::cuda
