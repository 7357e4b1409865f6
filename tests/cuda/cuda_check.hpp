// Test helpers for CUDA: every runtime call is checked, and tests skip where no device exists.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "exl3/cuda/reconstruct.hpp"

#define EXL3_CUDA_OK(expr)                                                               \
  do {                                                                                   \
    const cudaError_t exl3_err_ = (expr);                                                \
    ASSERT_EQ(exl3_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(exl3_err_); \
  } while (0)

#define EXL3_REQUIRE_GPU() \
  if (::exl3::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"
