// Synthetic checkpoint writer. Any int16 words form a valid tail-biting trellis (every window of
// the circular bitstream is a state), so uniformly random words are a valid EXL3 tensor.
#include "exl3/format/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/file_io.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3 {

namespace {

class Builder {
 public:
  Builder(const SyntheticSpec& spec) : spec_(spec), rng_(spec.seed) {}

  // An EXL3 linear in -> out, its stored output padded to a multiple of 128 as the converter pads
  // it (MLA's kv_a_proj_with_mqa: kv_lora_rank + qk_rope_head_dim outputs), and its input too
  // where the model asks for it (gpt-oss's 2880 channels); `bias`: an fp16 bias of the stored
  // width, as the converter writes one.
  void exl3_linear(const std::string& prefix, int64_t in, int64_t out, int bits,
                   bool bias = false) {
    if (in % 128 != 0 && !spec_.gpt_oss)
      fail("synthetic checkpoint: {} has {} inputs, a multiple of 128 is needed", prefix, in);
    in = (in + 127) / 128 * 128;
    out = (out + 127) / 128 * 128;
    if (bias) f16_tensor(prefix + ".bias", {out}, 0.02);
    std::vector<uint16_t> trellis(static_cast<size_t>(in / 16 * (out / 16) * 16 * bits));
    // Four words per draw: the largest models hold billions of words, and their bits are only
    // required to be uniform.
    for (size_t i = 0; i < trellis.size(); i += 4) {
      uint64_t r = rng_();
      for (size_t j = i; j < std::min(i + 4, trellis.size()); ++j, r >>= 16)
        trellis[j] = static_cast<uint16_t>(r);
    }
    writer_.add<uint16_t>(prefix + ".trellis", DType::kI16, {in / 16, out / 16, 16 * bits},
                          trellis);
    writer_.add<uint16_t>(prefix + ".suh", DType::kF16, {in},
                          scales(in, 1.0 / (1.24 * std::sqrt(static_cast<double>(in)))));
    writer_.add<uint16_t>(prefix + ".svh", DType::kF16, {out}, scales(out, 1.0));
    if (spec_.codebook != trellis::Codebook::k3Inst) {
      const bool mcg = spec_.codebook == trellis::Codebook::kMcg;
      const int32_t marker = mcg ? trellis::kMcgMarker : trellis::kMul1Marker;
      writer_.add<int32_t>(prefix + (mcg ? ".mcg" : ".mul1"), DType::kI32, {},
                           std::span<const int32_t>(&marker, 1));
    }
    ++linears_;
  }

  void bf16_tensor(const std::string& name, std::vector<int64_t> shape, double scale,
                   double offset = 0.0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = trellis::float_to_bf16(static_cast<float>(offset + scale * nd(rng_)));
    writer_.add<uint16_t>(name, DType::kBF16, std::move(shape), v);
  }

  void f16_tensor(const std::string& name, std::vector<int64_t> shape, double scale) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = trellis::float_to_half(static_cast<float>(scale * nd(rng_)));
    writer_.add<uint16_t>(name, DType::kF16, std::move(shape), v);
  }

  SafetensorsWriter& writer() { return writer_; }
  int64_t linears() const { return linears_; }
  std::mt19937_64& rng() { return rng_; }

 private:
  // Random signs times log-normal magnitudes around `base`, as fp16 bits.
  std::vector<uint16_t> scales(int64_t n, double base) {
    std::normal_distribution<double> nd(0.0, 0.25);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) {
      const double sign = (rng_() & 1u) ? -1.0 : 1.0;
      x = trellis::float_to_half(static_cast<float>(sign * base * std::exp(nd(rng_))));
    }
    return v;
  }

  const SyntheticSpec& spec_;
  std::mt19937_64 rng_;
  SafetensorsWriter writer_;
  int64_t linears_ = 0;
};

bool is_mla(const SyntheticSpec& s) {
  return s.kv_lora_rank > 0;
}

