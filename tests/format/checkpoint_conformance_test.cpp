// Discovery on the exllamav3-made conformance files (tensor sets and the tiny Qwen3-MoE model).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/format/checkpoint.hpp"
#include "exl3/trellis/half.hpp"
#include "format_test_util.hpp"
#include "test_support.hpp"

namespace exl3 {
namespace {

using trellis::Codebook;

void expect_public_set(const std::filesystem::path& file, const std::string& cb,
                       Codebook codebook) {
  const auto c = Checkpoint::open(file);
  EXPECT_FALSE(c.config().has_value());
  for (int k = 1; k <= 8; ++k) {
    const std::string prefix = fmt::format("cb_{}.k{}.layer", cb, k);
    const Exl3LinearInfo* l = c.find_linear(prefix);
    ASSERT_NE(l, nullptr) << prefix;
    EXPECT_EQ(l->bits, k);
    EXPECT_EQ(l->codebook, codebook) << prefix;
    EXPECT_EQ(l->in_features, 256);
    EXPECT_EQ(l->out_features, 384);
    EXPECT_EQ(l->rotation, Rotation::kSuhSvh);
    EXPECT_FALSE(l->has_bias);
    const uint64_t marker = codebook == Codebook::k3Inst ? 0 : 4;
    EXPECT_EQ(l->bytes, 16u * 24 * 16 * k * 2 + 256 * 2 + 384 * 2 + marker);
    EXPECT_NEAR(l->bits_per_weight(), k + 8.0 * (640 * 2 + marker) / (256 * 384), 1e-12);
  }
  // Every non-linear tensor ends up plain; nothing is lost.
  size_t linear_tensors = 0;
  for (const auto& l : c.linears()) {
    for (const char* s : {"trellis", "suh", "svh", "su", "sv", "mcg", "mul1"})
      linear_tensors += c.store().contains(l.prefix + "." + s);
  }
  EXPECT_EQ(linear_tensors + c.plain_tensors().size(), c.store().size());
}

TEST(CheckpointConformance, Public3Inst) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto file = dir / "tensors" / "exl3_public_3inst.safetensors";
  expect_public_set(file, "3inst", Codebook::k3Inst);
  const auto c = Checkpoint::open(file);
  EXPECT_EQ(c.linears().size(), 9u);
  const auto& legacy = c.linear("legacy_3inst.k4.layer");
  EXPECT_EQ(legacy.rotation, Rotation::kSuSv);
  EXPECT_EQ(rotation_name(legacy.rotation), "su_sv");
  EXPECT_EQ(legacy.bits, 4);
  EXPECT_EQ(legacy.codebook, Codebook::k3Inst);

  // Legacy signs expand bit-exactly to what exllamav3 unpacked.
  const auto d = Exl3LinearData::load(c, "legacy_3inst.k4.layer");
  EXPECT_EQ(d.suh(), copy_tensor<uint16_t>(c.store().at("legacy_3inst.k4.expected.suh")));
  EXPECT_EQ(d.svh(), copy_tensor<uint16_t>(c.store().at("legacy_3inst.k4.expected.svh")));
  const auto trellis_bits = copy_tensor<uint16_t>(c.store().at("legacy_3inst.k4.layer.trellis"));
  ASSERT_EQ(d.trellis().size(), trellis_bits.size());
  EXPECT_TRUE(std::equal(trellis_bits.begin(), trellis_bits.end(), d.trellis().begin()));

  const auto d1 = Exl3LinearData::load(c, "cb_3inst.k1.layer");
  EXPECT_EQ(d1.suh(), copy_tensor<uint16_t>(c.store().at("cb_3inst.k1.layer.suh")));
  EXPECT_TRUE(d1.bias().empty());

  for (const auto& p : c.plain_tensors()) {
    if (p.name == "cb_3inst.k1.expected.weight") {
      EXPECT_EQ(p.role, "linear");
    }
    if (p.name == "cb_3inst.k1.input.x") {
      EXPECT_EQ(p.role, "other");
    }
  }
}

TEST(CheckpointConformance, PublicMcg) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  expect_public_set(dir / "tensors" / "exl3_public_mcg.safetensors", "mcg", Codebook::kMcg);
}

TEST(CheckpointConformance, PublicMul1) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  expect_public_set(dir / "tensors" / "exl3_public_mul1.safetensors", "mul1", Codebook::kMul1);
}

