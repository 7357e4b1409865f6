// Per-tensor checks of the MoE loader (docs/moe-layouts.md, What fails closed: Loading). The loader
// re-validates every tensor it reads instead of trusting discovery: it also runs over bare
// stores (one rank's shard) that discovery never saw. Every message starts with
// "<file>: tensor '<name>'".
#pragma once

#include <cstdint>
#include <string>

#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::moe {

struct TrellisShape {
  int bits = 0;
  int64_t in = 0, out = 0;
};

// I16, rank 3 [in/16, out/16, 16*K] with K in 1..8, in/out multiples of 128. When given
// (non-zero), K must equal declared_bits and in/out the expected dims.
TrellisShape check_trellis(const TensorRef& ref, int declared_bits, int64_t in, int64_t out);

// F16, rank 1 of `length`, every element finite.
void check_fp16_vector(const TensorRef& ref, int64_t length, const char* what);

// Legacy packed signs: I16 rank 1 of length/16.
void check_legacy_signs(const TensorRef& ref, int64_t length);

// The codebook the markers select (3INST without one). Fails on both markers, a marker that is
// not an I32 scalar, or a sentinel other than the locked multiplier.
trellis::Codebook check_markers(const std::string& prefix, const TensorRef* mcg,
                                const TensorRef* mul1, const std::string& root);

// config.json's hidden_size / moe_intermediate_size against the loaded geometry, and its
// hidden_act (when given) against the SiLU the MoE computes.
void check_model_config(const ModelConfig& config, const MoeLayerWeights& w,
                        const std::string& label);

}  // namespace exl3::moe
