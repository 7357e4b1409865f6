// Synthetic Hugging Face model writer (see synthetic_hf.hpp). Tensor names, shapes ([out, in]
// for linears) and config keys follow what transformers' save_pretrained writes for each
// architecture, so the converter sees exactly the layouts it meets in real checkpoints.
#include "exl3/format/synthetic_hf.hpp"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/byte_alphabet.hpp"
#include "exl3/format/file_io.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3 {

namespace {

namespace tr = exl3::trellis;
using ojson = nlohmann::ordered_json;

bool is_moe(HfArch a) {
  return architecture_info(a).moe;
}
bool has_qk_norm(HfArch a) {
  return architecture_info(a).qk_norm;
}
bool has_qkv_bias(HfArch a) {
  return architecture_info(a).qkv_bias;
}

class Writer {
 public:
  explicit Writer(const SyntheticHfSpec& s) : s_(s), rng_(s.seed) {}

  // Gaussian weights with log-normal per-row scales, like trained layers' uneven channels.
  void linear(const std::string& name, int64_t out, int64_t in) {
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<float> v(static_cast<size_t>(out * in));
    for (int64_t o = 0; o < out; ++o) {
      const double row_scale = s_.init_std * std::exp(0.3 * nd(rng_));
      for (int64_t i = 0; i < in; ++i)
        v[static_cast<size_t>(o * in + i)] = static_cast<float>(row_scale * nd(rng_));
    }
    add(name, {out, in}, v, s_.dtype);
    ++linears_;
  }

  void vector(const std::string& name, int64_t n, double offset, double scale, DType dtype) {
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<float>(offset + scale * nd(rng_));
    add(name, {n}, v, dtype);
  }

  void matrix(const std::string& name, int64_t rows, int64_t cols, double scale) {
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (auto& x : v) x = static_cast<float>(scale * nd(rng_));
    add(name, {rows, cols}, v, s_.dtype);
  }

  SafetensorsWriter& writer() { return w_; }
  int64_t linears() const { return linears_; }

 private:
  void add(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v,
           DType dtype) {
    if (dtype == DType::kF32) {
      w_.add<float>(name, dtype, std::move(shape), v);
      return;
    }
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      h[i] = dtype == DType::kBF16 ? tr::float_to_bf16(v[i]) : tr::float_to_half(v[i]);
    }
    w_.add<uint16_t>(name, dtype, std::move(shape), h);
  }

  const SyntheticHfSpec& s_;
  std::mt19937_64 rng_;
  SafetensorsWriter w_;
  int64_t linears_ = 0;
};

void validate(const SyntheticHfSpec& s) {
  auto positive = [](const char* what, int64_t v) {
    if (v <= 0) fail("synthetic HF model: {} = {} must be positive", what, v);
  };
  positive("hidden_size", s.hidden_size);
  positive("num_layers", s.num_layers);
  positive("num_heads", s.num_heads);
  positive("num_kv_heads", s.num_kv_heads);
  positive("head_dim", s.head_dim);
  positive("intermediate_size", s.intermediate_size);
  if (s.num_heads % s.num_kv_heads != 0) {
    fail("synthetic HF model: num_heads {} must be a multiple of num_kv_heads {}", s.num_heads,
         s.num_kv_heads);
  }
  if (s.vocab_size < 4) fail("synthetic HF model: vocab_size {} must be at least 4", s.vocab_size);
  if (is_moe(s.arch)) {
    positive("num_experts", s.num_experts);
    positive("moe_intermediate_size", s.moe_intermediate_size);
    if (s.experts_per_tok <= 0 || s.experts_per_tok > s.num_experts) {
      fail("synthetic HF model: experts_per_tok {} must be in 1..{}", s.experts_per_tok,
           s.num_experts);
    }
  }
  if (architecture_info(s.arch).mla) {
    fail(
        "synthetic HF model: {} (multi-head latent attention) is not written by the synthetic "
        "writer; hint: make a tiny one with transformers (tests/model/data/make_deepseek_v3.py)",
        architecture_info(s.arch).hf_name);
  }
  if (s.arch == HfArch::kGemma3) {
    fail(
        "synthetic HF model: Gemma3ForCausalLM (sandwich norms, GeGLU, local/global layers) is "
        "not written by the synthetic writer; hint: make a tiny one with transformers "
        "(tests/model/data/make_gemma3.py)");
  }
  if (s.arch == HfArch::kGptOss) {
    fail(
        "synthetic HF model: GptOssForCausalLM (attention sinks, fused biased experts) is not "
        "written by the synthetic writer; hint: make a tiny one with transformers "
        "(tests/model/data/make_gpt_oss.py)");
  }
  if (s.arch == HfArch::kMiniMaxM2) {
    fail(
        "synthetic HF model: MiniMaxM2ForCausalLM (q/k norms across heads, a biased sigmoid "
        "router) is not written by the synthetic writer; hint: make a tiny one with transformers "
        "(tests/model/data/make_minimax_m2.py)");
  }
  if (s.arch == HfArch::kGlm4Moe && (s.first_k_dense_replace < 0 || s.n_shared_experts < 0)) {
    fail("synthetic HF model: first_k_dense_replace and n_shared_experts must be >= 0");
  }
  if (s.dtype != DType::kBF16 && s.dtype != DType::kF16 && s.dtype != DType::kF32) {
    fail("synthetic HF model: dtype {} must be BF16, F16 or F32", dtype_name(s.dtype));
  }
}

