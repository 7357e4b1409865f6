// One test per fail-closed loading check (docs/moe-layouts.md, What fails closed: Loading): each
// breaks one tensor (or the runtime's expectations) of a valid TP-2 checkpoint and checks the
// error names the file, the tensor and the problem. Checks that whole-checkpoint discovery also
// makes are exercised through a bare store, which only the MoE loader validates.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/format/checkpoint.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/trellis/codebook.hpp"
#include "moe_test_util.hpp"

namespace exl3::moe {
namespace {

using namespace test;
using ::testing::AllOf;
using ::testing::HasSubstr;

class BadLoad : public ::testing::Test {
 protected:
  void write(RotationLayout rotation) {
    write_synthetic_moe(dir_.path(),
                        small_spec(rotation, rotation == RotationLayout::kPlain ? 1 : 2));
  }
  void SetUp() override { write(RotationLayout::kPerExpert); }

  void edit(const std::function<void(TensorMap&)>& fn) { edit_tensors(file(), fn); }
  std::filesystem::path file() const { return dir_ / "model.safetensors"; }
  // "<file>: tensor '<name>'"
  std::string at(const std::string& name) const {
    return fmt::format("{}: tensor '{}'", file().string(), name);
  }
  static std::string name(int expert, Proj p, const char* field, int rank = 0) {
    return expert_prefix(kLayer, expert, p, rank) + "." + field;
  }

  std::string ckpt_error(int rank = 0, int tp = 2, int experts = 4, int layer = kLayer) {
    return error_of(
        [&] { (void)load_moe_layer(Checkpoint::open(dir_.path()), layer, rank, tp, experts); });
  }
  // Through a bare store: only the MoE loader's own checks apply.
  std::string store_error(int rank = 0) {
    return error_of([&] {
      const auto store = TensorStore::open(dir_.path());
      const auto layout = read_hybrid_tr3_tail(dir_.path());
      ASSERT_TRUE(layout);
      (void)load_moe_layer(store, *layout, kLayer, rank, 2, 4);
    });
  }
  TempDir dir_;
};

TEST_F(BadLoad, ValidBaselineLoads) {
  EXPECT_NO_THROW((void)load_moe_layer(Checkpoint::open(dir_.path()), kLayer, 1, 2, 4));
}

TEST_F(BadLoad, UndeclaredSharedHTensors) {
  const auto row = shared_h_name(kLayer, Proj::kGate, 0);
  edit([&](TensorMap& m) { m[row] = filled(DType::kF16, {256}, 0x3C00); });
  EXPECT_THAT(ckpt_error(),
              AllOf(HasSubstr(at(row)), HasSubstr("does not declare rotation_layout shared_h_v1"),
                    HasSubstr("per_expert_v1"), HasSubstr("config.json")));
}

TEST_F(BadLoad, UndeclaredSharedHTensorsInPlainCheckpoint) {
  write(RotationLayout::kPlain);
  const auto row = shared_h_name(kLayer, Proj::kDown, 0);
  edit([&](TensorMap& m) { m[row] = filled(DType::kF16, {256}, 0x3C00); });
  EXPECT_THAT(ckpt_error(0, 1), AllOf(HasSubstr(at(row)), HasSubstr("shared-H row")));
}

TEST_F(BadLoad, WrongFieldOnSharedRow) {
  write(RotationLayout::kSharedH);
  const auto wrong =
      fmt::format("model.layers.{}.mlp.experts.shared_h.down_proj.rank0.suh", kLayer);
  edit([&](TensorMap& m) { m[wrong] = filled(DType::kF16, {256}, 0x3C00); });
  EXPECT_THAT(ckpt_error(),
              AllOf(HasSubstr(at(wrong)), HasSubstr("wrong field 'suh' on a shared row"),
                    HasSubstr("down_proj shares only its svh")));
}

TEST_F(BadLoad, SharedRowWithOnlyTheWrongField) {
  write(RotationLayout::kSharedH);
  const auto right = shared_h_name(kLayer, Proj::kGate, 0);
  const auto wrong = right.substr(0, right.size() - 3) + "svh";
  edit([&](TensorMap& m) {
    m[wrong] = m.at(right);
    m.erase(right);
  });
  EXPECT_THAT(store_error(), AllOf(HasSubstr(at(wrong)), HasSubstr("wrong field 'svh'")));
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr(file().string()), HasSubstr("gate_proj.rank0"),
                                  HasSubstr("no '")));  // discovery: the expert has no suh
}