// The gpt-oss keys transformers' GptOssConfig reads (RoPE: its YaRN default).
void add_gpt_oss_config(const SyntheticSpec& s, nlohmann::json& c) {
  c["architectures"] = {"GptOssForCausalLM"};
  c["model_type"] = "gpt_oss";
  c["num_local_experts"] = s.num_experts;
  c["num_experts_per_tok"] = s.experts_per_tok;
  c["intermediate_size"] = s.moe_intermediate_size;
  c["sliding_window"] = s.sliding_window;
  c["attention_bias"] = true;
  c["rope_theta"] = 150000.0;
  c["swiglu_limit"] = 7.0;
  nlohmann::json types = nlohmann::json::array();
  for (int64_t l = 0; l < s.num_layers; ++l)
    types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  c["layer_types"] = types;
}

bool is_qwen3_next(const SyntheticSpec& s) {
  return s.linear_num_value_heads > 0;
}
bool is_linear_layer(const SyntheticSpec& s, int64_t l) {
  return is_qwen3_next(s) && (l + 1) % s.full_attention_interval != 0;
}

// The Qwen3-Next keys transformers' Qwen3NextConfig reads.
void add_qwen3_next_config(const SyntheticSpec& s, nlohmann::json& c) {
  c["architectures"] = {"Qwen3NextForCausalLM"};
  c["model_type"] = "qwen3_next";
  c["num_experts"] = s.num_experts;
  c["num_experts_per_tok"] = s.experts_per_tok;
  c["moe_intermediate_size"] = s.moe_intermediate_size;
  c["shared_expert_intermediate_size"] = s.shared_expert_intermediate_size;
  c["norm_topk_prob"] = true;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = nlohmann::json::array();
  c["linear_num_key_heads"] = s.linear_num_key_heads;
  c["linear_num_value_heads"] = s.linear_num_value_heads;
  c["linear_key_head_dim"] = s.linear_key_head_dim;
  c["linear_value_head_dim"] = s.linear_value_head_dim;
  c["linear_conv_kernel_dim"] = s.linear_conv_kernel;
  nlohmann::json types = nlohmann::json::array();
  for (int64_t l = 0; l < s.num_layers; ++l)
    types.push_back(is_linear_layer(s, l) ? "linear_attention" : "full_attention");
  c["layer_types"] = types;
  c.erase("rope_theta");
  c["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", 10000000.0},
                          {"partial_rotary_factor", s.partial_rotary_factor}};
}

// The DeepSeek-V3 keys transformers' DeepseekV3Config reads.
void add_deepseek_config(const SyntheticSpec& s, nlohmann::json& c) {
  c["architectures"] = {"DeepseekV3ForCausalLM"};
  c["model_type"] = "deepseek_v3";
  c["q_lora_rank"] = s.q_lora_rank;
  c["kv_lora_rank"] = s.kv_lora_rank;
  c["qk_nope_head_dim"] = s.qk_nope_head_dim;
  c["qk_rope_head_dim"] = s.qk_rope_head_dim;
  c["v_head_dim"] = s.v_head_dim;
  c["head_dim"] = s.qk_rope_head_dim;
  c["num_key_value_heads"] = s.num_heads;
  c["n_routed_experts"] = s.num_experts;
  c["num_experts_per_tok"] = s.experts_per_tok;
  c["moe_intermediate_size"] = s.moe_intermediate_size;
  c["n_shared_experts"] = s.n_shared_experts;
  c["first_k_dense_replace"] = s.first_k_dense_replace;
  c["n_group"] = s.n_group;
  c["topk_group"] = s.topk_group;
  c["routed_scaling_factor"] = 2.5;
  c["norm_topk_prob"] = true;
  c["topk_method"] = "noaux_tc";
  c["scoring_func"] = "sigmoid";
  c["rope_interleave"] = true;
  c["attention_bias"] = false;
}

