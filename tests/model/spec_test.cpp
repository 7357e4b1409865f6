// The model description: what config.json turns into for every supported architecture, and the
// clear errors for configs the runtime does not run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/model/spec.hpp"
#include "runtime_test_util.hpp"
#include "test_support.hpp"

namespace exl3::model {
namespace test = exl3::runtime::test;  // the tiny-checkpoint writers of the runtime tests
namespace {

using test::base_config;
using test::config_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ModelSpec, TinyQwen3MoeFromCheckpoint) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto spec = describe_model(Checkpoint::open(test::tiny_model(dir)));
  EXPECT_EQ(spec.architecture, Architecture::kQwen3Moe);
  EXPECT_EQ(spec.hidden_size, 256);
  EXPECT_EQ(spec.vocab_size, 512);
  EXPECT_DOUBLE_EQ(spec.rms_norm_eps, 1e-6);
  EXPECT_EQ(spec.lm_head, "lm_head");
  EXPECT_FALSE(spec.lm_head_tied);
  EXPECT_EQ(spec.eos_token_ids, std::vector<int32_t>{2});
  ASSERT_EQ(spec.num_layers(), 2);
  for (const auto& l : spec.layers) {
    const auto& a = std::get<GqaAttentionSpec>(l.attention);
    EXPECT_EQ(a.num_heads, 4);
    EXPECT_EQ(a.num_kv_heads, 2);
    EXPECT_EQ(a.head_dim, 64);
    EXPECT_EQ(a.qk_norm, QkNorm::kPerHead);
    EXPECT_EQ(a.rope.type, RopeType::kDefault);  // rope_parameters (transformers 5)
    EXPECT_DOUBLE_EQ(a.rope.theta, 10000.0);
    EXPECT_EQ(a.rope.rotary_dim, 64);
    const auto& m = std::get<MoeSpec>(l.mlp);
    EXPECT_EQ(m.num_experts, 8);
    EXPECT_EQ(m.top_k, 2);
    EXPECT_EQ(m.intermediate, 128);
    EXPECT_EQ(m.router, RouterKind::kSoftmax);
    EXPECT_TRUE(m.renormalize);
    EXPECT_FALSE(m.shared);
  }
  EXPECT_TRUE(spec.is_moe());
  EXPECT_EQ(spec_summary(spec)["moe_layers"], 2);
}

TEST(ModelSpec, DenseArchitectures) {
  for (const char* arch : {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    SCOPED_TRACE(arch);
    const auto spec = describe_model(config_of(base_config(arch)), "m/config.json");
    ASSERT_EQ(spec.num_layers(), 4);
    const auto& a = std::get<GqaAttentionSpec>(spec.layers[1].attention);
    EXPECT_EQ(a.prefix, "model.layers.1.self_attn");
    EXPECT_EQ(a.qk_norm == QkNorm::kPerHead, std::string(arch) == "Qwen3ForCausalLM");
    EXPECT_DOUBLE_EQ(a.scale, 0.125);
    const auto& d = std::get<DenseMlpSpec>(spec.layers[1].mlp);
    EXPECT_EQ(d.prefix, "model.layers.1.mlp");
    EXPECT_EQ(d.intermediate, 512);
    EXPECT_EQ(spec.layers[1].input_norm, "model.layers.1.input_layernorm.weight");
  }
  // head_dim and num_key_value_heads default like transformers.
  auto c = base_config("LlamaForCausalLM");
  c.erase("head_dim");
  c.erase("num_key_value_heads");
  const auto spec = describe_model(config_of(c), "m/config.json");
  const auto& a = std::get<GqaAttentionSpec>(spec.layers[0].attention);
  EXPECT_EQ(a.head_dim, 64);
  EXPECT_EQ(a.num_kv_heads, 4);
}

TEST(ModelSpec, Glm4MoeLayersRouterAndPartialRotary) {
  const auto spec = describe_model(config_of(base_config("Glm4MoeForCausalLM")), "m/config.json");
  ASSERT_EQ(spec.num_layers(), 4);
  EXPECT_TRUE(std::holds_alternative<DenseMlpSpec>(spec.layers[0].mlp));  // first_k_dense_replace
  const auto& m = std::get<MoeSpec>(spec.layers[1].mlp);
  EXPECT_EQ(m.router, RouterKind::kSigmoidGrouped);
  EXPECT_EQ(m.n_group, 2);
  EXPECT_EQ(m.topk_group, 1);
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 2.5);
  EXPECT_TRUE(m.correction_bias);
  ASSERT_TRUE(m.shared);
  EXPECT_EQ(m.shared->prefix, "model.layers.1.mlp.shared_experts");
  EXPECT_EQ(m.shared->intermediate, 128);
  const auto& a = std::get<GqaAttentionSpec>(spec.layers[1].attention);
  EXPECT_EQ(a.rope.rotary_dim, 32);  // head_dim 64 x partial_rotary_factor 0.5
  EXPECT_EQ(a.qk_norm, QkNorm::kNone);
}

