// Tile encoding on a chosen device: the CPU Viterbi (exl3/quant/viterbi.hpp) or, in builds with
// CUDA (EXL3_HAVE_CUDA), the GPU one (exl3/cuda/viterbi.hpp). Both run the same two-pass
// tail-biting search with fp32 costs, FMA candidates and the same tie order, so they return the
// same states (bit for bit against the CPU's AVX2 path).
#pragma once

#include <cstdint>
#include <string_view>

#include "exl3/trellis/codebook.hpp"

namespace exl3::quant {

enum class Device : uint8_t { kCpu, kCuda };

// "cpu" or "cuda".
const char* device_name(Device d);

// Parses "cpu" / "cuda"; throws exl3::Error for anything else.
Device parse_device(std::string_view name);

// True when `d` can encode here: kCpu always; kCuda when the build has CUDA and a device exists.
bool encode_device_available(Device d);

// encode_tiles (same contract: tiles [n, 256] fp32 in sequence order, states_out [n, 256],
// decoded_out nullable [n, 256]) on `device`. Throws exl3::Error for bad input, CUDA failures, or
// kCuda in a build without CUDA ("built without CUDA: rebuild with -DEXL3_CUDA=ON").
void encode_tiles_on(Device device, const float* tiles, int64_t n, int K, trellis::Codebook cb,
                     uint16_t* states_out, float* decoded_out = nullptr);

}  // namespace exl3::quant
