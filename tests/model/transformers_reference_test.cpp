// Families against transformers' own forward, on tiny random checkpoints whose fp64 logits are
// committed beside them (tests/model/data/make_*.py, transformers 5.17):
//   mistral_window     MistralForCausalLM with a sliding window of 8 over 40 positions
//   mixtral            MixtralForCausalLM: the same window, 4 experts (top 2, renormalised) under
//                      block_sparse_moe with w1/w3/w2 names, widths 128
//   deepseek_v3_qlora  DeepseekV3ForCausalLM: q LoRA, interleaved RoPE, 4 expert groups (2 kept)
//   deepseek_v3_yarn   plain q_proj, half-split RoPE with DeepSeek's yarn (mscale) over 40
//                      positions against original_max_position_embeddings 16, 2 groups (1 kept)
//   glm_moe_dsa        GlmMoeDsaForCausalLM (GLM-5): MLA plus DSA indexers keeping 12 of up to 40
//                      positions, full / shared indexer layers, mlp_layer_types
//   deepseek_v32       DeepseekV32ForCausalLM: an indexer in every layer with half-split RoPE,
//                      DeepSeek's yarn, 4 expert groups (2 kept)
//   deepseek_v3_q128   DeepSeek-V3 with hidden and expert widths of 128 (what the conversion test
//                      quantizes: EXL3 experts are not padded)
//   glm_moe_dsa_q128   GLM-5 likewise, 384 ids (the calibrated conversion test's tokenizer)
//   gemma3             Gemma3ForCausalLM: sliding (window 8) and full layers with their own RoPE,
//                      query_pre_attn_scalar 48 for head_dim 32, final logit soft-capping (the
//                      attention's is set too, and unused as in transformers), sandwich norms,
//                      GeGLU, the scaled and tied embedding
//   gpt_oss            GptOssForCausalLM: a sliding (window 8) and a full layer, attention sinks,
//                      q/k/v/o biases, YaRN over 16 original positions, 4 fused experts (top 2)
//                      with biases and the clamped SwiGLU (limit 1.5, clamping about a tenth of
//                      the values), bf16 weights (transformers 5.24)
//   gpt_oss_mxfp4      one such layer with its experts stored MXFP4 (`*_blocks`, `*_scales`),
//                      against transformers' own dequantization on the CPU
//   minimax_m2         MiniMaxM2ForCausalLM: q/k norms across all 4 heads, RoPE on half of each
//                      head, a sigmoid router (top 2 of 8) whose e_score_correction_bias changes
//                      the choice, Mixtral's expert names (made on the device, transformers 5.17)
//   qwen3_next         Qwen3NextForCausalLM: three gated DeltaNet layers (2 key heads serving 4
//                      value heads, conv width 4) around one gated full-attention layer (partial
//                      rotary, (1 + w) q/k norms), experts with a sigmoid-gated shared expert and
//                      one dense layer, 80 positions (more than one 64-token chunk of transformers'
//                      chunked delta rule; transformers 5.25, CPU torch)
//   qwen3_5_moe        Qwen3_5MoeForCausalLM: the same layers with the DeltaNet's four split input
//   qwen3_5            projections, Qwen3-VL's multimodal RoPE sections (plain RoPE for text); MoE
//                      in every layer / Qwen3_5ForCausalLM's dense MLPs (same script)
//   kimi_linear        KimiLinearForCausalLM: three Kimi delta attention layers (per-channel
//                      decay, sigmoid output gate, separate q/k/v convolutions) around one MLA
//                      layer without RoPE, a dense first layer, grouped sigmoid routing (2 of 8
//                      experts in the best of 2 groups) with shared experts, config keys by their
//                      aliases
// The first two were made on the device, the others with CPU torch (same transformers 5.17).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <utility>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/model/tp_plan.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/speculative.hpp"
#include "runtime_test_util.hpp"
#include "test_support.hpp"