TEST(CheckpointConformance, PublicPackHasNoLinears) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto c = Checkpoint::open(dir / "tensors" / "exl3_public_pack.safetensors");
  EXPECT_TRUE(c.linears().empty());
  EXPECT_EQ(c.plain_tensors().size(), c.store().size());
}

TEST(CheckpointConformance, TinyQwen3Moe) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto c = Checkpoint::open(dir / "models" / "tiny-qwen3moe-exl3");
  ASSERT_TRUE(c.config().has_value());
  const ModelConfig& cfg = *c.config();
  EXPECT_EQ(cfg.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(cfg.model_type, "qwen3_moe");
  EXPECT_EQ(cfg.hidden_size, 256);
  EXPECT_EQ(cfg.num_hidden_layers, 2);
  EXPECT_EQ(cfg.num_attention_heads, 4);
  EXPECT_EQ(cfg.num_key_value_heads, 2);
  EXPECT_EQ(cfg.head_dim, 64);
  EXPECT_EQ(cfg.vocab_size, 512);
  EXPECT_EQ(cfg.num_experts, 8);
  EXPECT_EQ(cfg.num_experts_per_tok, 2);
  EXPECT_EQ(cfg.moe_intermediate_size, 128);
  EXPECT_DOUBLE_EQ(cfg.rms_norm_eps, 1e-6);
  EXPECT_FALSE(cfg.tie_word_embeddings);
  EXPECT_EQ(cfg.quantization_config.at("codebook"), "mul1");
  EXPECT_TRUE(c.quantization_config_file().is_object());
  // reference_logits.safetensors sits next to model.safetensors and must not be read.
  EXPECT_EQ(c.store().files().size(), 1u);
  EXPECT_FALSE(c.store().contains("exl3.logits"));

  // 2 layers x (4 attention + 8 experts x 3) + lm_head.
  EXPECT_EQ(c.linears().size(), 2u * (4 + 24) + 1);
  for (const auto& l : c.linears()) {
    EXPECT_EQ(l.codebook, Codebook::kMul1) << l.prefix;
    EXPECT_EQ(l.bits, l.prefix == "lm_head" ? 6 : 4) << l.prefix;
  }
  const auto& head = c.linear("lm_head");
  EXPECT_EQ(head.in_features, 256);
  EXPECT_EQ(head.out_features, 512);
  EXPECT_FALSE(head.expert.has_value());

  const auto& e = c.linear("model.layers.1.mlp.experts.5.down_proj");
  ASSERT_TRUE(e.expert.has_value());
  EXPECT_EQ(e.expert->layer, 1);
  EXPECT_EQ(e.expert->expert, 5);
  EXPECT_EQ(e.expert->proj, "down_proj");
  EXPECT_EQ(e.in_features, 128);
  EXPECT_EQ(e.out_features, 256);

  ASSERT_EQ(c.moe_layers().size(), 2u);
  for (int layer = 0; layer < 2; ++layer) {
    const auto& m = c.moe_layers()[static_cast<size_t>(layer)];
    EXPECT_EQ(m.layer, layer);
    EXPECT_EQ(m.num_experts, 8);
    EXPECT_EQ(m.bits_histogram, (std::vector<std::pair<int, int>>{{4, 24}}));
  }

  std::map<std::string, std::string> roles;
  for (const auto& p : c.plain_tensors()) roles[p.name] = p.role;
  EXPECT_EQ(roles.at("model.embed_tokens.weight"), "embedding");
  EXPECT_EQ(roles.at("model.layers.0.mlp.gate.weight"), "router");
  EXPECT_EQ(roles.at("model.layers.0.input_layernorm.weight"), "norm");
  EXPECT_EQ(roles.at("model.layers.1.self_attn.q_norm.weight"), "norm");
  EXPECT_EQ(roles.at("model.norm.weight"), "norm");
  for (const auto& p : c.plain_tensors()) {
    EXPECT_NE(p.role, "other") << p.name;
    EXPECT_NE(p.role, "linear") << p.name;  // every decoder linear is quantized
  }

  // The embedding reads as float from BF16.
  const auto emb = read_as_float(c.store().at("model.embed_tokens.weight"));
  EXPECT_EQ(emb.size(), 512u * 256);
}

}  // namespace
}  // namespace exl3