nlohmann::json make_config(const SyntheticSpec& s, int64_t padded_vocab) {
  const bool moe = s.num_experts > 0;
  nlohmann::json c = {{"architectures", {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"}},
                      {"model_type", moe ? "qwen3_moe" : "qwen3"},
                      {"hidden_size", s.hidden_size},
                      {"intermediate_size", s.intermediate_size},
                      {"num_hidden_layers", s.num_layers},
                      {"num_attention_heads", s.num_heads},
                      {"num_key_value_heads", s.num_kv_heads},
                      {"head_dim", s.head_dim},
                      {"vocab_size", padded_vocab},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"max_position_embeddings", s.max_position_embeddings},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", false},
                      {"torch_dtype", "bfloat16"}};
  if (s.gpt_oss) {
    add_gpt_oss_config(s, c);
  } else if (is_qwen3_next(s)) {
    add_qwen3_next_config(s, c);
  } else if (is_mla(s)) {
    add_deepseek_config(s, c);
  } else if (moe) {
    c["num_experts"] = s.num_experts;
    c["num_experts_per_tok"] = s.experts_per_tok;
    c["moe_intermediate_size"] = s.moe_intermediate_size;
    c["norm_topk_prob"] = true;
  }
  c["quantization_config"] = {{"quant_method", "exl3"},
                              {"version", "exl3-synthetic"},
                              {"bits", s.bits},
                              {"head_bits", s.head_bits},
                              {"calibration", {{"rows", 0}, {"cols", 0}}},
                              {"out_scales", "always"},
                              {"codebook", trellis::codebook_name(s.codebook)}};
  return c;
}

}  // namespace

