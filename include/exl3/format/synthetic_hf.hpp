// Synthetic Hugging Face models: random (seeded, deterministic) weights in the exact tensor
// layout and config.json of Llama, Qwen2, Qwen3, Qwen3-MoE and GLM-4.5-style MoE checkpoints,
// plus a tiny byte-level tokenizer. They are the input side of `exl3 quantize` in tests and
// `make demo` (never for quality claims: the weights are noise).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

#include "exl3/format/architectures.hpp"
#include "exl3/format/dtype.hpp"

namespace exl3 {

// The supported families (exl3/format/architectures.hpp); the name predates that table.
using HfArch = Architecture;

// CLI spelling: "llama" | "qwen2" | "qwen3" | "qwen3-moe" | "glm4-moe".
std::string_view hf_arch_name(HfArch a);
std::optional<HfArch> parse_hf_arch(std::string_view s);

struct SyntheticHfSpec {
  HfArch arch = HfArch::kQwen3Moe;
  int64_t hidden_size = 256;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;
  int64_t intermediate_size = 512;  // dense MLPs (dense archs, GLM's leading dense layers)
  int64_t num_experts = 4;          // MoE archs
  int64_t experts_per_tok = 2;
  int64_t moe_intermediate_size = 256;
  int64_t n_shared_experts = 1;       // GLM-4.5 shared experts (0 = none)
  int64_t first_k_dense_replace = 1;  // GLM-4.5: leading layers with a dense MLP
  int64_t vocab_size = 512;           // any size: odd sizes exercise the converter's padding
  bool tie_word_embeddings = false;   // true: no lm_head.weight is written
  DType dtype = DType::kBF16;         // weights: BF16, F16 or F32
  double init_std = 0.02;
  uint64_t seed = 1;
};

struct SyntheticHfResult {
  std::filesystem::path dir;
  int64_t num_tensors = 0;
  int64_t num_linears = 0;  // 2-D projection weights (what a converter quantizes, lm_head included)
  uint64_t bytes = 0;
};

// Writes config.json, model.safetensors, generation_config.json, tokenizer.json and
// tokenizer_config.json into `dir` (created if needed). Throws exl3::Error for invalid specs.
SyntheticHfResult write_synthetic_hf_model(const std::filesystem::path& dir,
                                           const SyntheticHfSpec& spec);

}  // namespace exl3
