// The model architectures exl3 supports, in one table: the Hugging Face class name config.json
// names, its model_type, the CLI spelling and the traits the loaders, the converter and the
// synthetic-model writer key on. Adding a family starts here.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace exl3 {

enum class Architecture : uint8_t {
  kLlama,
  kMistral,
  kMixtral,
  kQwen2,
  kQwen3,
  kQwen3Moe,
  kGlm4Moe,
  kDeepseekV3,
  kDeepseekV32,
  kGlmMoeDsa,
  kGemma3,
  kGptOss,
  kMiniMaxM2,
  kQwen3Next,
  kQwen3_5,
  kQwen3_5Moe,
  kKimiLinear
};

struct ArchitectureInfo {
  Architecture arch;
  std::string_view hf_name;     // config.json "architectures"[0], e.g. "Qwen3MoeForCausalLM"
  std::string_view model_type;  // config.json "model_type", e.g. "qwen3_moe"
  std::string_view cli_name;    // `exl3 sample-hf --arch`, e.g. "qwen3-moe"
  bool moe;                     // routed experts: mlp.experts.E.{gate,up,down}_proj (Mixtral:
                                // block_sparse_moe.experts.E.{w1,w3,w2})
  bool shared_experts;          // mlp.shared_experts.* beside them (GLM-4.5)
  bool qk_norm;                 // per-head RMSNorm of q and k (Qwen3; MiniMax-M2's spans heads)
  bool qkv_bias;                // biases on q/k/v_proj (Qwen2, GLM-4.5)
  bool mla;                     // multi-head latent attention (DeepSeek-V3): no q/k/v_proj
};

std::span<const ArchitectureInfo> supported_architectures();
const ArchitectureInfo& architecture_info(Architecture a);
// By config.json's class name; nullptr when exl3 does not support it.
const ArchitectureInfo* find_architecture(std::string_view hf_name);
// "LlamaForCausalLM, Qwen2ForCausalLM, ..." for error messages and help.
std::string supported_architecture_names();

}  // namespace exl3
