// One test per fail-closed check of the hybrid_tr3_tail metadata (docs/moe-layouts.md, What fails
// closed: Metadata) and of the tier bitmap it points to: each error names the file, the key and
// what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/format/checkpoint.hpp"
#include "exl3/moe/layout.hpp"
#include "moe_test_util.hpp"

namespace exl3::moe {
namespace {

using namespace test;
using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;

// A valid TP-2 mixed K3/K4 checkpoint (MoE layers 1..2, 4 experts); each test breaks one thing.
class BadMetadata : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = small_spec(RotationLayout::kPerExpert, 2);
    spec.last_layer = 2;
    spec.expert_bits = {3, 4, 3, 3};
    write_synthetic_moe(dir_.path(), spec);
  }
  std::string error() {
    return error_of([&] { (void)read_hybrid_tr3_tail(dir_.path()); });
  }
  // The error after setting hybrid_tr3_tail[key] = value (null removes the key).
  std::string error_with(const std::string& key, const json& value) {
    edit_config(dir_.path(), [&](json& t) {
      if (value.is_null()) {
        t.erase(key);
      } else {
        t[key] = value;
      }
    });
    return error();
  }
  std::string config() const { return (dir_ / "config.json").string(); }
  std::string key(const std::string& k) const { return "key 'hybrid_tr3_tail." + k + "'"; }
  std::string bitmap() const { return (dir_ / "tier_bitmap.json").string(); }
  std::string bitmap_error(const json& j) {
    write_json(dir_ / "tier_bitmap.json", j);
    return error();
  }
  TempDir dir_;
};

TEST_F(BadMetadata, ValidBaseline) {
  const auto layout = read_hybrid_tr3_tail(dir_.path());
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->bits_of(2), (std::vector<int>{3, 4, 3, 3}));
  // Through the opened checkpoint as well, and an absent block means no rank-sliced layout.
  EXPECT_EQ(read_moe_layout(Checkpoint::open(dir_.path()))->tp, 2);
  EXPECT_FALSE(parse_hybrid_tr3_tail(json::object(), dir_.path(), "cfg"));
}

TEST_F(BadMetadata, BlockNotAnObject) {
  edit_config(
      dir_.path(), [](json& c) { c["hybrid_tr3_tail"] = "exl3"; }, true);
  EXPECT_THAT(error(), AllOf(HasSubstr(config()), HasSubstr("key 'hybrid_tr3_tail'"),
                             HasSubstr("expected an object")));
}

TEST_F(BadMetadata, MissingRequiredKeys) {
  for (const char* k :
       {"format", "bits", "codebook", "experts_per_layer", "moe_layers", "tp", "tensor_schema"}) {
    SetUp();
    EXPECT_THAT(error_with(k, nullptr),
                AllOf(HasSubstr(config()), HasSubstr("missing required key(s) " + std::string(k))))
        << k;
  }
}

TEST_F(BadMetadata, FormatNotExl3Trellis) {
  EXPECT_THAT(error_with("format", "nvfp4"),
              AllOf(HasSubstr(config()), HasSubstr(key("format")), HasSubstr("'nvfp4'")));
}

TEST_F(BadMetadata, CodebookNotMcg) {
  EXPECT_THAT(error_with("codebook", "mul1"),
              AllOf(HasSubstr(key("codebook")), HasSubstr("must use 'mcg'"), HasSubstr("hint:")));
}

TEST_F(BadMetadata, BlankValue) {
  EXPECT_THAT(error_with("codebook", "  "), AllOf(HasSubstr(key("codebook")), HasSubstr("blank")));
}

TEST_F(BadMetadata, McgMultiplierNotTheLockedOne) {
  EXPECT_THAT(error_with("mcg_multiplier", 12345),
              AllOf(HasSubstr(key("mcg_multiplier")), HasSubstr("0xCBAC1FED")));
}

TEST_F(BadMetadata, MoeLayersNotAnOrderedRange) {
  for (const json& v :
       {json::array({3}), json::array({5, 3}), json::array({true, 4}), json::array({1.0, 2}),
        json::array({-1, 2}), json("3-77"), json::array({1, 2, 3})}) {
    SetUp();
    EXPECT_THAT(error_with("moe_layers", v), HasSubstr(key("moe_layers"))) << v.dump();
  }
}

