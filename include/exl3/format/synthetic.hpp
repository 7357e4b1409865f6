// Synthetic EXL3 checkpoints: random but valid trellis data with random suh/svh, written with
// exl3's own safetensors writer. Used by `make demo`, tests and speed benchmarks (never for
// quality claims: the weights are noise).
#pragma once

#include <cstdint>
#include <filesystem>

#include "exl3/trellis/codebook.hpp"

namespace exl3 {

struct SyntheticSpec {
  int64_t hidden_size = 256;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;
  int64_t num_experts = 4;  // 0 = dense MLP
  int64_t experts_per_tok = 2;
  int64_t moe_intermediate_size = 256;
  int64_t intermediate_size = 512;  // dense MLP width (num_experts == 0)
  int64_t vocab_size = 512;
  int64_t max_position_embeddings = 4096;  // config.json's (the longest sequence the engines run)
  int bits = 4;
  int head_bits = 6;
  trellis::Codebook codebook = trellis::Codebook::kMul1;
  uint64_t seed = 1;
  int64_t input_rows = 4;  // rows of the sample input written beside the model
};

struct SyntheticResult {
  std::filesystem::path model_file;  // <dir>/model.safetensors
  std::filesystem::path
      input_file;  // <dir>/sample_input.safetensors, tensor `x` F16 [rows, hidden]
  int64_t num_exl3_linears = 0;
  uint64_t bytes = 0;
};

// Writes config.json, model.safetensors and sample_input.safetensors into `dir` (created if
// needed). Architecture Qwen3MoeForCausalLM when num_experts > 0, else Qwen3ForCausalLM.
SyntheticResult write_synthetic_checkpoint(const std::filesystem::path& dir,
                                           const SyntheticSpec& spec);

}  // namespace exl3
