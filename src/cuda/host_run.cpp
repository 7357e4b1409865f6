// Host-memory wrappers around Exl3LinearCuda for the CLI and tests (not for serving: they
// allocate and synchronise on every call).
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/cuda/reconstruct.hpp"
#include "exl3/error.hpp"

namespace exl3::cuda {

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
  const DeviceBuffer dx(x, xin * 4, "the linear host wrapper's input");
  const DeviceBuffer dy(yout * 4, "the linear host wrapper's output");
  const DeviceBuffer ws(ws_bytes, "the linear host wrapper's workspace");
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