TEST_F(BadMetadata, TensorSchemaNotExact) {
  EXPECT_THAT(error_with("tensor_schema", "model.layers.{L}.mlp.experts.{E}.{proj}.{trellis}"),
              AllOf(HasSubstr(key("tensor_schema")), HasSubstr("expected exactly")));
}

TEST_F(BadMetadata, UnknownRotationLayout) {
  EXPECT_THAT(error_with("rotation_layout", "shared_h_v2"),
              AllOf(HasSubstr(key("rotation_layout")), HasSubstr("unknown layout 'shared_h_v2'")));
}

TEST_F(BadMetadata, AbsentRotationLayoutIsPerExpert) {
  edit_config(dir_.path(), [](json& t) { t.erase("rotation_layout"); });
  EXPECT_EQ(read_hybrid_tr3_tail(dir_.path())->rotation, RotationLayout::kPerExpert);
}

TEST_F(BadMetadata, SharedHWithoutItsSchema) {
  EXPECT_THAT(error_with("rotation_layout", "shared_h_v1"),
              AllOf(HasSubstr(key("shared_h_tensor_schema")), HasSubstr("is missing")));
}

TEST_F(BadMetadata, SharedHSchemaWithoutSharedH) {
  EXPECT_THAT(error_with("shared_h_tensor_schema", std::string(kSharedHSchema)),
              AllOf(HasSubstr(key("shared_h_tensor_schema")), HasSubstr("declared together")));
}

TEST_F(BadMetadata, SharedHSchemaNotExact) {
  edit_config(dir_.path(), [](json& t) { t["rotation_layout"] = "shared_h_v1"; });
  EXPECT_THAT(error_with("shared_h_tensor_schema", "model.layers.{L}.shared_h.{proj}"),
              AllOf(HasSubstr(key("shared_h_tensor_schema")), HasSubstr("expected exactly")));
}

TEST_F(BadMetadata, ExpertsPerLayerNotAPositiveInteger) {
  for (const json& v : {json(0), json(-4), json(4.0), json("4"), json(true)}) {
    SetUp();
    EXPECT_THAT(error_with("experts_per_layer", v),
                AllOf(HasSubstr(key("experts_per_layer")), HasSubstr("positive integer")))
        << v.dump();
  }
}

TEST_F(BadMetadata, TpNotAPositiveInteger) {
  for (const json& v : {json(0), json(2.0), json("2"), json(false)}) {
    SetUp();
    EXPECT_THAT(error_with("tp", v), AllOf(HasSubstr(key("tp")), HasSubstr("positive integer")))
        << v.dump();
  }
}

TEST_F(BadMetadata, UniformBitsUnsupported) {
  for (const json& v : {json(3.42), json(7), json(2), json("three"), json(""), json(true)}) {
    SetUp();
    edit_config(dir_.path(), [](json& t) {
      t.erase("k_values");
      t.erase("bits_per_expert");
    });
    EXPECT_THAT(error_with("bits", v), HasSubstr(key("bits"))) << v.dump();
  }
}

TEST_F(BadMetadata, UniformBitsWithPerExpertKeysIsAmbiguous) {
  EXPECT_THAT(error_with("bits", 3), AllOf(HasSubstr(key("k_values")), HasSubstr("ambiguous")));
}

TEST_F(BadMetadata, MixedWithoutItsKeys) {
  EXPECT_THAT(error_with("bits_per_expert", nullptr),
              AllOf(HasSubstr(key("bits_per_expert")), HasSubstr("is missing")));
}

TEST_F(BadMetadata, MixedKValuesOutsideThreeToSix) {
  EXPECT_THAT(error_with("k_values", json::array({2, 3})),
              AllOf(HasSubstr(key("k_values")), HasSubstr("outside 3..6")));
  SetUp();
  EXPECT_THAT(error_with("k_values", json::array({3, 7})), HasSubstr("outside 3..6"));
}

