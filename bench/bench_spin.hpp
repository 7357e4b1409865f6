// A GPU spin of a given duration, queued before timed work so that the host has enqueued
// everything before the first timing event fires (the timings are then pure GPU time).
#pragma once

#include <cuda_runtime_api.h>

namespace exl3::bench {
cudaError_t spin(cudaStream_t stream, double microseconds);
}
