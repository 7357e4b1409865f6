// describe_model: config.json (+ the checkpoint's head) -> ModelSpec (see exl3/model/spec.hpp): the
// keys every family shares here, then the family's own function (model/families/).
#include "exl3/model/spec.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/config_keys.hpp"
#include "exl3/trellis/half.hpp"
#include "model/families/family.hpp"

namespace exl3::model {
namespace {

using nlohmann::json;

using Keys = ConfigKeys;  // the format layer's typed config reader

}  // namespace

std::string_view qk_norm_name(QkNorm n) {
  switch (n) {
    case QkNorm::kNone:
      return "none";
    case QkNorm::kPerHead:
      return "per_head";
    case QkNorm::kAcrossHeads:
      return "across_heads";
  }
  return "?";
}

std::string_view architecture_name(Architecture a) {
  return architecture_info(a).hf_name;
}

bool ModelSpec::has_recurrent_layers() const {
  return std::any_of(layers.begin(), layers.end(), [](const LayerSpec& l) {
    return std::holds_alternative<GatedDeltaNetSpec>(l.attention);
  });
}

bool ModelSpec::is_moe() const {
  return std::any_of(layers.begin(), layers.end(),
                     [](const LayerSpec& l) { return std::holds_alternative<MoeSpec>(l.mlp); });
}

ModelSpec describe_model(const ModelConfig& config, const std::string& label) {
  const json& raw = config.raw;
  const Keys k(raw, label);
  ModelSpec s;
  s.label = label;

  if (config.architecture.empty()) {
    fail("{}: key 'architectures' is missing; supported: {}", label,
         supported_architecture_names());
  }
  const ArchitectureInfo* arch = find_architecture(config.architecture);
  if (arch == nullptr) {
    fail("{}: key 'architectures': '{}' is not supported; supported: {}", label,
         config.architecture, supported_architecture_names());
  }
  s.architecture = arch->arch;

  // Gemma3TextConfig's defaults for keys a config may omit differ from the other families'.
  const bool gemma = arch->arch == Architecture::kGemma3;
  // GptOssConfig's likewise, and Qwen3NextConfig's.
  const bool gpt_oss = arch->arch == Architecture::kGptOss;
  const bool qwen3_next = arch->arch == Architecture::kQwen3Next ||
                          arch->arch == Architecture::kQwen3_5 ||
                          arch->arch == Architecture::kQwen3_5Moe;
  s.hidden_size = k.integer("hidden_size");
  s.vocab_size = k.integer("vocab_size");
  const int64_t num_layers = k.integer("num_hidden_layers");
  const int64_t heads = k.integer("num_attention_heads");
  // transformers' default
  const int64_t kv_heads =
      k.integer("num_key_value_heads", gemma ? 4 : (gpt_oss ? 8 : (qwen3_next ? 2 : heads)));
  if (kv_heads == 0 || heads % kv_heads != 0) {
    fail("{}: key 'num_key_value_heads': {} does not divide num_attention_heads {}", label,
         kv_heads, heads);
  }
  int64_t head_dim = k.integer("head_dim", gemma || qwen3_next ? 256 : (gpt_oss ? 64 : 0));
  if (head_dim == 0) {
    if (s.hidden_size % heads != 0) {
      fail(
          "{}: key 'head_dim' is missing and hidden_size {} is not a multiple of "
          "num_attention_heads {}",
          label, s.hidden_size, heads);
    }
    head_dim = s.hidden_size / heads;
  }
  s.rms_norm_eps = gemma || qwen3_next ? k.number("rms_norm_eps", 1e-6)
                   : gpt_oss           ? k.number("rms_norm_eps", 1e-5)
                                       : k.number("rms_norm_eps");
  s.max_position_embeddings = k.integer("max_position_embeddings", gemma || gpt_oss ? 131072 : 0);
  s.tie_word_embeddings = k.boolean("tie_word_embeddings", gemma);
  s.eos_token_ids = k.ids("eos_token_id");
  if (const auto bos = k.ids("bos_token_id"); !bos.empty()) s.bos_token_id = bos[0];
  if (gemma && !k.has("eos_token_id")) s.eos_token_ids = {1};
  if (gemma && !k.has("bos_token_id")) s.bos_token_id = 2;

  // Gemma names its activation hidden_activation and checks it itself.
  const std::string act = gemma ? "silu" : k.string("hidden_act", "silu");
  if (act != "silu") {
    fail("{}: key 'hidden_act': '{}' is not supported (the runtime's MLPs are SwiGLU: silu)", label,
         act);
  }
  if (k.boolean("use_sliding_window", false)) {
    fail(
        "{}: key 'use_sliding_window': sliding-window attention is not supported; hint: it is "
        "off in the released Qwen2/Qwen3 configs",
        label);
  }
  // The DSA families name their attention kind in layer_types, Gemma its sliding layers; they
  // check the entries.
  const bool own_layer_types =
      gemma || gpt_oss || qwen3_next || arch->arch == Architecture::kKimiLinear ||
      arch->arch == Architecture::kGlmMoeDsa || arch->arch == Architecture::kDeepseekV32;
  if (const json* lt = own_layer_types ? nullptr : k.get("layer_types")) {
    if (!lt->is_array()) fail("{}: key 'layer_types': expected a list of strings", label);
    for (const auto& t : *lt) {
      if (!t.is_string() || t.get<std::string>() != "full_attention") {
        fail("{}: key 'layer_types': entry {} is not supported (only full_attention)", label,
             t.dump());
      }
    }
  }
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (!gemma && k.has(key)) {
      fail("{}: key '{}': logit soft-capping is supported for Gemma3ForCausalLM only", label, key);
    }
  }