TEST_F(BadLoad, MissingSharedRow) {
  write(RotationLayout::kSharedH);
  const auto row = shared_h_name(kLayer, Proj::kUp, 0);
  edit([&](TensorMap& m) { m.erase(row); });
  EXPECT_THAT(store_error(), AllOf(HasSubstr(row), HasSubstr("is missing"),
                                   HasSubstr("stores the up_proj suh once per layer and rank")));
}

TEST_F(BadLoad, HiddenSideRotationUnderAnExpertIdUnderSharedH) {
  write(RotationLayout::kSharedH);
  const auto own = name(2, Proj::kGate, "suh");
  edit([&](TensorMap& m) { m[own] = filled(DType::kF16, {256}, 0x3C00); });
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr(at(own)),
                                  HasSubstr("carries the hidden-side 'suh' under shared_h_v1"),
                                  HasSubstr("experts.shared_h.gate_proj.rank{r}.suh")));
}

TEST_F(BadLoad, CheckpointTpIsNotTheRuntimeTp) {
  EXPECT_THAT(ckpt_error(0, 4), AllOf(HasSubstr("config.json"),
                                      HasSubstr("sliced for TP 2, but the runtime uses TP 4")));
}

TEST_F(BadLoad, CheckpointExpertCountIsNotTheRuntimes) {
  EXPECT_THAT(
      ckpt_error(0, 2, 8),
      AllOf(HasSubstr("config.json"), HasSubstr("4 experts per layer, but the runtime expects 8")));
}

TEST_F(BadLoad, RankOutsideTp) {
  EXPECT_THAT(ckpt_error(2), HasSubstr("rank 2 is outside 0..1"));
  EXPECT_THAT(ckpt_error(-1), HasSubstr("rank -1 is outside 0..1"));
}

TEST_F(BadLoad, NotAMoeLayer) {
  EXPECT_THAT(ckpt_error(0, 2, 4, 0),
              AllOf(HasSubstr("layer 0 is not a MoE layer"), HasSubstr("1")));
}

TEST_F(BadLoad, TrellisNotRank3) {
  const auto t = name(1, Proj::kGate, "trellis");
  edit([&](TensorMap& m) { m[t] = filled(DType::kI16, {16, 8 * 48}); });
  EXPECT_THAT(store_error(),
              AllOf(HasSubstr(at(t)), HasSubstr("rank 2"), HasSubstr("must be rank 3")));
  EXPECT_THAT(ckpt_error(), HasSubstr(at(t)));
}

TEST_F(BadLoad, TrellisNotInt16) {
  const auto t = name(1, Proj::kUp, "trellis");
  edit([&](TensorMap& m) { m[t] = filled(DType::kF16, {16, 8, 48}); });
  EXPECT_THAT(store_error(),
              AllOf(HasSubstr(at(t)), HasSubstr("dtype F16, but a trellis must be I16")));
}

TEST_F(BadLoad, TrellisWidthNot16K) {
  const auto t = name(1, Proj::kDown, "trellis");
  edit([&](TensorMap& m) { m[t] = filled(DType::kI16, {8, 16, 50}); });
  EXPECT_THAT(store_error(),
              AllOf(HasSubstr(at(t)), HasSubstr("last dim 50 is not 16*K for K in 1..8")));
}

TEST_F(BadLoad, TrellisKOutsideOneToEight) {
  const auto t = name(1, Proj::kDown, "trellis");
  edit([&](TensorMap& m) { m[t] = filled(DType::kI16, {8, 16, 144}); });
  EXPECT_THAT(store_error(), AllOf(HasSubstr(at(t)), HasSubstr("last dim 144")));
}

TEST_F(BadLoad, StoredKIsNotTheDeclaredK) {
  const auto t = name(3, Proj::kGate, "trellis", 1);
  edit([&](TensorMap& m) { m[t] = filled(DType::kI16, {16, 8, 64}); });  // valid K4
  EXPECT_THAT(ckpt_error(1),
              AllOf(HasSubstr(at(t)), HasSubstr("stored K4"), HasSubstr("declares K3")));
  EXPECT_NO_THROW(
      (void)load_moe_layer(Checkpoint::open(dir_.path()), kLayer, 0, 2, 4));  // rank 0 is fine
}

TEST_F(BadLoad, DimsNot128Aligned) {
  const auto t = name(1, Proj::kGate, "trellis");
  edit([&](TensorMap& m) { m[t] = filled(DType::kI16, {16, 4, 48}); });
  EXPECT_THAT(store_error(),
              AllOf(HasSubstr(at(t)), HasSubstr("256 x 64"), HasSubstr("not 128-aligned")));
}