namespace exl3::model {
namespace {

using ::testing::HasSubstr;
namespace rt = exl3::runtime;

std::filesystem::path data_dir(const std::string& name) {
  return std::filesystem::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / name;
}

struct Reference {
  std::vector<int32_t> ids;
  std::vector<double> logits;
  size_t vocab = 0;
};

Reference load_reference(const std::filesystem::path& dir) {
  const auto store = TensorStore::open(dir / "reference_logits.safetensors");
  Reference r;
  for (const int64_t id : copy_tensor<int64_t>(store.at("ids")))
    r.ids.push_back(static_cast<int32_t>(id));
  r.logits = read_as_double(store.at("logits"));
  r.vocab = static_cast<size_t>(store.at("logits").info->shape[1]);
  return r;
}

int argmax_of(std::span<const double> row) {
  return static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
}

class Transformers : public ::testing::TestWithParam<const char*> {};

TEST_P(Transformers, MatchesFp64AndDecodesAtEveryTp) {
  const auto dir = data_dir(GetParam());
  const auto ref = load_reference(dir);
  auto engine = rt::load_engine(dir);
  const auto got = rt::forward_logits(*engine, ref.ids);
  ASSERT_EQ(got.size(), ref.logits.size());
  const double err = exl3::test::rel_l2(got, ref.logits);
  std::printf("%s: fp32 CPU engine vs transformers fp64 rel-L2 %.3e\n", GetParam(), err);
  EXPECT_LE(err, 1e-5);  // measured 3.6e-7 and 3.8e-7 (fp32 arithmetic, fp32 routing in both)
  for (size_t t = 0; t < ref.ids.size(); ++t) {
    const std::vector<double> g(got.begin() + static_cast<std::ptrdiff_t>(t * ref.vocab),
                                got.begin() + static_cast<std::ptrdiff_t>((t + 1) * ref.vocab));
    EXPECT_EQ(argmax_of(g),
              argmax_of(std::span<const double>(ref.logits).subspan(t * ref.vocab, ref.vocab)))
        << "position " << t;
  }
  // Decode steps read the latent cache (normed latent + roped key part) of earlier steps.
  const auto inc = rt::test::prefill_then_decode(*engine, ref.ids, 25);
  EXPECT_LE(exl3::test::rel_l2(inc, got), 1e-6);
  // Tensor parallelism cuts attention by heads (MLA: 4 heads, 2+2, 2+1+1, 1 each, the latent path,
  // the DSA indexer and the latent cache replicated; Mistral's GQA as its plan says) and the
  // unquantized MLPs and experts by channels. MLA measured 3.4e-7 to 4.2e-7 from TP 1 (fp32 sums in
  // another order). MiniMax-M2's q/k norms span every head, so head-parallel ranks are refused.
  const auto spec = describe_model(Checkpoint::open(dir));
  const auto* gqa = std::get_if<GqaAttentionSpec>(&spec.layers[0].attention);
  const bool across_heads = gqa != nullptr && gqa->qk_norm == QkNorm::kAcrossHeads;
  for (const int tp : {2, 3, 4}) {
    rt::EngineOptions o;
    o.tp = tp;
    if (across_heads) {
      EXPECT_THAT(rt::test::error_of([&] { (void)rt::load_engine(dir, o); }),
                  HasSubstr("normalise all 4 heads of a token together (MiniMax-M2)"))
          << "TP " << tp;
      continue;
    }
    auto sliced = rt::load_engine(dir, o);
    EXPECT_LE(exl3::test::rel_l2(rt::forward_logits(*sliced, ref.ids), got), 1e-5) << "TP " << tp;
    EXPECT_LE(exl3::test::rel_l2(rt::test::prefill_then_decode(*sliced, ref.ids, 25), got), 1e-5)
        << "TP " << tp << " decode";
  }
}

INSTANTIATE_TEST_SUITE_P(Model, Transformers,
                         ::testing::Values("deepseek_v3_qlora", "deepseek_v3_yarn", "glm_moe_dsa",
                                           "deepseek_v32", "mistral_window", "deepseek_v3_q128",
                                           "glm_moe_dsa_q128", "mixtral", "gemma3", "gpt_oss",
                                           "gpt_oss_mxfp4", "minimax_m2"));

// The window matters: without it the Mistral model is far from its reference.
TEST(Mistral, SlidingWindowChangesTheResult) {
  const auto src = data_dir("mistral_window");
  const ModelSpec s = describe_model(Checkpoint::open(src));
  EXPECT_EQ(s.architecture, Architecture::kMistral);
  EXPECT_EQ(std::get<GqaAttentionSpec>(s.layers[0].attention).sliding_window, 8);
  const auto ref = load_reference(src);
  exl3::test::TempDir tmp;
  for (const auto& e : std::filesystem::directory_iterator(src))
    std::filesystem::copy_file(e.path(), tmp.path() / e.path().filename());
  auto cfg = nlohmann::json::parse(exl3::test::read_file(src / "config.json"));
  cfg["sliding_window"] = nullptr;
  exl3::test::write_file(tmp.path() / "config.json", cfg.dump(2));
  auto full = rt::load_engine(tmp.path());
  const double err = exl3::test::rel_l2(rt::forward_logits(*full, ref.ids), ref.logits);
  std::printf("mistral_window without its window: rel-L2 %.3e from the reference\n", err);
  EXPECT_GT(err, 1e-2);
}

// Gemma 3: the description follows Gemma3TextConfig, and each trait the reference exercises
// moves the logits when it is taken away (so the test above checks every one of them).
TEST(Gemma3, DescribedAsGemma3TextConfigReadsIt) {
  const auto src = data_dir("gemma3");
  const ModelSpec s = describe_model(Checkpoint::open(src));
  EXPECT_EQ(s.architecture, Architecture::kGemma3);
  EXPECT_TRUE(s.lm_head_tied);
  EXPECT_TRUE(s.norm_unit_offset);
  EXPECT_TRUE(s.scale_embedding);
  EXPECT_DOUBLE_EQ(s.final_logit_softcapping, 3.0);
  ASSERT_EQ(s.layers.size(), 4u);
  for (const auto& l : s.layers) {
    const auto& a = std::get<GqaAttentionSpec>(l.attention);
    const bool full = l.index == 2;
    EXPECT_EQ(a.sliding_window, full ? 0 : 8) << l.index;
    EXPECT_DOUBLE_EQ(a.rope.theta, full ? 50000.0 : 10000.0) << l.index;
    EXPECT_EQ(a.rope.type, full ? RopeType::kLinear : RopeType::kDefault) << l.index;
    EXPECT_DOUBLE_EQ(a.scale, 1.0 / std::sqrt(48.0));
    EXPECT_EQ(a.qk_norm, QkNorm::kPerHead);
    EXPECT_EQ(l.post_attention_norm, l.prefix + ".pre_feedforward_layernorm.weight");
    EXPECT_EQ(l.attention_output_norm, l.prefix + ".post_attention_layernorm.weight");
    EXPECT_EQ(l.mlp_output_norm, l.prefix + ".post_feedforward_layernorm.weight");
    EXPECT_EQ(std::get<DenseMlpSpec>(l.mlp).activation, Activation::kGeluTanh);
  }
  // The embedding scale is cast to the weight's dtype first, as transformers does.
  EXPECT_EQ(embedding_scale(s, DType::kBF16), 11.3125f);
  EXPECT_EQ(embedding_scale(s, DType::kF32), static_cast<float>(std::sqrt(128.0)));

  auto cfg = nlohmann::json::parse(exl3::test::read_file(src / "config.json"));
  // Without layer_types every sliding_window_pattern-th layer is full; the legacy rope keys
  // (rope_theta + rope_scaling for full layers, rope_local_base_freq for sliding ones) and the
  // config's defaults apply.
  nlohmann::json legacy = cfg;
  for (const char* k : {"layer_types", "rope_parameters", "head_dim", "query_pre_attn_scalar",
                        "tie_word_embeddings", "sliding_window", "num_key_value_heads"})
    legacy.erase(k);
  legacy["sliding_window_pattern"] = 2;
  legacy["rope_theta"] = 20000.0;
  legacy["rope_local_base_freq"] = 5000.0;
  legacy["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  legacy["num_attention_heads"] = 8;
  const ModelSpec d = describe_model(rt::test::config_of(legacy), "m/config.json");
  EXPECT_TRUE(d.tie_word_embeddings);
  for (const auto& l : d.layers) {
    const auto& a = std::get<GqaAttentionSpec>(l.attention);
    const bool full = l.index % 2 == 1;
    EXPECT_EQ(a.sliding_window, full ? 0 : 4096) << l.index;
    EXPECT_DOUBLE_EQ(a.rope.theta, full ? 20000.0 : 5000.0) << l.index;
    EXPECT_DOUBLE_EQ(a.rope.factor, full ? 8.0 : 1.0) << l.index;
    EXPECT_EQ(a.head_dim, 256);
    EXPECT_EQ(a.num_kv_heads, 4);
    EXPECT_DOUBLE_EQ(a.scale, 1.0 / 16.0);
  }
  // What the runtime does not compute is refused, naming the key.
  auto refused = [&](const char* key, const nlohmann::json& value, const char* what) {
    nlohmann::json c = cfg;
    c[key] = value;
    EXPECT_THAT([&] { describe_model(rt::test::config_of(c), "m/config.json"); },
                ::testing::ThrowsMessage<Error>(HasSubstr(what)))
        << key;
  };
  refused("use_bidirectional_attention", true, "use_bidirectional_attention");
  refused("hidden_activation", "gelu", "hidden_activation");
  refused("sliding_window", nullptr, "'sliding_window' is null");
  refused("layer_types", {"full_attention"}, "layer_types");
}

// A copy of a reference folder with config.json edited and, when `tensors` is given,
// model.safetensors rewritten through it; the rel-L2 of that model's logits from the unedited
// reference.
double moved_from_reference(
    const std::string& name, const std::function<void(nlohmann::json&)>& edit,
    const std::function<void(const std::string&, std::vector<float>&)>& tensors = nullptr) {
  const auto src = data_dir(name);
  const auto ref = load_reference(src);
  exl3::test::TempDir tmp;
  for (const auto& e : std::filesystem::directory_iterator(src))
    std::filesystem::copy_file(e.path(), tmp.path() / e.path().filename());
  auto cfg = nlohmann::json::parse(exl3::test::read_file(src / "config.json"));
  edit(cfg);
  exl3::test::write_file(tmp.path() / "config.json", cfg.dump(2));
  if (tensors) {
    const auto store = TensorStore::open(src / "model.safetensors");
    SafetensorsWriter w;
    for (const auto& n : store.names()) {
      std::vector<float> v = read_as_float(store.at(n));
      tensors(n, v);
      w.add<float>(n, DType::kF32, store.at(n).info->shape, v);
    }
    w.write(tmp.path() / "model.safetensors");
  }
  auto engine = rt::load_engine(tmp.path());
  return exl3::test::rel_l2(rt::forward_logits(*engine, ref.ids), ref.logits);
}

using ConfigEdit = std::function<void(nlohmann::json&)>;

// Each named config edit must move `name`'s logits away from its reference (printed, then checked
// above 1e-3), so the reference test sees every trait the edits take away.
void expect_each_edit_moves(const std::string& name,
                            std::span<const std::pair<const char*, ConfigEdit>> edits) {
  for (const auto& [what, edit] : edits) {
    const double err = moved_from_reference(name, edit);
    std::printf("%s with %s: rel-L2 %.3e from the reference\n", name.c_str(), what, err);
    EXPECT_GT(err, 1e-3) << what;
  }
}

TEST(Gemma3, EveryTraitChangesTheResult) {
  const std::pair<const char*, ConfigEdit> edits[] = {
      {"no window", [](auto& c) { c["sliding_window"] = 4096; }},
      {"no final soft-cap", [](auto& c) { c["final_logit_softcapping"] = nullptr; }},
      {"head_dim scale", [](auto& c) { c["query_pre_attn_scalar"] = 32; }},
      {"one RoPE",
       [](auto& c) {
         c["rope_parameters"]["full_attention"] = c["rope_parameters"]["sliding_attention"];
       }},
  };
  expect_each_edit_moves("gemma3", edits);
  // transformers' Gemma 3 never applies attn_logit_softcapping (Gemma 2 did): neither does exl3.
  const double err =
      moved_from_reference("gemma3", [](auto& c) { c["attn_logit_softcapping"] = nullptr; });
  EXPECT_LE(err, 1e-5);
}

// gpt-oss: the description follows GptOssConfig, and each trait the reference exercises moves the
// logits when it is taken away (so the reference test checks every one of them).
TEST(GptOss, DescribedAsGptOssConfigReadsIt) {
  const auto src = data_dir("gpt_oss");
  const ModelSpec s = describe_model(Checkpoint::open(src));
  EXPECT_EQ(s.architecture, Architecture::kGptOss);
  EXPECT_FALSE(s.lm_head_tied);
  ASSERT_EQ(s.layers.size(), 2u);
  for (const auto& l : s.layers) {
    const auto& a = std::get<GqaAttentionSpec>(l.attention);
    EXPECT_EQ(a.sliding_window, l.index == 0 ? 8 : 0) << l.index;
    EXPECT_TRUE(a.sinks);
    EXPECT_EQ(a.rope.type, RopeType::kYarn);
    EXPECT_DOUBLE_EQ(a.scale, 1.0 / std::sqrt(32.0));
    const auto& m = std::get<MoeSpec>(l.mlp);
    EXPECT_EQ(m.prefix, l.prefix + ".mlp");
    EXPECT_EQ(m.router_name, "router");
    EXPECT_TRUE(m.router_bias);
    EXPECT_TRUE(m.expert_bias);
    EXPECT_FALSE(m.plain_experts());
    EXPECT_EQ(m.num_experts, 4);
    EXPECT_EQ(m.top_k, 2);
    EXPECT_EQ(m.intermediate, 128);
    EXPECT_TRUE(m.renormalize);
    EXPECT_EQ(m.activation, Activation::kClampedSwiglu);
    EXPECT_DOUBLE_EQ(m.swiglu_alpha, 1.702);
    EXPECT_DOUBLE_EQ(m.swiglu_limit, 1.5);
  }
  // GptOssConfig's defaults: layers alternate from sliding, window 128, YaRN (factor 32 over 4096
  // original positions) at theta 150000, 8 kv heads of 64 channels, limit 7.
  auto cfg = nlohmann::json::parse(exl3::test::read_file(src / "config.json"));
  nlohmann::json bare = cfg;
  for (const char* k : {"layer_types", "sliding_window", "rope_parameters", "head_dim",
                        "num_key_value_heads", "swiglu_alpha", "swiglu_limit", "rms_norm_eps"})
    bare.erase(k);
  bare["num_hidden_layers"] = 3;
  bare["num_attention_heads"] = 16;
  const ModelSpec d = describe_model(rt::test::config_of(bare), "m/config.json");
  ASSERT_EQ(d.layers.size(), 3u);
  for (const auto& l : d.layers) {
    const auto& a = std::get<GqaAttentionSpec>(l.attention);
    EXPECT_EQ(a.sliding_window, l.index % 2 == 0 ? 128 : 0) << l.index;
    EXPECT_EQ(a.head_dim, 64);
    EXPECT_EQ(a.num_kv_heads, 8);
    EXPECT_EQ(a.rope.type, RopeType::kYarn);
    EXPECT_DOUBLE_EQ(a.rope.theta, 150000.0);
    EXPECT_DOUBLE_EQ(a.rope.factor, 32.0);
    EXPECT_DOUBLE_EQ(std::get<MoeSpec>(l.mlp).swiglu_limit, 7.0);
    EXPECT_DOUBLE_EQ(std::get<MoeSpec>(l.mlp).swiglu_alpha, 1.702);
  }
  EXPECT_DOUBLE_EQ(d.rms_norm_eps, 1e-5);
  // The released config.json files name their YaRN rope_scaling, beside rope_theta.
  bare["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0},
                          {"beta_fast", 32.0},   {"beta_slow", 1.0},
                          {"truncate", false},   {"original_max_position_embeddings", 4096}};
  bare["rope_theta"] = 20000.0;
  const ModelSpec r = describe_model(rt::test::config_of(bare), "m/config.json");
  const RopeSpec& legacy = std::get<GqaAttentionSpec>(r.layers[0].attention).rope;
  EXPECT_DOUBLE_EQ(legacy.factor, 8.0);
  EXPECT_DOUBLE_EQ(legacy.theta, 20000.0);
  // What the runtime does not compute is refused, naming the key.
  auto refused = [&](const char* key, const nlohmann::json& value, const char* what) {
    nlohmann::json c = cfg;
    c[key] = value;
    EXPECT_THAT([&] { describe_model(rt::test::config_of(c), "m/config.json"); },
                ::testing::ThrowsMessage<Error>(HasSubstr(what)))
        << key;
  };
  refused("sliding_window", nullptr, "'sliding_window' is null");
  refused("layer_types", {"full_attention"}, "layer_types");
  refused("layer_types", {"full_attention", "chunked_attention"}, "chunked_attention");
  refused("swiglu_limit", 0.0, "swiglu_limit");
  refused("hidden_act", "gelu", "hidden_act");
  refused("num_experts_per_tok", 5, "num_experts_per_tok");
}

TEST(GptOss, EveryTraitChangesTheResult) {
  using Json = nlohmann::json;
  const std::pair<const char*, ConfigEdit> edits[] = {
      {"no window", [](Json& c) { c["sliding_window"] = 4096; }},
      {"no clamp", [](Json& c) { c["swiglu_limit"] = 1e6; }},
      {"alpha 1", [](Json& c) { c["swiglu_alpha"] = 1.0; }},
      {"plain RoPE",
       [](Json& c) {
         c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
       }},
      {"top 1", [](Json& c) { c["num_experts_per_tok"] = 1; }},
  };
  expect_each_edit_moves("gpt_oss", edits);
  // The sinks and the biases live in the checkpoint: taking each away moves the logits too.
  const std::pair<const char*, const char*> tensors[] = {{"no sinks", ".sinks"},
                                                         {"no router bias", "router.bias"},
                                                         {"no expert biases", "_proj_bias"},
                                                         {"no attention biases", "_proj.bias"}};
  for (const auto& [what, suffix] : tensors) {
    const double err = moved_from_reference(
        "gpt_oss", [](Json&) {},
        [suffix = std::string(suffix)](const std::string& n, std::vector<float>& v) {
          // A sink of -inf takes no weight; a bias of 0 adds nothing.
          if (n.ends_with(suffix))
            std::fill(v.begin(), v.end(), suffix == ".sinks" ? -1e30f : 0.0f);
        });
    std::printf("gpt_oss with %s: rel-L2 %.3e from the reference\n", what, err);
    EXPECT_GT(err, 1e-3) << what;
  }
}

// Mixtral: its MoE under Mixtral's names, and the router's renormalisation matters.
TEST(Mixtral, DescribedWithItsExpertNamesAndRenormalisedRouter) {
  const auto src = data_dir("mixtral");
  const ModelSpec s = describe_model(Checkpoint::open(src));
  EXPECT_EQ(s.architecture, Architecture::kMixtral);
  EXPECT_EQ(std::get<GqaAttentionSpec>(s.layers[0].attention).sliding_window, 8);
  const auto& moe = std::get<MoeSpec>(s.layers[1].mlp);
  EXPECT_EQ(moe.prefix, "model.layers.1.block_sparse_moe");
  EXPECT_EQ(moe.expert_proj[0], "w1");
  EXPECT_EQ(moe.expert_proj[1], "w3");
  EXPECT_EQ(moe.expert_proj[2], "w2");
  EXPECT_EQ(moe.num_experts, 4);
  EXPECT_EQ(moe.top_k, 2);
  EXPECT_EQ(moe.intermediate, 128);
  EXPECT_TRUE(moe.renormalize);
  // EXL3 experts must be named as the family names them (a checkpoint converted for another
  // architecture is refused, naming both spellings).
  moe::MoeLayout mlp_named;
  mlp_named.label = "ckpt";
  EXPECT_NO_THROW(
      moe::check_expert_naming(mlp_named, "mlp", {"gate_proj", "up_proj", "down_proj"}, "cfg"));
  EXPECT_THAT(rt::test::error_of(
                  [&] { moe::check_expert_naming(mlp_named, moe.block, moe.expert_proj, "cfg"); }),
              HasSubstr("'block_sparse_moe.experts.{E}.{w1,w3,w2}', but the checkpoint's EXL3 "
                        "experts (ckpt) are 'mlp.experts.{E}.{gate_proj,up_proj,down_proj}'"));
}

// MiniMax-M2: the description, each trait moving the logits when taken away, and the original
// code's config keys refused where they disagree with what transformers computes.
TEST(MiniMaxM2, DescribedAndEveryTraitChangesTheResult) {
  using Json = nlohmann::json;
  const auto src = data_dir("minimax_m2");
  const ModelSpec s = describe_model(Checkpoint::open(src));
  EXPECT_EQ(s.architecture, Architecture::kMiniMaxM2);
  for (const auto& l : s.layers) {
    const auto& a = std::get<GqaAttentionSpec>(l.attention);
    EXPECT_EQ(a.qk_norm, QkNorm::kAcrossHeads);
    EXPECT_EQ(a.rope.rotary_dim, 16);  // head_dim 32 x partial_rotary_factor 0.5
    EXPECT_EQ(a.sliding_window, 0);
    const auto& m = std::get<MoeSpec>(l.mlp);
    EXPECT_EQ(m.prefix, l.prefix + ".block_sparse_moe");
    EXPECT_EQ(m.expert_proj[0], "w1");
    EXPECT_EQ(m.router, RouterKind::kSigmoidGrouped);
    EXPECT_EQ(m.n_group, 1);
    EXPECT_TRUE(m.correction_bias);
    EXPECT_EQ(m.correction_bias_name, "e_score_correction_bias");
    EXPECT_TRUE(m.renormalize);
    EXPECT_FALSE(m.shared.has_value());
    EXPECT_EQ(m.num_experts, 8);
    EXPECT_EQ(m.top_k, 2);
  }
  const std::pair<const char*, ConfigEdit> edits[] = {
      {"full rotary",
       [](Json& c) {
         c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
       }},
      {"top 1", [](Json& c) { c["num_experts_per_tok"] = 1; }},
  };
  expect_each_edit_moves("minimax_m2", edits);
  const double err = moved_from_reference(
      "minimax_m2", [](Json&) {},
      [](const std::string& n, std::vector<float>& v) {
        if (n.ends_with("e_score_correction_bias")) std::fill(v.begin(), v.end(), 0.0f);
      });
  std::printf("minimax_m2 without the routing bias: rel-L2 %.3e from the reference\n", err);
  EXPECT_GT(err, 1e-3);
  const auto cfg = Json::parse(exl3::test::read_file(src / "config.json"));
  const std::pair<std::function<void(Json&)>, const char*> refused[] = {
      {[](Json& c) { c["rotary_dim"] = 32; }, "key 'rotary_dim' is 32, but partial_rotary_factor"},
      {[](Json& c) { c["qk_norm_type"] = "per_head"; }, "key 'qk_norm_type': 'per_head'"},
      {[](Json& c) {
         c["attn_type_list"] = {1, 0};
       },
       "key 'attn_type_list': entry 0"},
      {[](Json& c) { c["scoring_func"] = "softmax"; }, "key 'scoring_func': 'softmax'"},
  };
  for (const auto& [edit, message] : refused) {
    Json c = cfg;
    edit(c);
    EXPECT_THAT(
        rt::test::error_of([&] { (void)describe_model(rt::test::config_of(c), "m/config.json"); }),
        HasSubstr(message));
  }
  Json agreeing = cfg;
  agreeing["rotary_dim"] = 16;  // the release's key, consistent with the factor
  EXPECT_NO_THROW((void)describe_model(rt::test::config_of(agreeing), "m/config.json"));
}

// Qwen3-Next: the hybrid stack against transformers, the recurrent state carried through
// chunked prefill and decode, and what it cannot do (rewind, cached prefixes, TP) refused.
class Hybrid : public ::testing::TestWithParam<const char*> {};

TEST_P(Hybrid, MatchesTransformersAndCarriesItsState) {
  const auto dir = data_dir(GetParam());
  const auto ref = load_reference(dir);
  auto engine = rt::load_engine(dir);
  const auto got = rt::forward_logits(*engine, ref.ids);
  ASSERT_EQ(got.size(), ref.logits.size());
  const double err = exl3::test::rel_l2(got, ref.logits);
  std::printf("%s: fp32 CPU engine vs transformers rel-L2 %.3e\n", GetParam(), err);
  EXPECT_LE(err, 1e-5);
  for (size_t t = 0; t < ref.ids.size(); ++t) {
    const std::vector<double> g(got.begin() + static_cast<std::ptrdiff_t>(t * ref.vocab),
                                got.begin() + static_cast<std::ptrdiff_t>((t + 1) * ref.vocab));
    EXPECT_EQ(argmax_of(g),
              argmax_of(std::span<const double>(ref.logits).subspan(t * ref.vocab, ref.vocab)))
        << "position " << t;
  }
  // The state after a prefill of 25 feeds 55 single-token steps; chunks of 7 likewise.
  EXPECT_LE(exl3::test::rel_l2(rt::test::prefill_then_decode(*engine, ref.ids, 25), got), 1e-6);
  const std::span<const int32_t> ids(ref.ids);
  const auto seq = engine->new_sequence();
  std::vector<float> chunked;
  for (size_t at = 0; at < ids.size(); at += 7) {
    const auto part = engine->forward(seq, ids.subspan(at, std::min<size_t>(7, ids.size() - at)));
    chunked.insert(chunked.end(), part.begin(), part.end());
  }
  EXPECT_LE(exl3::test::rel_l2(chunked, got), 1e-6);
  // Two sequences interleaved keep their own states.
  const auto a = engine->new_sequence(), b = engine->new_sequence();
  (void)engine->forward(a, ids.first(30));
  (void)engine->forward(b, ids.subspan(40, 10));
  const auto rest = engine->forward(a, ids.subspan(30));
  EXPECT_LE(exl3::test::rel_l2(rest, std::vector<float>(got.begin() + 30 * ref.vocab, got.end())),
            1e-6);
  // A rewound sequence would continue from a state holding the dropped tokens: refused.
  engine->truncate_sequence(a, 20);
  EXPECT_THAT(rt::test::error_of([&] { (void)engine->forward(a, ids.subspan(20, 1)); }),
              HasSubstr("continues at position 20, but this layer's recurrent state"));
  // Starting over from position 0 is always possible.
  engine->truncate_sequence(a, 0);
  EXPECT_LE(exl3::test::rel_l2(engine->forward(a, ids), got), 1e-6);
  rt::EngineOptions tp2;
  tp2.tp = 2;
  EXPECT_THAT(rt::test::error_of([&] { (void)rt::load_engine(dir, tp2); }),
              HasSubstr("gated DeltaNet layers are not cut for tensor parallelism"));
  EXPECT_THAT(
      rt::test::error_of(
          [&] { (void)rt::SpeculativeDecoder(*engine, *engine, rt::SpeculativeOptions{}); }),
      HasSubstr("the target (" + (dir / "config.json").string() + ") has gated DeltaNet layers"));
  rt::EngineOptions none;
  none.prefix_cache = true;
  none.recurrent_snapshots = 0;
  EXPECT_THAT(rt::test::error_of([&] { (void)rt::load_engine(dir, none); }),
              HasSubstr("snapshots leave no room for one"));
}

// Prefix caching on the hybrid models: a prompt's prefill keeps the recurrent state where its
// last full page ends, and a later prompt sharing those pages adopts them with that state and
// gives the logits of a full pass; without a kept state (a boundary no prefill ended on, or
// one replaced) nothing is adopted.
TEST_P(Hybrid, CachedPrefixesCarryTheirRecurrentState) {
  const auto dir = data_dir(GetParam());
  const auto ref = load_reference(dir);
  auto engine = rt::load_engine(dir);
  const auto want = rt::forward_logits(*engine, ref.ids);
  const std::span<const int32_t> ids(ref.ids);
  const auto vocab = static_cast<std::ptrdiff_t>(ref.vocab);
  const auto rows = [&](size_t from, size_t to) {
    return std::vector<float>(want.begin() + static_cast<std::ptrdiff_t>(from) * vocab,
                              want.begin() + static_cast<std::ptrdiff_t>(to) * vocab);
  };
  rt::EngineOptions eo;
  eo.prefix_cache = true;
  eo.page_size = 8;
  eo.recurrent_snapshots = 2;
  auto cached = rt::load_engine(dir, eo);
  ASSERT_GE(ids.size(), 41u);
  // A new sequence of the whole prompt adopts `adopted` cached tokens and computes the rest from
  // the state kept there, giving the rows of one full pass.
  const auto expect_adopts = [&](int64_t adopted) {
    const auto s = cached->new_sequence();
    ASSERT_EQ(cached->adopt_prefix(s, ids), adopted);
    const auto from = static_cast<size_t>(adopted);
    EXPECT_LE(exl3::test::rel_l2(cached->forward(s, ids.subspan(from), rt::LogitsMode::kAll),
                                 rows(from, ids.size())),
              1e-6);
  };
  // 37 tokens: run as 32 (a snapshot after page 3) and 5, every logits row as one pass.
  const auto a = cached->new_sequence();
  EXPECT_LE(
      exl3::test::rel_l2(cached->forward(a, ids.first(37), rt::LogitsMode::kAll), rows(0, 37)),
      1e-6);
  // The whole prompt: 32 tokens adopted, the rest computed from the kept state.
  expect_adopts(32);
  // Pages 0..1 match, but no state was kept after them: nothing adopted. Its prefill of 20
  // tokens keeps one after page 1, in place of the least recently used (the one at 32; the
  // whole prompt's prefill above kept a newer one at 80).
  std::vector<int32_t> other(ids.begin(), ids.begin() + 20);
  other.push_back(ids[3]);
  const auto c = cached->new_sequence();
  EXPECT_EQ(cached->adopt_prefix(c, other), 0);
  EXPECT_LE(exl3::test::rel_l2(
                cached->forward(c, std::span<const int32_t>(other).first(20), rt::LogitsMode::kAll),
                rows(0, 20)),
            1e-6);
  // The whole prompt again: only 16 tokens now, and the rest from that state.
  expect_adopts(16);
}

INSTANTIATE_TEST_SUITE_P(Model, Hybrid,
                         ::testing::Values("qwen3_next", "qwen3_5_moe", "qwen3_5", "kimi_linear"));

// Qwen3.5: the DeltaNet's split projections, MoE in every layer (or dense MLPs), the multimodal
// RoPE's sections read as the plain RoPE they are for text.
TEST(Qwen3_5, DescribedWithSplitProjections) {
  for (const char* name : {"qwen3_5_moe", "qwen3_5"}) {
    const ModelSpec s = describe_model(Checkpoint::open(data_dir(name)));
    const bool moe = std::string(name) == "qwen3_5_moe";
    EXPECT_EQ(s.architecture, moe ? Architecture::kQwen3_5Moe : Architecture::kQwen3_5);
    EXPECT_TRUE(s.norm_unit_offset);
    for (const auto& l : s.layers) {
      if (const auto* d = std::get_if<GatedDeltaNetSpec>(&l.attention)) {
        EXPECT_TRUE(d->split_inputs);
        EXPECT_EQ(d->qkv_width(), 256);
      } else {
        const auto& a = std::get<GqaAttentionSpec>(l.attention);
        EXPECT_TRUE(a.output_gate);
        EXPECT_EQ(a.rope.rotary_dim, 8);
      }
      if (moe) {
        const auto& m = std::get<MoeSpec>(l.mlp);
        EXPECT_TRUE(m.renormalize);
        EXPECT_EQ(m.shared_gate, "shared_expert_gate");
      } else {
        EXPECT_EQ(std::get<DenseMlpSpec>(l.mlp).intermediate, 192);
      }
    }
  }
  const std::pair<const char*, std::function<void(const std::string&, std::vector<float>&)>>
      tensor_edits[] = {
          {"b and a negated",  // read by name from their own projections
           [](const std::string& n, std::vector<float>& v) {
             if (n.ends_with("in_proj_b.weight") || n.ends_with("in_proj_a.weight"))
               for (float& x : v) x = -x;
           }},
      };
  for (const auto& [what, edit] : tensor_edits) {
    const double err = moved_from_reference(
        "qwen3_5_moe", [](nlohmann::json&) {}, edit);
    std::printf("qwen3_5_moe with %s: rel-L2 %.3e from the reference\n", what, err);
    EXPECT_GT(err, 1e-3) << what;
  }
}

// Kimi-Linear: KDA and RoPE-free MLA layers, each trait moving the logits when taken away, and
// its config read under either spelling of the keys KimiLinearConfig aliases.
TEST(KimiLinear, DescribedAndEveryTraitChangesTheResult) {
  using Json = nlohmann::json;
  const auto src = data_dir("kimi_linear");
  const ModelSpec s = describe_model(Checkpoint::open(src));
  EXPECT_EQ(s.architecture, Architecture::kKimiLinear);
  EXPECT_FALSE(s.norm_unit_offset);
  const auto& mla = std::get<MlaAttentionSpec>(s.layers[1].attention);
  EXPECT_EQ(mla.rope.rotary_dim, 0);
  EXPECT_EQ(mla.q_lora_rank, 0);
  for (const int l : {0, 2, 3}) {
    const auto& d = std::get<GatedDeltaNetSpec>(s.layers[static_cast<size_t>(l)].attention);
    EXPECT_TRUE(d.kimi);
    EXPECT_EQ(d.prefix, "model.layers." + std::to_string(l) + ".self_attn");
  }
  EXPECT_EQ(std::get<DenseMlpSpec>(s.layers[0].mlp).prefix, "model.layers.0.block_sparse_moe");
  const auto& m = std::get<MoeSpec>(s.layers[1].mlp);
  EXPECT_EQ(m.n_group, 2);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_TRUE(m.renormalize);
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 2.446);
  ASSERT_TRUE(m.shared.has_value());
  EXPECT_EQ(m.shared->prefix, "model.layers.1.block_sparse_moe.shared_experts");
  const std::pair<const char*, std::function<void(const std::string&, std::vector<float>&)>>
      tensor_edits[] = {
          {"one decay per head (f_b_proj and dt_bias zeroed)",
           [](const std::string& n, std::vector<float>& v) {
             if (n.ends_with("f_b_proj.weight") || n.ends_with("dt_bias"))
               std::fill(v.begin(), v.end(), 0.0f);
           }},
          {"an open output gate",
           [](const std::string& n, std::vector<float>& v) {
             if (n.ends_with("g_b_proj.weight")) std::fill(v.begin(), v.end(), 0.0f);
           }},
          {"no convolution history",
           [](const std::string& n, std::vector<float>& v) {
             if (!n.ends_with("conv1d.weight")) return;
             for (size_t i = 0; i < v.size(); ++i)
               if (i % 4 != 3) v[i] = 0.0f;
           }},
          {"no routing bias",
           [](const std::string& n, std::vector<float>& v) {
             if (n.ends_with("e_score_correction_bias")) std::fill(v.begin(), v.end(), 0.0f);
           }},
      };
  for (const auto& [what, edit] : tensor_edits) {
    const double err = moved_from_reference(
        "kimi_linear", [](Json&) {}, edit);
    std::printf("kimi_linear with %s: rel-L2 %.3e from the reference\n", what, err);
    EXPECT_GT(err, 1e-3) << what;
  }
  // The same config under transformers' canonical names, and the released nested form of the
  // layer kinds (layers numbered from 1), describe the same model.
  const std::pair<const char*, ConfigEdit> same[] = {
      {"canonical names",
       [](Json& c) {
         for (const auto& [alias, key] : {std::pair{"num_experts_per_token", "num_experts_per_tok"},
                                          std::pair{"num_expert_group", "n_group"},
                                          std::pair{"num_shared_experts", "n_shared_experts"},
                                          std::pair{"moe_renormalize", "norm_topk_prob"}}) {
           c[key] = c[alias];
           c.erase(alias);
         }
       }},
      {"linear_attn_config",
       [](Json& c) {
         c.erase("layer_types");
         c.erase("linear_head_dim");
         c["linear_attn_config"] = {{"full_attn_layers", {2}},
                                    {"kda_layers", {1, 3, 4}},
                                    {"head_dim", 32},
                                    {"num_heads", 4},
                                    {"short_conv_kernel_size", 4}};
       }},
  };
  for (const auto& [what, edit] : same) {
    const double err = moved_from_reference("kimi_linear", edit);
    std::printf("kimi_linear with %s: rel-L2 %.3e from the reference\n", what, err);
    EXPECT_LE(err, 1e-5) << what;
  }
  auto cfg = Json::parse(exl3::test::read_file(src / "config.json"));
  cfg["num_experts_per_tok"] = 3;  // beside num_experts_per_token 2
  EXPECT_THAT(
      rt::test::error_of([&] { (void)describe_model(rt::test::config_of(cfg), "m/config.json"); }),
      HasSubstr("keys 'num_experts_per_token' (2) and 'num_experts_per_tok' (3)"));
}

TEST(Qwen3Next, DescribedAndEveryTraitChangesTheResult) {
  using Json = nlohmann::json;
  const auto src = data_dir("qwen3_next");
  const ModelSpec s = describe_model(Checkpoint::open(src));
  EXPECT_EQ(s.architecture, Architecture::kQwen3Next);
  EXPECT_TRUE(s.norm_unit_offset);
  EXPECT_TRUE(s.has_recurrent_layers());
  ASSERT_EQ(s.layers.size(), 4u);
  for (const int l : {0, 2, 3}) {
    const auto& d = std::get<GatedDeltaNetSpec>(s.layers[static_cast<size_t>(l)].attention);
    EXPECT_EQ(d.prefix, "model.layers." + std::to_string(l) + ".linear_attn");
    EXPECT_EQ(d.v_per_k(), 2);
    EXPECT_EQ(d.conv_dim(), 256);
    EXPECT_EQ(d.qkvz_width(), 384);
  }
  const auto& a = std::get<GqaAttentionSpec>(s.layers[1].attention);
  EXPECT_TRUE(a.output_gate);
  EXPECT_EQ(a.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(a.rope.rotary_dim, 8);  // head_dim 32 x partial_rotary_factor 0.25
  EXPECT_TRUE(std::holds_alternative<DenseMlpSpec>(s.layers[2].mlp));
  const auto& m = std::get<MoeSpec>(s.layers[3].mlp);
  ASSERT_TRUE(m.shared.has_value());
  EXPECT_EQ(m.shared->prefix, "model.layers.3.mlp.shared_expert");
  EXPECT_EQ(m.shared->intermediate, 96);
  EXPECT_EQ(m.shared_gate, "shared_expert_gate");
  EXPECT_EQ(spec_summary(s)["linear_attention_layers"], 3);
  // Without layer_types every 4th layer is full attention (full_attention_interval).
  auto cfg = Json::parse(exl3::test::read_file(src / "config.json"));
  cfg.erase("layer_types");
  const ModelSpec pattern = describe_model(rt::test::config_of(cfg), "m/config.json");
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(
        std::holds_alternative<GqaAttentionSpec>(pattern.layers[static_cast<size_t>(l)].attention),
        l == 3)
        << "layer " << l;
  }
  cfg["layer_types"] = {"linear_attention", "sliding_attention", "full_attention",
                        "full_attention"};
  EXPECT_THAT(
      rt::test::error_of([&] { (void)describe_model(rt::test::config_of(cfg), "m/config.json"); }),
      HasSubstr("entry 1 (\"sliding_attention\") is neither"));
  cfg["layer_types"] = {"linear_attention", "full_attention", "linear_attention",
                        "linear_attention"};
  cfg["linear_num_value_heads"] = 3;
  EXPECT_THAT(
      rt::test::error_of([&] { (void)describe_model(rt::test::config_of(cfg), "m/config.json"); }),
      HasSubstr("key 'linear_num_value_heads': 3 is not a multiple of linear_num_key_heads 2"));
  const std::pair<const char*, ConfigEdit> edits[] = {
      {"full rotary", [](Json& c) { c["rope_parameters"]["partial_rotary_factor"] = 1.0; }},
      {"top 1", [](Json& c) { c["num_experts_per_tok"] = 1; }},
  };
  expect_each_edit_moves("qwen3_next", edits);
  const std::pair<const char*, std::function<void(const std::string&, std::vector<float>&)>>
      tensor_edits[] = {
          {"no convolution history",  // only the current token's tap
           [](const std::string& n, std::vector<float>& v) {
             if (!n.ends_with("conv1d.weight")) return;
             for (size_t i = 0; i < v.size(); ++i)
               if (i % 4 != 3) v[i] = 0.0f;
           }},
          {"no decay",
           [](const std::string& n, std::vector<float>& v) {
             if (n.ends_with("A_log")) std::fill(v.begin(), v.end(), -30.0f);
           }},
          {"an open shared-expert gate",
           [](const std::string& n, std::vector<float>& v) {
             if (n.ends_with("shared_expert_gate.weight")) std::fill(v.begin(), v.end(), 0.0f);
           }},
          {"an open attention output gate",  // the gate halves of q_proj zeroed: sigmoid 0.5
           [](const std::string& n, std::vector<float>& v) {
             if (!n.ends_with("self_attn.q_proj.weight")) return;
             const size_t row = 128, per_head = 2 * 32 * row;
             for (size_t i = 0; i < v.size(); ++i)
               if (i % per_head >= 32 * row) v[i] = 0.0f;
           }},
      };
  for (const auto& [what, edit] : tensor_edits) {
    const double err = moved_from_reference(
        "qwen3_next", [](Json&) {}, edit);
    std::printf("qwen3_next with %s: rel-L2 %.3e from the reference\n", what, err);
    EXPECT_GT(err, 1e-3) << what;
  }
}

// The sparsity matters: with every position kept, the GLM-5 model is far from its reference.
TEST(GlmMoeDsa, SelectionChangesTheResultAndSharedLayersReuseIt) {
  const auto src = data_dir("glm_moe_dsa");
  const ModelSpec s = describe_model(Checkpoint::open(src));
  EXPECT_EQ(s.architecture, Architecture::kGlmMoeDsa);
  const auto& l1 = std::get<MlaAttentionSpec>(s.layers[1].attention);
  ASSERT_TRUE(l1.indexer.has_value());
  EXPECT_TRUE(l1.indexer->shared);
  EXPECT_FALSE(std::get<MlaAttentionSpec>(s.layers[2].attention).indexer->shared);
  EXPECT_EQ(l1.indexer->topk, 12);
  EXPECT_TRUE(std::holds_alternative<DenseMlpSpec>(s.layers[0].mlp));  // mlp_layer_types
  const auto ref = load_reference(src);
  exl3::test::TempDir tmp;
  for (const auto& e : std::filesystem::directory_iterator(src))
    std::filesystem::copy_file(e.path(), tmp.path() / e.path().filename());
  auto cfg = nlohmann::json::parse(exl3::test::read_file(src / "config.json"));
  cfg["index_topk"] = 4096;
  exl3::test::write_file(tmp.path() / "config.json", cfg.dump(2));
  auto dense = rt::load_engine(tmp.path());
  const double err = exl3::test::rel_l2(rt::forward_logits(*dense, ref.ids), ref.logits);
  std::printf("glm_moe_dsa with every position kept: rel-L2 %.3e from the sparse reference\n", err);
  EXPECT_GT(err, 1e-2);
  cfg["index_topk"] = 12;
  // DeepSeek-V3.2 runs an indexer in every layer, its RoPE half-split.
  const auto v32 = describe_model(Checkpoint::open(data_dir("deepseek_v32")));
  for (const auto& l : v32.layers) {
    const auto& a = std::get<MlaAttentionSpec>(l.attention);
    EXPECT_FALSE(a.indexer->shared);
    EXPECT_FALSE(a.indexer->rope_interleave);
    EXPECT_TRUE(a.rope_interleave);
  }
  cfg["indexer_types"] = {"shared", "full", "full", "shared"};
  EXPECT_THAT([&] { describe_model(rt::test::config_of(cfg), "m/config.json"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("layer 0 is shared")));
}

TEST(DeepseekV3Spec, DescribesLatentAttentionAndGroupedRouting) {
  const auto ckpt = Checkpoint::open(data_dir("deepseek_v3_qlora"));
  const ModelSpec s = describe_model(ckpt);
  EXPECT_EQ(s.architecture, Architecture::kDeepseekV3);
  const auto& a = std::get<MlaAttentionSpec>(s.layers[1].attention);
  EXPECT_EQ(a.prefix, "model.layers.1.self_attn");
  EXPECT_EQ(a.q_lora_rank, 24);
  EXPECT_EQ(a.kv_lora_rank, 32);
  EXPECT_EQ(a.qk_head_dim(), 24);
  EXPECT_TRUE(a.rope_interleave);
  EXPECT_DOUBLE_EQ(a.scale, 1.0 / std::sqrt(24.0));
  EXPECT_TRUE(std::holds_alternative<DenseMlpSpec>(s.layers[0].mlp));  // first_k_dense_replace 1
  const auto& m = std::get<MoeSpec>(s.layers[2].mlp);
  EXPECT_EQ(m.n_group, 4);
  EXPECT_EQ(m.topk_group, 2);
  EXPECT_TRUE(m.correction_bias);
  ASSERT_TRUE(m.shared.has_value());
  EXPECT_EQ(m.shared->prefix, "model.layers.2.mlp.shared_experts");
  EXPECT_EQ(spec_summary(s)["attention"]["kind"], "mla");
  // DeepSeek's yarn scales the softmax by mscale(factor, mscale_all_dim)^2.
  const auto yarn = describe_model(Checkpoint::open(data_dir("deepseek_v3_yarn")));
  const double ms = 0.1 * std::log(4.0) + 1.0;
  EXPECT_NEAR(std::get<MlaAttentionSpec>(yarn.layers[0].attention).scale, ms * ms / std::sqrt(24.0),
              1e-15);
}

TEST(DeepseekV3Spec, FailsClosed) {
  const auto dir = data_dir("deepseek_v3_qlora");
  // Every rank holds at least one MLA head: TP 5 over 4 heads says so instead of computing.
  rt::EngineOptions tp5;
  tp5.tp = 5;
  EXPECT_THAT([&] { rt::load_engine(dir, tp5); },
              ::testing::ThrowsMessage<Error>(HasSubstr("without any of the 4 MLA heads")));
  auto cfg = nlohmann::json::parse(exl3::test::read_file(dir / "config.json"));
  cfg["num_key_value_heads"] = 2;
  EXPECT_THAT([&] { describe_model(rt::test::config_of(cfg), "m/config.json"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("num_key_value_heads")));
  cfg["num_key_value_heads"] = 4;
  cfg["n_group"] = 3;
  EXPECT_THAT([&] { describe_model(rt::test::config_of(cfg), "m/config.json"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'n_group': 3 does not divide")));
  cfg["n_group"] = 4;
  cfg["scoring_func"] = "softmax";
  EXPECT_THAT([&] { describe_model(rt::test::config_of(cfg), "m/config.json"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("scoring_func")));
}

}  // namespace
}  // namespace exl3::model