const char* torch_name(DType t) {
  return t == DType::kBF16 ? "bfloat16" : t == DType::kF16 ? "float16" : "float32";
}

ojson make_config(const SyntheticHfSpec& s) {
  const ArchitectureInfo& r = architecture_info(s.arch);
  ojson c;
  c["architectures"] = {std::string(r.hf_name)};
  c["model_type"] = std::string(r.model_type);
  c["attention_bias"] = has_qkv_bias(s.arch);
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = 1;
  c["eos_token_id"] = 2;
  c["pad_token_id"] = 0;
  c["head_dim"] = s.head_dim;
  c["hidden_act"] = "silu";
  c["hidden_size"] = s.hidden_size;
  c["initializer_range"] = s.init_std;
  c["intermediate_size"] = s.intermediate_size;
  c["max_position_embeddings"] = 4096;
  c["num_attention_heads"] = s.num_heads;
  c["num_hidden_layers"] = s.num_layers;
  c["num_key_value_heads"] = s.num_kv_heads;
  c["rms_norm_eps"] = 1e-6;
  c["rope_theta"] = 10000.0;
  c["tie_word_embeddings"] = s.tie_word_embeddings;
  c["torch_dtype"] = torch_name(s.dtype);
  c["use_cache"] = true;
  c["vocab_size"] = s.vocab_size;
  if (s.arch == HfArch::kQwen3Moe) {
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = ojson::array();
    c["moe_intermediate_size"] = s.moe_intermediate_size;
    c["norm_topk_prob"] = true;
    c["num_experts"] = s.num_experts;
    c["num_experts_per_tok"] = s.experts_per_tok;
    c["router_aux_loss_coef"] = 0.001;
  } else if (s.arch == HfArch::kGlm4Moe) {
    c["first_k_dense_replace"] = s.first_k_dense_replace;
    c["moe_intermediate_size"] = s.moe_intermediate_size;
    c["n_group"] = 1;
    c["n_routed_experts"] = s.num_experts;
    c["n_shared_experts"] = s.n_shared_experts;
    c["norm_topk_prob"] = true;
    c["num_experts_per_tok"] = s.experts_per_tok;
    c["partial_rotary_factor"] = 0.5;
    c["routed_scaling_factor"] = 2.5;
    c["topk_group"] = 1;
    c["use_qk_norm"] = false;
  }
  return c;
}