TEST_F(BadLoad, ExpertShapeDiffersFromTheLayer) {
  const auto t = name(2, Proj::kGate, "trellis");
  const auto svh = name(2, Proj::kGate, "svh");
  edit([&](TensorMap& m) {
    m[t] = filled(DType::kI16, {16, 16, 48});
    m[svh] = filled(DType::kF16, {256}, 0x3C00);
  });
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr(at(t)),
                                  HasSubstr("expected 256 x 128 like the layer's other experts")));
}

TEST_F(BadLoad, SuhNotFp16) {
  const auto v = name(1, Proj::kGate, "suh");
  edit([&](TensorMap& m) { m[v] = filled(DType::kBF16, {256}, 0x3F80); });
  EXPECT_THAT(store_error(),
              AllOf(HasSubstr(at(v)), HasSubstr("BF16 [256]"), HasSubstr("must be F16 [256]")));
}

TEST_F(BadLoad, SvhWrongLength) {
  const auto v = name(1, Proj::kUp, "svh");
  edit([&](TensorMap& m) { m[v] = filled(DType::kF16, {256}, 0x3C00); });
  EXPECT_THAT(store_error(), AllOf(HasSubstr(at(v)), HasSubstr("must be F16 [128]")));
}

TEST_F(BadLoad, SuhNotRank1) {
  const auto v = name(1, Proj::kDown, "suh");
  edit([&](TensorMap& m) { m[v] = filled(DType::kF16, {1, 128}, 0x3C00); });
  EXPECT_THAT(store_error(), AllOf(HasSubstr(at(v)), HasSubstr("F16 [1, 128]")));
}

TEST_F(BadLoad, ScalesNotFinite) {
  const auto v = name(3, Proj::kDown, "svh");
  edit([&](TensorMap& m) { m[v] = filled(DType::kF16, {256}, 0x7C00); });
  EXPECT_THAT(store_error(), AllOf(HasSubstr(at(v)), HasSubstr("not finite")));
}

TEST_F(BadLoad, BothMcgAndMul1) {
  const auto prefix = expert_prefix(kLayer, 1, Proj::kUp, 0);
  edit([&](TensorMap& m) {
    m[prefix + ".mul1"] = filled(DType::kI32, {}, static_cast<uint32_t>(trellis::kMul1Marker));
  });
  EXPECT_THAT(store_error(), AllOf(HasSubstr(prefix), HasSubstr("both 'mcg' and 'mul1'")));
}

TEST_F(BadLoad, BadSentinel) {
  const auto v = name(2, Proj::kDown, "mcg");
  edit([&](TensorMap& m) { m[v] = filled(DType::kI32, {}, 1234); });
  EXPECT_THAT(store_error(),
              AllOf(HasSubstr(at(v)), HasSubstr("marker holds 1234"), HasSubstr("0xCBAC1FED")));
}

TEST_F(BadLoad, MarkerNotAnI32Scalar) {
  const auto v = name(2, Proj::kDown, "mcg");
  edit([&](TensorMap& m) {
    m[v] = filled(DType::kI32, {1}, static_cast<uint32_t>(trellis::kMcgMarker));
  });
  EXPECT_THAT(store_error(), AllOf(HasSubstr(at(v)), HasSubstr("I32 with shape []")));
}

TEST_F(BadLoad, MissingMcgMarker) {
  const auto prefix = expert_prefix(kLayer, 3, Proj::kGate, 0);
  edit([&](TensorMap& m) { m.erase(prefix + ".mcg"); });
  EXPECT_THAT(ckpt_error(),
              AllOf(HasSubstr(prefix), HasSubstr("no '.mcg' marker"), HasSubstr("3inst")));
}

TEST_F(BadLoad, Mul1InsteadOfMcg) {
  const auto prefix = expert_prefix(kLayer, 3, Proj::kGate, 0);
  edit([&](TensorMap& m) {
    m.erase(prefix + ".mcg");
    m[prefix + ".mul1"] = filled(DType::kI32, {}, static_cast<uint32_t>(trellis::kMul1Marker));
  });
  EXPECT_THAT(ckpt_error(),
              AllOf(HasSubstr(prefix), HasSubstr("a '.mul1' marker"), HasSubstr("codebook mcg")));
}