  families::Family f{config, k, label, s, {}, {}, num_layers};
  GqaAttentionSpec& attn = f.attention;
  attn.num_heads = heads;
  attn.num_kv_heads = kv_heads;
  attn.head_dim = head_dim;
  attn.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (s.architecture != Architecture::kGlm4Moe && s.architecture != Architecture::kMiniMaxM2 &&
      !qwen3_next && k.has("partial_rotary_factor") && k.number("partial_rotary_factor") != 1.0) {
    fail(
        "{}: key 'partial_rotary_factor': partial rotary is supported for Glm4MoeForCausalLM, "
        "MiniMaxM2ForCausalLM and Qwen3NextForCausalLM only, not {}",
        label, config.architecture);
  }
  // Gemma's RoPE differs per layer type; gpt-oss has defaults of its own.
  if (!gemma && !gpt_oss) attn.rope = parse_rope(raw, head_dim, label);
  switch (s.architecture) {
    case Architecture::kLlama:
      families::describe_llama(f);
      break;
    case Architecture::kMistral:
      families::describe_mistral(f);
      break;
    case Architecture::kMixtral:
      families::describe_mixtral(f);
      break;
    case Architecture::kQwen2:
      families::describe_qwen2(f);
      break;
    case Architecture::kQwen3:
      families::describe_qwen3(f);
      break;
    case Architecture::kQwen3Moe:
      families::describe_qwen3_moe(f);
      break;
    case Architecture::kGlm4Moe:
      families::describe_glm4_moe(f);
      break;
    case Architecture::kDeepseekV3:
      families::describe_deepseek_v3(f);
      families::describe_mtp(f);
      break;
    case Architecture::kDeepseekV32:
      families::describe_deepseek_v32(f);
      families::describe_mtp(f);
      break;
    case Architecture::kGlmMoeDsa:
      families::describe_glm_moe_dsa(f);
      families::describe_mtp(f);
      break;
    case Architecture::kGemma3:
      families::describe_gemma3(f);
      break;
    case Architecture::kGptOss:
      families::describe_gpt_oss(f);
      break;
    case Architecture::kMiniMaxM2:
      families::describe_minimax_m2(f);
      break;
    case Architecture::kQwen3Next:
      families::describe_qwen3_next(f);
      break;
    case Architecture::kQwen3_5:
      families::describe_qwen3_5(f, false);
      break;
    case Architecture::kQwen3_5Moe:
      families::describe_qwen3_5(f, true);
      break;
    case Architecture::kKimiLinear:
      families::describe_kimi_linear(f);
      break;
  }
  s.lm_head_tied = false;
  return s;
}

ModelSpec describe_model(const Checkpoint& ckpt) {
  const auto& cfg = ckpt.config();
  if (!cfg) {
    fail("{}: no config.json; the model runtime needs the checkpoint folder with its config.json",
         ckpt.path().string());
  }
  ModelSpec s = describe_model(*cfg, (ckpt.path() / "config.json").string());
  const bool has_head =
      ckpt.find_linear("lm_head") != nullptr || ckpt.store().contains("lm_head.weight");
  if (has_head) {
    s.lm_head = "lm_head";
    s.lm_head_tied = false;
  } else if (s.tie_word_embeddings) {
    s.lm_head = s.embed_tokens;
    s.lm_head_tied = true;
  } else {
    fail(
        "{}: no lm_head (neither EXL3 'lm_head.trellis' nor 'lm_head.weight'), and config.json "
        "does not set tie_word_embeddings",
        ckpt.path().string());
  }
  resolve_mtp_tensors(s, ckpt);
  return s;
}