// A byte-level BPE tokenizer with no merges: three special tokens, then one token per byte in
// GPT-2's byte-to-unicode alphabet (as many as the vocabulary holds).
ojson make_tokenizer(int64_t vocab) {
  const char* specials[] = {"<|pad|>", "<|bos|>", "<|eos|>"};
  ojson added = ojson::array();
  ojson v = ojson::object();
  for (int i = 0; i < 3; ++i) {
    added.push_back({{"id", i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    v[specials[i]] = i;
  }
  for (uint32_t b = 0; b < 256 && 3 + static_cast<int64_t>(b) < vocab; ++b)
    v[utf8_of_codepoint(byte_level_codepoint(static_cast<uint8_t>(b)))] = 3 + b;
  ojson t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = added;
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  t["post_processor"] = nullptr;
  t["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", v},
                {"merges", ojson::array()}};
  return t;
}

}  // namespace

std::string_view hf_arch_name(HfArch a) {
  return architecture_info(a).cli_name;
}

std::optional<HfArch> parse_hf_arch(std::string_view s) {
  for (const auto& i : supported_architectures()) {
    if (s == i.cli_name) return i.arch;
  }
  return std::nullopt;
}

SyntheticHfResult write_synthetic_hf_model(const std::filesystem::path& dir,
                                           const SyntheticHfSpec& s) {
  validate(s);
  create_output_folder(dir);
  Writer w(s);
  const int64_t h = s.hidden_size, q = s.num_heads * s.head_dim, kv = s.num_kv_heads * s.head_dim;
  w.matrix("model.embed_tokens.weight", s.vocab_size, h, s.init_std);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    w.vector(p + "input_layernorm.weight", h, 1.0, 0.02, s.dtype);
    w.linear(p + "self_attn.q_proj.weight", q, h);
    w.linear(p + "self_attn.k_proj.weight", kv, h);
    w.linear(p + "self_attn.v_proj.weight", kv, h);
    w.linear(p + "self_attn.o_proj.weight", h, q);
    if (has_qkv_bias(s.arch)) {
      w.vector(p + "self_attn.q_proj.bias", q, 0.0, 0.02, s.dtype);
      w.vector(p + "self_attn.k_proj.bias", kv, 0.0, 0.02, s.dtype);
      w.vector(p + "self_attn.v_proj.bias", kv, 0.0, 0.02, s.dtype);
    }
    if (has_qk_norm(s.arch)) {
      w.vector(p + "self_attn.q_norm.weight", s.head_dim, 1.0, 0.02, s.dtype);
      w.vector(p + "self_attn.k_norm.weight", s.head_dim, 1.0, 0.02, s.dtype);
    }
    w.vector(p + "post_attention_layernorm.weight", h, 1.0, 0.02, s.dtype);
    const bool moe = is_moe(s.arch) && (s.arch != HfArch::kGlm4Moe || l >= s.first_k_dense_replace);
    if (!moe) {
      w.linear(p + "mlp.gate_proj.weight", s.intermediate_size, h);
      w.linear(p + "mlp.up_proj.weight", s.intermediate_size, h);
      w.linear(p + "mlp.down_proj.weight", h, s.intermediate_size);
      continue;
    }
    w.matrix(p + "mlp.gate.weight", s.num_experts, h, s.init_std);
    // GLM-4.5 keeps its routing bias in fp32 (as released checkpoints do).
    if (s.arch == HfArch::kGlm4Moe)
      w.vector(p + "mlp.gate.e_score_correction_bias", s.num_experts, 0.0, 0.1, DType::kF32);
    for (int64_t e = 0; e < s.num_experts; ++e) {
      const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
      w.linear(ep + "gate_proj.weight", s.moe_intermediate_size, h);
      w.linear(ep + "up_proj.weight", s.moe_intermediate_size, h);
      w.linear(ep + "down_proj.weight", h, s.moe_intermediate_size);
    }
    if (s.arch == HfArch::kGlm4Moe && s.n_shared_experts > 0) {
      const int64_t width = s.moe_intermediate_size * s.n_shared_experts;
      w.linear(p + "mlp.shared_experts.gate_proj.weight", width, h);
      w.linear(p + "mlp.shared_experts.up_proj.weight", width, h);
      w.linear(p + "mlp.shared_experts.down_proj.weight", h, width);
    }
  }
  w.vector("model.norm.weight", h, 1.0, 0.02, s.dtype);
  if (!s.tie_word_embeddings) w.linear("lm_head.weight", s.vocab_size, h);
  w.writer().set_metadata("format", "pt");

  SyntheticHfResult r;
  r.dir = dir;
  r.num_tensors = static_cast<int64_t>(w.writer().size());
  r.num_linears = w.linears();
  r.bytes = w.writer().data_bytes();
  w.writer().write(dir / "model.safetensors");
  write_file_atomic(dir / "config.json", make_config(s).dump(2) + "\n");
  const ojson gen = {
      {"_from_model_config", true}, {"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 0}};
  write_file_atomic(dir / "generation_config.json", gen.dump(2) + "\n");
  write_file_atomic(dir / "tokenizer.json", make_tokenizer(s.vocab_size).dump(2) + "\n");
  const ojson tcfg = {
      {"bos_token", "<|bos|>"},
      {"eos_token", "<|eos|>"},
      {"pad_token", "<|pad|>"},
      {"model_max_length", 4096},
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"chat_template",
       "{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
       "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"}};
  write_file_atomic(dir / "tokenizer_config.json", tcfg.dump(2) + "\n");
  return r;
}

}  // namespace exl3
