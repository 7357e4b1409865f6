// EXL3 tensor quantizer (docs/format.md, Encoder): regularisation, Hadamard rotations, global
// scale search, Viterbi tile encoding and, given a Hessian, LDLQ error feedback.
//
// Input is one linear layer's weight in EXL3's input-major orientation W[in, out] (the transpose
// of HF's nn.Linear.weight). The output holds the tensors a checkpoint stores (trellis, suh, svh)
// for the padded shape, plus statistics.
//
// Randomness: the sign vectors come from std::mt19937_64 seeded with QuantOptions::seed (su0 for
// the padded input channels first, then the output signs). exllamav3 draws them from torch's RNG,
// which cannot be reproduced here, so results match exllamav3 in distribution, not bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "exl3/cpu/linear.hpp"
#include "exl3/quant/encode.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::quant {

// Per-output-channel RMS scaling (`--out_scales`): kAuto applies it only when the input is not
// skewed (the top 2% of sqrt(diag H) hold less than 15% of its sum); without a usable Hessian
// kAuto does not apply it, as in exllamav3.
enum class OutScales : uint8_t { kAlways, kNever, kAuto };

struct QuantOptions {
  int bits = 4;  // K, 1..8
  trellis::Codebook codebook = trellis::Codebook::kMul1;
  uint64_t seed = 0;
  OutScales out_scales = OutScales::kAlways;
  double sigma_reg = 0.025;  // diagonal damping of H, as a fraction of mean(diag H)
  bool ldlq = true;          // error feedback when a Hessian is given; false = plain tile encoding
  double g_scale = 0.0;      // > 0: use this global scale instead of searching for one
  int threads = 0;           // 0 = the caller's TBB arena
  Device device = Device::kCpu;  // where the tile encoder runs (exl3/quant/encode.hpp)
};

// Non-owning view of a Hessian H = E[x^T x] over the layer's inputs, [in, in] row-major, fp32 or
// fp64 (exactly one pointer set). Only its lower triangle is read.
struct HessianView {
  const float* f32 = nullptr;
  const double* f64 = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct QuantizedTensor {
  int bits = 0;
  trellis::Codebook codebook = trellis::Codebook::k3Inst;
  int64_t in_features = 0;  // as given
  int64_t out_features = 0;
  int64_t padded_in = 0;  // multiples of 128; the stored tensors use these
  int64_t padded_out = 0;
  std::vector<uint16_t> trellis;  // int16 bits [padded_in/16, padded_out/16, 16*bits]
  std::vector<uint16_t> suh;      // fp16 bits [padded_in]
  std::vector<uint16_t> svh;      // fp16 bits [padded_out]

  double g_scale = 1.0;  // global scale (searched, or QuantOptions::g_scale)
  bool out_scales_applied = false;
  bool used_hessian = false;  // false without H, or when H was unusable (mean diag < 1e-20)
  bool ldlq_applied = false;
  int cholesky_retries = 0;  // extra damping rounds the factorisation needed
  // tr(E H E^T) / tr(W H W^T) in the rotated basis (H damped and rotated like the weight); without
  // a usable Hessian the same ratio with H = I, i.e. nmse_rotated.
  double proxy_err = 0.0;
  double mse_rotated = 0.0;   // mean (W_r - Q)^2 over the padded rotated weight
  double nmse_rotated = 0.0;  // mse_rotated / mean(W_r^2)
  double rms_rotated = 0.0;   // RMS of W_r (about 1.24 * g for a well-behaved weight)

  // View for the CPU reference (reconstruct_weight, linear_forward); valid while *this lives.
  cpu::LinearView view() const {
    cpu::LinearView v;
    v.trellis = trellis;
    v.in_features = padded_in;
    v.out_features = padded_out;
    v.bits = bits;
    v.codebook = codebook;
    v.suh = suh;
    v.svh = svh;
    return v;
  }
};

// Quantizes weight [in_features, out_features] (row-major, input-major). Throws exl3::Error for
// bits outside 1..8, non-positive shapes, a non-finite weight or Hessian element (named by its
// indices), a Hessian whose shape is not [in_features, in_features], or a Hessian that stays
// indefinite after 10 damping retries.
QuantizedTensor quantize_tensor(const float* weight, int64_t in_features, int64_t out_features,
                                const QuantOptions& options, const HessianView* hessian = nullptr);

}  // namespace exl3::quant
