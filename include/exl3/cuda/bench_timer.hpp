// GPU timing for the benchmarks (exl3_bench_gemm, exl3 moe-bench): every timed call is queued
// behind a short GPU spin so host launch gaps never show, timed with CUDA events, median of
// the repetitions. Also the device copy bandwidth, the baseline every benchmark reports against.
#pragma once

#include <cstddef>
#include <functional>

#include <cuda_runtime_api.h>

namespace exl3::cuda {

// Enqueues a GPU busy-wait of about `microseconds` on `stream`.
cudaError_t spin(cudaStream_t stream, double microseconds);

class GpuTimer {
 public:
  GpuTimer();  // throws exl3::Error on CUDA failures
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  cudaStream_t stream() const { return stream_; }
  // Median microseconds of `reps` calls of fn(rep) on stream() (3 extra warm-up calls first).
  // fn must only enqueue work on stream(); it may throw.
  double median_us(int reps, const std::function<void(int)>& fn);
  // Device-to-device copy bandwidth over a 2 GiB buffer, read + write bytes per second (GB/s).
  double copy_bandwidth_gbs();

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

}  // namespace exl3::cuda