SyntheticResult write_synthetic_checkpoint(const std::filesystem::path& dir,
                                           const SyntheticSpec& s) {
  if (!trellis::valid_bits(s.bits) || !trellis::valid_bits(s.head_bits)) {
    fail("synthetic checkpoint: bits {} / head bits {} must be in 1..8", s.bits, s.head_bits);
  }
  create_output_folder(dir);
  Builder b(s);
  const int64_t h = s.hidden_size, q = s.num_heads * s.head_dim, kv = s.num_kv_heads * s.head_dim;
  const int64_t vocab = (s.vocab_size + 127) / 128 * 128;
  b.bf16_tensor("model.embed_tokens.weight", {vocab, h}, 0.05);
  const bool biased = s.gpt_oss;  // gpt-oss: biases on attention and experts
  const auto mlp = [&](const std::string& p, int64_t inter) {
    b.exl3_linear(p + "gate_proj", h, inter, s.bits, biased);
    b.exl3_linear(p + "up_proj", h, inter, s.bits, biased);
    b.exl3_linear(p + "down_proj", inter, h, s.bits, biased);
  };
  // Qwen3-Next's RMSNorms scale by (1 + w): weights around 0 give the same scale as others' 1.
  const double norm_center = is_qwen3_next(s) ? 0.0 : 1.0;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    b.bf16_tensor(p + "input_layernorm.weight", {h}, 0.02, norm_center);
    b.bf16_tensor(p + "post_attention_layernorm.weight", {h}, 0.02, norm_center);
    if (is_linear_layer(s, l)) {
      const std::string a = p + "linear_attn.";
      const int64_t kd = s.linear_num_key_heads * s.linear_key_head_dim,
                    vd = s.linear_num_value_heads * s.linear_value_head_dim,
                    nv = s.linear_num_value_heads;
      b.exl3_linear(a + "in_proj_qkvz", h, 2 * kd + 2 * vd, s.bits);
      b.bf16_tensor(a + "in_proj_ba.weight", {2 * nv, h}, 1.0 / std::sqrt(static_cast<double>(h)));
      b.bf16_tensor(a + "conv1d.weight", {2 * kd + vd, 1, s.linear_conv_kernel}, 0.3);
      b.bf16_tensor(a + "A_log", {nv}, 0.5);
      b.bf16_tensor(a + "dt_bias", {nv}, 0.5, 1.0);
      b.bf16_tensor(a + "norm.weight", {s.linear_value_head_dim}, 0.02, 1.0);
      b.exl3_linear(a + "out_proj", vd, h, s.bits);
    } else if (is_qwen3_next(s)) {  // gated attention: q_proj writes [query, gate] per head
      b.bf16_tensor(p + "self_attn.q_norm.weight", {s.head_dim}, 0.02, 0.0);
      b.bf16_tensor(p + "self_attn.k_norm.weight", {s.head_dim}, 0.02, 0.0);
      b.exl3_linear(p + "self_attn.q_proj", h, 2 * q, s.bits);
      b.exl3_linear(p + "self_attn.k_proj", h, kv, s.bits);
      b.exl3_linear(p + "self_attn.v_proj", h, kv, s.bits);
      b.exl3_linear(p + "self_attn.o_proj", q, h, s.bits);
    } else if (is_mla(s)) {
      const int64_t qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
      b.exl3_linear(p + "self_attn.q_a_proj", h, s.q_lora_rank, s.bits);
      b.bf16_tensor(p + "self_attn.q_a_layernorm.weight", {s.q_lora_rank}, 0.02, 1.0);
      b.exl3_linear(p + "self_attn.q_b_proj", s.q_lora_rank, s.num_heads * qk, s.bits);
      b.exl3_linear(p + "self_attn.kv_a_proj_with_mqa", h, s.kv_lora_rank + s.qk_rope_head_dim,
                    s.bits);
      b.bf16_tensor(p + "self_attn.kv_a_layernorm.weight", {s.kv_lora_rank}, 0.02, 1.0);
      b.bf16_tensor(p + "self_attn.kv_b_proj.weight",
                    {s.num_heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank},
                    1.0 / std::sqrt(static_cast<double>(s.kv_lora_rank)));
      b.exl3_linear(p + "self_attn.o_proj", s.num_heads * s.v_head_dim, h, s.bits);
    } else {
      if (s.gpt_oss) {
        b.bf16_tensor(p + "self_attn.sinks", {s.num_heads}, 1.0);
      } else {
        b.bf16_tensor(p + "self_attn.q_norm.weight", {s.head_dim}, 0.02, 1.0);
        b.bf16_tensor(p + "self_attn.k_norm.weight", {s.head_dim}, 0.02, 1.0);
      }
      b.exl3_linear(p + "self_attn.q_proj", h, q, s.bits, biased);
      b.exl3_linear(p + "self_attn.k_proj", h, kv, s.bits, biased);
      b.exl3_linear(p + "self_attn.v_proj", h, kv, s.bits, biased);
      b.exl3_linear(p + "self_attn.o_proj", q, h, s.bits, biased);
    }
    if (s.gpt_oss) {
      b.bf16_tensor(p + "mlp.router.weight", {s.num_experts, h}, 0.05);
      b.bf16_tensor(p + "mlp.router.bias", {s.num_experts}, 0.05);
      for (int64_t e = 0; e < s.num_experts; ++e)
        mlp(fmt::format("{}mlp.experts.{}.", p, e), s.moe_intermediate_size);
    } else if (s.num_experts > 0 && l >= s.first_k_dense_replace) {
      b.f16_tensor(p + "mlp.gate.weight", {s.num_experts, h}, 0.05);
      if (is_mla(s)) b.f16_tensor(p + "mlp.gate.e_score_correction_bias", {s.num_experts}, 0.01);
      for (int64_t e = 0; e < s.num_experts; ++e)
        mlp(fmt::format("{}mlp.experts.{}.", p, e), s.moe_intermediate_size);
      if (s.n_shared_experts > 0)
        mlp(p + "mlp.shared_experts.", s.moe_intermediate_size * s.n_shared_experts);
      if (is_qwen3_next(s) && s.shared_expert_intermediate_size > 0) {
        mlp(p + "mlp.shared_expert.", s.shared_expert_intermediate_size);
        b.bf16_tensor(p + "mlp.shared_expert_gate.weight", {1, h}, 0.05);
      }
    } else {
      mlp(p + "mlp.", s.intermediate_size);
    }
  }
  b.bf16_tensor("model.norm.weight", {h}, 0.02, norm_center);
  b.exl3_linear("lm_head", h, vocab, s.head_bits);
  b.writer().set_metadata("format", "pt");
  b.writer().set_metadata("producer", "exl3 synthetic (random valid trellis; not a trained model)");

  SyntheticResult res;
  res.model_file = dir / "model.safetensors";
  res.num_exl3_linears = b.linears();
  res.bytes = b.writer().data_bytes();
  b.writer().write(res.model_file);
  write_file_atomic(dir / "config.json", make_config(s, vocab).dump(2) + "\n");

  SafetensorsWriter in;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(s.input_rows * h));
  for (auto& v : x) v = trellis::float_to_half(nd(b.rng()));
  in.add<uint16_t>("x", DType::kF16, {s.input_rows, h}, x);
  res.input_file = dir / "sample_input.safetensors";
  in.write(res.input_file);
  return res;
}

}  // namespace exl3
