// The supported-architecture table (see architectures.hpp).
#include "exl3/format/architectures.hpp"

#include <array>

namespace exl3 {
namespace {

constexpr std::array<ArchitectureInfo, 17> kArchitectures = {{
    // arch, HF class, model_type, CLI, moe, shared experts, qk_norm, qkv_bias, mla
    {Architecture::kLlama, "LlamaForCausalLM", "llama", "llama", false, false, false, false, false},
    {Architecture::kMistral, "MistralForCausalLM", "mistral", "mistral", false, false, false, false,
     false},
    {Architecture::kMixtral, "MixtralForCausalLM", "mixtral", "mixtral", true, false, false, false,
     false},
    {Architecture::kQwen2, "Qwen2ForCausalLM", "qwen2", "qwen2", false, false, false, true, false},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3", "qwen3", false, false, true, false, false},
    {Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe", "qwen3-moe", true, false, true,
     false, false},
    {Architecture::kGlm4Moe, "Glm4MoeForCausalLM", "glm4_moe", "glm4-moe", true, true, false, true,
     false},
    {Architecture::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3", "deepseek-v3", true, true,
     false, false, true},
    {Architecture::kDeepseekV32, "DeepseekV32ForCausalLM", "deepseek_v32", "deepseek-v32", true,
     true, false, false, true},
    {Architecture::kGlmMoeDsa, "GlmMoeDsaForCausalLM", "glm_moe_dsa", "glm-moe-dsa", true, true,
     false, false, true},
    {Architecture::kGemma3, "Gemma3ForCausalLM", "gemma3_text", "gemma3", false, false, true, false,
     false},
    {Architecture::kGptOss, "GptOssForCausalLM", "gpt_oss", "gpt-oss", true, false, false, true,
     false},
    {Architecture::kMiniMaxM2, "MiniMaxM2ForCausalLM", "minimax_m2", "minimax-m2", true, false,
     false, false, false},
    // Qwen3-Next's shared expert is `shared_expert` (singular, gated), which its family names.
    {Architecture::kQwen3Next, "Qwen3NextForCausalLM", "qwen3_next", "qwen3-next", true, false,
     true, false, false},
    // Qwen3.5 text models: Qwen3-Next's layers with the DeltaNet's input projections split.
    {Architecture::kQwen3_5, "Qwen3_5ForCausalLM", "qwen3_5_text", "qwen3.5", false, false, true,
     false, false},
    {Architecture::kQwen3_5Moe, "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", "qwen3.5-moe", true,
     false, true, false, false},
    // Kimi-Linear: MLA in its full-attention layers only, so `mla` (every layer) is false; its
    // family names the MLP block (block_sparse_moe) and the per-layer attention kinds.
    {Architecture::kKimiLinear, "KimiLinearForCausalLM", "kimi_linear", "kimi-linear", true, true,
     false, false, false},
}};

}  // namespace

std::span<const ArchitectureInfo> supported_architectures() {
  return kArchitectures;
}

const ArchitectureInfo& architecture_info(Architecture a) {
  for (const auto& i : kArchitectures) {
    if (i.arch == a) return i;
  }
  return kArchitectures[0];  // unreachable: every enumerator has a row
}

const ArchitectureInfo* find_architecture(std::string_view hf_name) {
  for (const auto& i : kArchitectures) {
    if (i.hf_name == hf_name) return &i;
  }
  return nullptr;
}

std::string supported_architecture_names() {
  std::string out;
  for (const auto& i : kArchitectures) {
    if (!out.empty()) out += ", ";
    out += i.hf_name;
  }
  return out;
}

}  // namespace exl3
