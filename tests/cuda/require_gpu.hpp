// GPU tests skip cleanly where no CUDA device exists. CUDA, cuBLAS and NCCL calls in the tests
// are checked with the library's EXL3_CUDA_CHECK (a failure throws exl3::Error, which gtest
// reports as the test's failure with the call, file and line).
#pragma once

#include <gtest/gtest.h>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/reconstruct.hpp"

#define EXL3_REQUIRE_GPU() \
  if (::exl3::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"
