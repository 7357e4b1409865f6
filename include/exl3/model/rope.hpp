// Rotary position embeddings as Hugging Face transformers computes them (NeoX "rotate_half"
// layout, the one every supported architecture uses), with the rope_scaling variants:
//
//   default  inv_freq[i] = 1 / theta^(2i / rotary_dim),  i < rotary_dim / 2
//   linear   inv_freq / factor
//   llama3   low frequencies (wavelength > original_max / low_freq_factor) divided by factor,
//            high ones (wavelength < original_max / high_freq_factor) kept, the band between
//            blended with smooth = (original_max / wavelength - low) / (high - low)
//   yarn     inv_freq blended between interpolation (/ factor) and extrapolation by a linear
//            ramp over [low, high] = the correction range of beta_fast / beta_slow; cos and sin
//            are multiplied by attention_factor (0.1 * ln(factor) + 1 unless given, or the
//            mscale / mscale_all_dim ratio)
//
// Partial rotary (GLM-4.5's partial_rotary_factor): only the first rotary_dim channels of a
// head rotate, the rest pass through.
//
// Precision follows transformers: inv_freq is fp32, the angle pos * inv_freq is an fp32
// product, cos/sin are taken of that fp32 angle (exactly, then rounded to fp32).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace exl3::model {

enum class RopeType : uint8_t { kDefault, kLinear, kLlama3, kYarn };
std::string_view rope_type_name(RopeType t);  // "default" | "linear" | "llama3" | "yarn"

struct RopeSpec {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;         // even, <= head_dim; head_dim * partial_rotary_factor
  double factor = 1.0;            // linear / llama3 / yarn
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 0;  // llama3 / yarn
  double attention_factor = 1.0;                 // yarn: scales cos and sin
  double beta_fast = 32.0, beta_slow = 1.0;      // yarn
  bool truncate = true;                          // yarn: floor/ceil the correction range

  int64_t half() const { return rotary_dim / 2; }
};

// Reads the rope settings of a config.json: `rope_theta` + `rope_scaling` (transformers 4) or
// `rope_parameters` (transformers 5); `partial_rotary_factor` at the top level or inside
// rope_parameters. `max_position_embeddings` is the fallback for yarn's original length.
// Unsupported types (dynamic, longrope, ...) and bad values throw exl3::Error naming `label`
// (config.json) and the key.
RopeSpec parse_rope(const nlohmann::json& config, int64_t head_dim, const std::string& label);

// The rotary_dim / 2 inverse frequencies, fp32 as transformers stores them.
std::vector<float> rope_inv_freq(const RopeSpec& r);

// cos/sin of every frequency at a position (attention_factor applied).
class RopeTable {
 public:
  explicit RopeTable(const RopeSpec& r);
  int64_t half() const { return static_cast<int64_t>(inv_freq_.size()); }
  // cos[i], sin[i] for i < half().
  void at(int64_t pos, float* cos, float* sin) const;
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  std::vector<float> inv_freq_;
  double scale_ = 1.0;
};

// Rotates the first 2*half channels of x in place (NeoX layout: pairs (i, i + half)):
//   x[i]        = x[i] * cos[i] - x[i + half] * sin[i]
//   x[i + half] = x[i + half] * cos[i] + x[i] * sin[i]
void apply_rope(float* x, const float* cos, const float* sin, int64_t half);

}  // namespace exl3::model