TEST(ModelSpec, Qwen3MoeDenseLayers) {
  auto c = base_config("Qwen3MoeForCausalLM");
  c["decoder_sparse_step"] = 2;
  c["mlp_only_layers"] = {3};
  const auto spec = describe_model(config_of(c), "m/config.json");
  // MoE when (L + 1) % 2 == 0 and L not in mlp_only_layers: only layer 1.
  EXPECT_TRUE(std::holds_alternative<DenseMlpSpec>(spec.layers[0].mlp));
  EXPECT_TRUE(std::holds_alternative<MoeSpec>(spec.layers[1].mlp));
  EXPECT_TRUE(std::holds_alternative<DenseMlpSpec>(spec.layers[2].mlp));
  EXPECT_TRUE(std::holds_alternative<DenseMlpSpec>(spec.layers[3].mlp));
}

// Every unsupported value fails with config.json and the key in the message.
TEST(ModelSpec, BadConfigsFailClearly) {
  struct Case {
    const char* arch;
    nlohmann::json patch;
    const char* key;
  };
  const Case cases[] = {
      {"GemmaForCausalLM", {}, "architectures"},
      {"LlamaForCausalLM", {{"hidden_act", "gelu"}}, "hidden_act"},
      {"LlamaForCausalLM", {{"num_key_value_heads", 3}}, "num_key_value_heads"},
      {"LlamaForCausalLM", {{"rms_norm_eps", nullptr}}, "rms_norm_eps"},
      {"LlamaForCausalLM", {{"rms_norm_eps", -1.0}}, "rms_norm_eps"},
      {"LlamaForCausalLM", {{"hidden_size", 0}}, "hidden_size"},
      {"LlamaForCausalLM",
       {{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}},
       "rope_scaling.rope_type"},
      {"LlamaForCausalLM", {{"rope_scaling", {{"type", "longrope"}}}}, "rope_scaling.type"},
      {"LlamaForCausalLM", {{"rope_scaling", {{"rope_type", "linear"}}}}, "rope_scaling.factor"},
      {"LlamaForCausalLM",
       {{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}},
       "rope_scaling.low_freq_factor"},
      {"LlamaForCausalLM", {{"rope_theta", "big"}}, "rope_theta"},
      {"LlamaForCausalLM", {{"partial_rotary_factor", 0.5}}, "partial_rotary_factor"},
      {"Qwen2ForCausalLM", {{"use_sliding_window", true}}, "use_sliding_window"},
      {"Qwen3ForCausalLM",
       {{"layer_types", {"sliding_attention", "full_attention"}}},
       "layer_types"},
      {"Qwen3MoeForCausalLM", {{"num_experts_per_tok", 9}}, "num_experts_per_tok"},
      {"Qwen3MoeForCausalLM", {{"moe_intermediate_size", nullptr}}, "moe_intermediate_size"},
      {"Qwen3MoeForCausalLM", {{"mlp_only_layers", {7}}}, "mlp_only_layers"},
      {"Qwen3MoeForCausalLM", {{"decoder_sparse_step", 0}}, "decoder_sparse_step"},
      {"Glm4MoeForCausalLM", {{"n_group", 3}}, "n_group"},
      {"Glm4MoeForCausalLM", {{"topk_group", 3}}, "topk_group"},
      {"Glm4MoeForCausalLM", {{"partial_rotary_factor", 1.5}}, "partial_rotary_factor"},
      {"Glm4MoeForCausalLM", {{"partial_rotary_factor", 0.01}}, "partial_rotary_factor"},
      {"Glm4MoeForCausalLM", {{"topk_method", "greedy"}}, "topk_method"},
  };
  for (const auto& c : cases) {
    auto j = base_config(c.arch);
    if (!c.patch.is_null()) j.merge_patch(c.patch);
    SCOPED_TRACE(j.dump());
    try {
      (void)describe_model(config_of(j), "m/config.json");
      ADD_FAILURE() << "no error for " << c.key;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr("m/config.json"), HasSubstr(c.key)));
    }
  }
}

TEST(ModelSpec, NoConfigOrHeadFails) {
  exl3::test::TempDir tmp;
  test::write_model(tmp.path(), HfArch::kLlama, 1);
  nlohmann::json cfg = nlohmann::json::parse(read_text_file(tmp / "config.json"));
  // No lm_head and untied: the head is missing.
  {
    SafetensorsWriter w;
    const auto store = TensorStore::open(tmp.path());
    for (const auto& n : store.names())
      if (n != "lm_head.weight")
        w.add(n, store.at(n).info->dtype, store.at(n).info->shape, store.at(n).bytes());
    const std::string blob = w.serialize();
    std::filesystem::remove(tmp / "model.safetensors");
    write_file_atomic(tmp / "model.safetensors", std::string_view(blob));
  }
  EXPECT_THROW(
      {
        try {
          (void)describe_model(Checkpoint::open(tmp.path()));
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), AllOf(HasSubstr("lm_head"), HasSubstr("tie_word_embeddings")));
          throw;
        }
      },
      Error);
  cfg["tie_word_embeddings"] = true;
  write_file_atomic(tmp / "config.json", cfg.dump());
  const auto spec = describe_model(Checkpoint::open(tmp.path()));
  EXPECT_TRUE(spec.lm_head_tied);
  EXPECT_EQ(spec.lm_head, "model.embed_tokens.weight");
  std::filesystem::remove(tmp / "config.json");
  EXPECT_THROW(
      {
        try {
          (void)describe_model(Checkpoint::open(tmp.path()));
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), HasSubstr("no config.json"));
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace exl3::model