TEST_F(BadMetadata, MixedKValuesNotTwoOrMoreDistinct) {
  EXPECT_THAT(error_with("k_values", json::array({3})),
              AllOf(HasSubstr(key("k_values")), HasSubstr("two or more")));
  SetUp();
  EXPECT_THAT(error_with("k_values", json::array({3, 3})), HasSubstr("repeats K3"));
  SetUp();
  EXPECT_THAT(error_with("k_values", "3,4"), HasSubstr("two or more"));
}

TEST_F(BadMetadata, BitsPerExpertNotAString) {
  EXPECT_THAT(error_with("bits_per_expert", 4),
              AllOf(HasSubstr(key("bits_per_expert")), HasSubstr("file.json:field")));
}

TEST_F(BadMetadata, BitsPerExpertBadSyntax) {
  for (const char* v : {"tier_bitmap.json", "tier_bitmap.json:", ":k", "../tier_bitmap.json:k",
                        "tier_bitmap.txt:k", "a.json:k:x", ""}) {
    SetUp();
    EXPECT_THAT(error_with("bits_per_expert", v),
                AllOf(HasSubstr(key("bits_per_expert")), HasSubstr("file.json:field")))
        << v;
  }
}

TEST_F(BadMetadata, TierBitmapMissing) {
  std::filesystem::remove(dir_ / "tier_bitmap.json");
  EXPECT_THAT(error(),
              AllOf(HasSubstr(bitmap()), HasSubstr("not found"), HasSubstr("bits_per_expert")));
}

TEST_F(BadMetadata, TierBitmapInvalidJson) {
  write_file(dir_ / "tier_bitmap.json", "{\"1\": ");
  EXPECT_THAT(error(), AllOf(HasSubstr(bitmap()), HasSubstr("invalid JSON")));
}

TEST_F(BadMetadata, TierBitmapMissingLayer) {
  EXPECT_THAT(bitmap_error({{"1", {{"k", {3, 4, 3, 3}}}}}),
              AllOf(HasSubstr(bitmap()), HasSubstr("no entry for MoE layer 2")));
}

TEST_F(BadMetadata, TierBitmapLayerOutsideMoeLayers) {
  EXPECT_THAT(bitmap_error({{"1", {{"k", {3, 4, 3, 3}}}},
                            {"2", {{"k", {3, 4, 3, 3}}}},
                            {"3", {{"k", {3, 4, 3, 3}}}}}),
              AllOf(HasSubstr(bitmap()), HasSubstr("key '3' is not a MoE layer")));
  EXPECT_THAT(bitmap_error({{"01", {{"k", {3, 4, 3, 3}}}}, {"2", {{"k", {3, 4, 3, 3}}}}}),
              HasSubstr("key '01'"));
}

TEST_F(BadMetadata, TierBitmapWrongLength) {
  EXPECT_THAT(bitmap_error({{"1", {{"k", {3, 4, 3}}}}, {"2", {{"k", {3, 4, 3, 3}}}}}),
              AllOf(HasSubstr(bitmap()), HasSubstr("layer '1'"), HasSubstr("array of 4 K values"),
                    HasSubstr("3 entries")));
}

TEST_F(BadMetadata, TierBitmapUndeclaredK) {
  EXPECT_THAT(
      bitmap_error({{"1", {{"k", {3, 4, 5, 3}}}}, {"2", {{"k", {3, 4, 3, 3}}}}}),
      AllOf(HasSubstr(bitmap()), HasSubstr("expert 2 has K 5"), HasSubstr("does not declare")));
}

TEST_F(BadMetadata, DeclaredKUsedByNoExpert) {
  EXPECT_THAT(
      bitmap_error({{"1", {{"k", {3, 3, 3, 3}}}}, {"2", {{"k", {3, 3, 3, 3}}}}}),
      AllOf(HasSubstr(bitmap()), HasSubstr("K4 is declared"), HasSubstr("used by no expert")));
}

TEST_F(BadMetadata, TierBitmapEntryAmbiguous) {
  EXPECT_THAT(bitmap_error({{"1", {{"k", {3, 4, 3, 3}}, {"tail_tr3", {0, 1, 2, 3}}}},
                            {"2", {{"k", {3, 4, 3, 3}}}}}),
              AllOf(HasSubstr("layer '1'"), HasSubstr("holds both"), HasSubstr("ambiguous")));
  EXPECT_THAT(bitmap_error({{"1", json::object()}, {"2", {{"k", {3, 4, 3, 3}}}}}),
              HasSubstr("holds neither"));
  EXPECT_THAT(
      bitmap_error({{"1", {{"k", {3, 4, 3, 3}}, {"note", "x"}}}, {"2", {{"k", {3, 4, 3, 3}}}}}),
      HasSubstr("unknown key 'note'"));
}

