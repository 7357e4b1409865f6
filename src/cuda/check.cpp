// EXL3_CUDA_CHECK's failure path (see exl3/cuda/check.hpp).
#include "exl3/cuda/check.hpp"

#include <string>

#include <cublas_v2.h>

#include "exl3/error.hpp"

namespace exl3::cuda::detail {
namespace {

// The last two components of a path ("src/cuda/linear.cpp" -> "cuda/linear.cpp"): enough to
// tell src/cuda/linear.cpp from src/runtime/linear.cpp without the build machine's checkout path.
std::string_view short_path(std::string_view file) {
  const size_t last = file.find_last_of('/');
  if (last == std::string_view::npos || last == 0) return file;
  const size_t before = file.find_last_of('/', last - 1);
  return before == std::string_view::npos ? file : file.substr(before + 1);
}

}  // namespace

std::string describe(cudaError_t s) {
  return fmt::format("{} ({})", cudaGetErrorString(s), cudaGetErrorName(s));
}

std::string describe(cublasStatus_t s) {
  return fmt::format("cuBLAS: {} ({})", cublasGetStatusString(s), cublasGetStatusName(s));
}

void raise_status(const std::string& status, const char* expr, const char* file, int line,
                  std::string_view context) {
  const std::string where =
      fmt::format("{} in `{}` at {}:{}", status, expr, short_path(file), line);
  if (context.empty()) throw Error(where);
  throw Error(fmt::format("{}: {}", context, where));
}

}  // namespace exl3::cuda::detail
