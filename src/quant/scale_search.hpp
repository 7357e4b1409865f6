// Global scale search (docs/format.md, Regularisation, step 4).
#pragma once

#include <cstdint>

#include "exl3/quant/encode.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::quant::detail {

// The g minimising mean((Q(g t) / g - t)^2) over a sample of the tiles of w_r [rows, cols].
// `drift` inflates the sample first (LDLQ feedback makes the tiles it quantizes slightly larger
// than W_r; exllamav3 measured the factor per K).
double search_global_scale(const float* w_r, int64_t rows, int64_t cols, int K,
                           trellis::Codebook cb, Device device, double drift);

// exllamav3's LDLQ drift factor for K (1.0 from K = 4 up).
double ldlq_drift(int K);

}  // namespace exl3::quant::detail