TEST_F(BadLoad, MissingExpertTensor) {
  const auto t = name(3, Proj::kDown, "trellis");
  edit([&](TensorMap& m) { m.erase(t); });
  EXPECT_THAT(ckpt_error(),
              AllOf(HasSubstr(t), HasSubstr("is missing"), HasSubstr("MoE layer 1, rank 0")));
}

TEST_F(BadLoad, MoreExpertsThanDeclared) {
  edit([&](TensorMap& m) {
    for (const char* f : {"trellis", "suh", "svh", "mcg"})
      m[name(4, Proj::kGate, f, 1)] = m.at(name(0, Proj::kGate, f, 1));
  });
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr(expert_prefix(kLayer, 4, Proj::kGate, 1)),
                                  HasSubstr("expert id 4 is outside 0..3")));
}

TEST_F(BadLoad, RankBeyondTp) {
  edit([&](TensorMap& m) {
    for (const char* f : {"trellis", "suh", "svh", "mcg"})
      m[name(0, Proj::kUp, f, 2)] = m.at(name(0, Proj::kUp, f, 1));
  });
  EXPECT_THAT(ckpt_error(),
              AllOf(HasSubstr(".rank2."), HasSubstr("rank 2 is outside 0..1 (tp 2)")));
}

TEST_F(BadLoad, ExpertBias) {
  const auto b = name(0, Proj::kDown, "bias", 1);
  edit([&](TensorMap& m) { m[b] = filled(DType::kF16, {256}, 0); });
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr(at(b)), HasSubstr("expert biases are not supported")));
}

TEST_F(BadLoad, UnknownExpertField) {
  const auto f = name(0, Proj::kDown, "scale", 1);
  edit([&](TensorMap& m) { m[f] = filled(DType::kF16, {256}, 0); });
  EXPECT_THAT(store_error(), AllOf(HasSubstr(at(f)), HasSubstr("unknown field 'scale'")));
}

TEST_F(BadLoad, UnslicedNameInRankSlicedCheckpoint) {
  const auto v = expert_prefix(kLayer, 0, Proj::kGate, -1) + ".suh";
  edit([&](TensorMap& m) { m[v] = filled(DType::kF16, {256}, 0x3C00); });
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr(at(v)), HasSubstr("is not in the schema")));
}

TEST_F(BadLoad, UnknownProjection) {
  const auto v = fmt::format("model.layers.{}.mlp.experts.0.w1.rank0.suh", kLayer);
  edit([&](TensorMap& m) { m[v] = filled(DType::kF16, {256}, 0x3C00); });
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr(at(v)), HasSubstr("unknown projection 'w1'")));
}

TEST_F(BadLoad, RankSlicedTensorsWithoutMetadata) {
  edit_config(
      dir_.path(), [](nlohmann::json& c) { c.erase("hybrid_tr3_tail"); }, true);
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr("rank-sliced expert"), HasSubstr("no hybrid_tr3_tail"),
                                  HasSubstr("refusing to guess")));
}

TEST_F(BadLoad, ModelGeometryDisagrees) {
  edit_config(
      dir_.path(), [](nlohmann::json& c) { c["moe_intermediate_size"] = 512; }, true);
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr("config.json"), HasSubstr("moe_intermediate_size 512"),
                                  HasSubstr("128 x TP 2")));
  edit_config(
      dir_.path(),
      [](nlohmann::json& c) {
        c["moe_intermediate_size"] = 256;
        c["hidden_size"] = 384;
      },
      true);
  EXPECT_THAT(ckpt_error(), HasSubstr("hidden_size 384"));
}

TEST_F(BadLoad, ActivationNotSilu) {
  edit_config(
      dir_.path(), [](nlohmann::json& c) { c["hidden_act"] = "gelu"; }, true);
  EXPECT_THAT(ckpt_error(), AllOf(HasSubstr("config.json"),
                                  HasSubstr("key 'hidden_act' is \"gelu\""), HasSubstr("SiLU")));
}

TEST_F(BadLoad, PlainExpertsMixingCodebooks) {
  write(RotationLayout::kPlain);
  const auto prefix = expert_prefix(kLayer, 2, Proj::kUp, -1);
  edit([&](TensorMap& m) {
    m.erase(prefix + ".mcg");
    m[prefix + ".mul1"] = filled(DType::kI32, {}, static_cast<uint32_t>(trellis::kMul1Marker));
  });
  EXPECT_THAT(ckpt_error(0, 1), AllOf(HasSubstr(prefix), HasSubstr("codebook mul1"),
                                      HasSubstr("one codebook per MoE layer")));
}

}  // namespace
}  // namespace exl3::moe
