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
  // DeepSeek-V3 (DeepseekV3ForCausalLM) when kv_lora_rank > 0: multi-head latent attention (a q
  // LoRA of q_lora_rank), kv_b_proj BF16, the first first_k_dense_replace layers dense
  // (intermediate_size), then sigmoid grouped routing over num_experts with n_shared_experts.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t first_k_dense_replace = 0;
  int64_t n_shared_experts = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  // gpt-oss (GptOssForCausalLM) when set: q/k/v/o biases and a sink per head, sliding (window
  // sliding_window) and full layers alternating, a biased softmax router, biased experts with
  // the clamped SwiGLU, every linear padded to 128 on both sides as the converter pads it.
  bool gpt_oss = false;
  int64_t sliding_window = 128;
  // Qwen3-Next (Qwen3NextForCausalLM) when linear_num_value_heads > 0: every
  // full_attention_interval-th layer gated full attention (q_proj writes [query, gate] per head;
  // q/k norms), the others gated DeltaNet (in_proj_qkvz and out_proj EXL3; in_proj_ba, conv1d,
  // A_log, dt_bias and the gated norm BF16, as converted), the routed experts beside a shared
  // expert of shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate(x)); every
  // RMSNorm outside the DeltaNet scales by (1 + w), so its weights sit around 0.
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_conv_kernel = 4;
  int64_t full_attention_interval = 4;
  int64_t shared_expert_intermediate_size = 0;
  double partial_rotary_factor = 0.25;
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
// needed). Architecture GptOssForCausalLM when gpt_oss, DeepseekV3ForCausalLM when kv_lora_rank
// > 0, Qwen3NextForCausalLM when linear_num_value_heads > 0, else Qwen3MoeForCausalLM when
// num_experts > 0, else Qwen3ForCausalLM.
SyntheticResult write_synthetic_checkpoint(const std::filesystem::path& dir,
                                           const SyntheticSpec& spec);

}  // namespace exl3
