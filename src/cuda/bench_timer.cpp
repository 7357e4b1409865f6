// GpuTimer (see exl3/cuda/bench_timer.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "exl3/cuda/bench_timer.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/error.hpp"

namespace exl3::cuda {
namespace {}  // namespace

GpuTimer::GpuTimer() {
  EXL3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                  "GPU timer: creating the stream");
  EXL3_CUDA_CHECK(cudaEventCreate(&a_), "GPU timer: creating an event");
  EXL3_CUDA_CHECK(cudaEventCreate(&b_), "GPU timer: creating an event");
}

GpuTimer::~GpuTimer() {
  cudaEventDestroy(a_);
  cudaEventDestroy(b_);
  cudaStreamDestroy(stream_);
}

double GpuTimer::median_us(int reps, const std::function<void(int)>& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps + 3; ++r) {
    EXL3_CUDA_CHECK(spin(stream_, 50.0), "GPU timer: spin");
    EXL3_CUDA_CHECK(cudaEventRecord(a_, stream_), "GPU timer: recording");
    fn(r);
    EXL3_CUDA_CHECK(cudaEventRecord(b_, stream_), "GPU timer: recording");
    EXL3_CUDA_CHECK(cudaEventSynchronize(b_), "GPU timer: waiting for the timed work");
    float ms = 0;
    EXL3_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_), "GPU timer: reading the events");
    if (r >= 3) t.push_back(ms * 1000.0);
  }
  std::sort(t.begin(), t.end());
  return t.empty() ? 0.0 : t[t.size() / 2];
}

double GpuTimer::copy_bandwidth_gbs() {
  const size_t bytes = 2ull << 30;
  const DeviceBuffer a(bytes, "the GPU timer's copy source"),
      b(bytes, "the GPU timer's copy target");
  EXL3_CUDA_CHECK(cudaMemset(a.get(), 1, bytes), "GPU timer: filling");
  const double us = median_us(10, [&](int) {
    EXL3_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream_),
                    "GPU timer: copy");
  });
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6) / 1e9;
}

}  // namespace exl3::cuda