TEST_F(BadMetadata, TailTr3MeansUniformK3) {
  write_json(dir_ / "tier_bitmap.json",
             {{"1", {{"tail_tr3", {3, 2, 1, 0}}}}, {"2", {{"k", {3, 4, 4, 3}}}}});
  const auto layout = read_hybrid_tr3_tail(dir_.path());
  EXPECT_EQ(layout->bits_of(1), (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(layout->bits_of(2), (std::vector<int>{3, 4, 4, 3}));
}

TEST_F(BadMetadata, TailTr3NotEveryExpert) {
  EXPECT_THAT(bitmap_error({{"1", {{"tail_tr3", {0, 1, 2}}}}, {"2", {{"k", {3, 4, 3, 3}}}}}),
              AllOf(HasSubstr("'tail_tr3' must list every expert id 0..3 exactly once")));
  EXPECT_THAT(bitmap_error({{"1", {{"tail_tr3", {0, 1, 1, 3}}}}, {"2", {{"k", {3, 4, 3, 3}}}}}),
              HasSubstr("exactly once"));
}

TEST_F(BadMetadata, TailTr3NeedsDeclaredK3) {
  edit_config(dir_.path(), [](json& t) { t["k_values"] = {4, 5}; });
  EXPECT_THAT(bitmap_error({{"1", {{"tail_tr3", {0, 1, 2, 3}}}}, {"2", {{"k", {4, 5, 4, 4}}}}}),
              HasSubstr("'tail_tr3' means K3"));
}

TEST_F(BadMetadata, TrellisBitsByLayer) {
  edit_config(dir_.path(), [](json& t) {
    t.erase("k_values");
    t.erase("bits_per_expert");
    t["bits"] = 3;
    t["trellis_bits_by_layer"] = {{"1", 3}, {"2", 3}};
  });
  EXPECT_EQ(read_hybrid_tr3_tail(dir_.path())->bits_source, "trellis_bits_by_layer");
  EXPECT_THAT(
      error_with("trellis_bits_by_layer", {{"1", 3}}),
      AllOf(HasSubstr(key("trellis_bits_by_layer")), HasSubstr("no entry for MoE layer 2")));
  EXPECT_THAT(error_with("trellis_bits_by_layer", {{"1", 3}, {"2", 4}}),
              AllOf(HasSubstr("K4 disagrees with bits 3"), HasSubstr("ambiguous")));
  EXPECT_THAT(error_with("trellis_bits_by_layer", {{"1", 3}, {"2", 7}}),
              HasSubstr("not a supported K"));
}

TEST_F(BadMetadata, LegacyHybridWithNvfp4Experts) {
  EXPECT_THAT(error_with("tr3_tail_per_layer", 2),
              AllOf(HasSubstr(key("tr3_tail_per_layer")), HasSubstr("partial Trellis tail")));
  SetUp();
  EXPECT_THAT(error_with("nvfp4_keep_per_layer", 2),
              AllOf(HasSubstr(key("nvfp4_keep_per_layer")), HasSubstr("NVFP4")));
  SetUp();
  edit_config(dir_.path(), [](json& t) {
    t["tr3_tail_per_layer"] = 4;
    t["nvfp4_keep_per_layer"] = 0;
  });
  EXPECT_NO_THROW((void)read_hybrid_tr3_tail(dir_.path()));
}

TEST_F(BadMetadata, ModelExpertCountDisagrees) {
  edit_config(
      dir_.path(), [](json& c) { c["n_routed_experts"] = 8; }, true);
  EXPECT_THAT(error(), AllOf(HasSubstr(config()), HasSubstr("key 'n_routed_experts' is 8"),
                             HasSubstr("experts_per_layer is 4")));
}

}  // namespace
}  // namespace exl3::moe