void resolve_mtp_tensors(ModelSpec& s, const Checkpoint& ckpt) {
  for (auto& m : s.mtp_layers) {
    const std::string own_head = m.block.prefix + ".shared_head.head";
    if (ckpt.find_linear(own_head) != nullptr || ckpt.store().contains(own_head + ".weight")) {
      m.head = own_head;
      m.head_tied = false;
    } else {  // DeepSeek's MTP layer shares the target's output head when it stores none
      m.head = s.lm_head;
      m.head_tied = s.lm_head_tied;
    }
    const std::string own_embed = m.block.prefix + ".embed_tokens.weight";
    m.embed_tokens = ckpt.store().contains(own_embed) ? own_embed : s.embed_tokens;
  }
}

float embedding_scale(const ModelSpec& spec, DType stored) {
  if (!spec.scale_embedding) return 1.0f;
  // transformers keeps the scale in an fp32 tensor, then casts it to the weight's dtype.
  const auto f = static_cast<float>(std::sqrt(static_cast<double>(spec.hidden_size)));
  if (stored == DType::kBF16) return trellis::bf16_to_float(trellis::float_to_bf16(f));
  if (stored == DType::kF16) return trellis::round_to_half(f);
  return f;
}

nlohmann::json spec_summary(const ModelSpec& s) {
  json j;
  j["architecture"] = std::string(architecture_name(s.architecture));
  j["hidden_size"] = s.hidden_size;
  j["vocab_size"] = s.vocab_size;
  j["num_layers"] = s.num_layers();
  j["rms_norm_eps"] = s.rms_norm_eps;
  j["lm_head"] = s.lm_head;
  j["lm_head_tied"] = s.lm_head_tied;
  int64_t moe_layers = 0;
  for (const auto& l : s.layers) moe_layers += std::holds_alternative<MoeSpec>(l.mlp) ? 1 : 0;
  j["moe_layers"] = moe_layers;
  j["dense_layers"] = s.num_layers() - moe_layers;
  j["mtp_layers"] = static_cast<int64_t>(s.mtp_layers.size());
  if (!s.layers.empty()) {
    const auto rope = [](const RopeSpec& r) {
      return json{{"type", std::string(rope_type_name(r.type))},
                  {"theta", r.theta},
                  {"rotary_dim", r.rotary_dim},
                  {"factor", r.factor}};
    };
    // The first softmax-attention layer's kind (a hybrid model's DeltaNet layers are counted).
    int64_t linear = 0;
    bool described = false;
    for (const auto& l : s.layers) {
      if (const auto* d = std::get_if<GatedDeltaNetSpec>(&l.attention)) {
        if (++linear == 1) {
          j["linear_attention"] = {
              {"kind", "gated_delta_net"},     {"num_k_heads", d->num_k_heads},
              {"num_v_heads", d->num_v_heads}, {"head_k_dim", d->head_k_dim},
              {"head_v_dim", d->head_v_dim},   {"conv_kernel", d->conv_kernel}};
        }
      } else if (const auto* a = std::get_if<GqaAttentionSpec>(&l.attention); a && !described) {
        described = true;
        j["attention"] = {{"kind", "gqa"},
                          {"num_heads", a->num_heads},
                          {"num_kv_heads", a->num_kv_heads},
                          {"head_dim", a->head_dim},
                          {"qk_norm", qk_norm_name(a->qk_norm)},
                          {"rope", rope(a->rope)}};
      } else if (const auto* m = std::get_if<MlaAttentionSpec>(&l.attention); m && !described) {
        described = true;
        j["attention"] = {{"kind", "mla"},
                          {"num_heads", m->num_heads},
                          {"q_lora_rank", m->q_lora_rank},
                          {"kv_lora_rank", m->kv_lora_rank},
                          {"qk_nope_head_dim", m->qk_nope_head_dim},
                          {"qk_rope_head_dim", m->qk_rope_head_dim},
                          {"v_head_dim", m->v_head_dim},
                          {"rope_interleave", m->rope_interleave},
                          {"rope", rope(m->rope)}};
      }
    }
    if (linear > 0) j["linear_attention_layers"] = linear;
    for (const auto& l : s.layers) {
      if (const auto* m = std::get_if<MoeSpec>(&l.mlp)) {
        j["moe"] = {{"num_experts", m->num_experts},
                    {"top_k", m->top_k},
                    {"intermediate", m->intermediate},
                    {"router", m->router == RouterKind::kSoftmax ? "softmax" : "sigmoid_grouped"},
                    {"renormalize", m->renormalize},
                    {"shared_intermediate", m->shared ? m->shared->intermediate : 0}};
        break;
      }
    }
  }
  return j;
}

}  // namespace exl3::model
