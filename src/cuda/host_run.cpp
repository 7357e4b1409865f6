// Host-memory wrappers around Exl3LinearCuda for the CLI and tests (not for serving: they
// allocate and synchronise on every call).
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/cuda/reconstruct.hpp"
#include "exl3/error.hpp"

namespace exl3::cuda {

namespace {

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;

DevicePtr device_alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  EXL3_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes),
                  fmt::format("CUDA: allocating {} ({} bytes)", what, bytes));
  return DevicePtr(p);
}

}  // namespace

std::string device_name() {
  if (device_count() == 0) fail("no CUDA device found; run with --device cpu");
  cudaDeviceProp prop{};
  EXL3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0), "CUDA: reading device properties");
  return prop.name;
}

std::vector<float> linear_forward_host(const Exl3LinearCuda& layer, const float* x, int64_t m) {
  if (m < 1 || m > layer.options().max_m) {
    fail("CUDA linear: {} rows outside 1..{} (raise LinearOptions::max_m)", m,
         layer.options().max_m);
  }
  const size_t xin = static_cast<size_t>(m * layer.in_features()),
               yout = static_cast<size_t>(m * layer.out_features());
  const size_t ws_bytes = layer.workspace_bytes();
  auto dx = device_alloc(xin * 4, "input");
  auto dy = device_alloc(yout * 4, "output");
  auto ws = device_alloc(ws_bytes, "workspace");
  EXL3_CUDA_CHECK(cudaMemcpy(dx.get(), x, xin * 4, cudaMemcpyHostToDevice), "CUDA: copying input");
  EXL3_CUDA_CHECK(
      layer.run(dx.get(), DType::kF32, dy.get(), DType::kF32, m, ws.get(), ws_bytes, nullptr),
      "CUDA: running linear");
  EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "CUDA: running linear");
  std::vector<float> y(yout);
  EXL3_CUDA_CHECK(cudaMemcpy(y.data(), dy.get(), yout * 4, cudaMemcpyDeviceToHost),
                  "CUDA: copying output");
  return y;
}

}  // namespace exl3::cuda
