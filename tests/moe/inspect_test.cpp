// `exl3 inspect` on MoE checkpoints: layout, TP, ranks present and tiers in --json and text.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "moe_test_util.hpp"

namespace exl3::moe {
namespace {

using namespace test;
using ::testing::HasSubstr;

TEST(MoeInspect, SharedHMixedTiers) {
  TempDir dir;
  auto spec = small_spec(RotationLayout::kSharedH, 2);
  spec.num_experts = 8;
  spec.last_layer = 2;
  spec.expert_bits = {3, 4, 3, 4, 3, 3, 4, 3};
  write_synthetic_moe(dir.path(), spec);
  auto r = run_cli("inspect --json " + shell_quote(dir.path()));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["moe"]["layout"], "shared_h_v1");
  EXPECT_EQ(j["moe"]["tp"], 2);
  EXPECT_EQ(j["moe"]["experts_per_layer"], 8);
  EXPECT_EQ(j["moe"]["mixed"], true);
  EXPECT_EQ(j["moe"]["k_values"], nlohmann::json::array({3, 4}));
  EXPECT_EQ(j["moe"]["bits_source"], "tier_bitmap.json:k");
  ASSERT_EQ(j["moe_layers"].size(), 2u);
  for (const auto& m : j["moe_layers"]) {
    EXPECT_EQ(m["layout"], "shared_h_v1");
    EXPECT_EQ(m["ranks_present"], 2);
    EXPECT_EQ(m["num_experts"], 8);
    EXPECT_EQ(m["tier_signature_text"], "((3,5),(4,3))");
    EXPECT_EQ(m["tier_signature"], nlohmann::json::parse("[[3,5],[4,3]]"));
  }
  r = run_cli("inspect " + shell_quote(dir.path()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("layout shared_h_v1, TP 2, 8 experts/layer, 2 MoE layer(s), mixed "
                               "K3,K4 (from tier_bitmap.json:k)"));
  EXPECT_THAT(r.out, HasSubstr("shared_h_v1, TP 2 (2 ranks present), tiers ((3,5),(4,3))"));
  EXPECT_THAT(r.out, HasSubstr("experts.shared_h.gate_proj.rank1.suh"));
}

TEST(MoeInspect, PerExpertMissingRankAndPlain) {
  TempDir dir;
  auto spec = small_spec(RotationLayout::kPerExpert, 2);
  spec.one_file_per_rank = true;
  write_synthetic_moe(dir.path(), spec);
  // Drop rank 1 (a partial download): inspect still describes the layer and shows 1 rank.
  std::filesystem::remove(dir / "model-rank1.safetensors");
  auto index = read_json(dir / "model.safetensors.index.json");
  auto& wm = index["weight_map"];
  for (auto it = wm.begin(); it != wm.end();)
    it = it.value() == "model-rank1.safetensors" ? wm.erase(it) : std::next(it);
  write_json(dir / "model.safetensors.index.json", index);
  auto r = run_cli("inspect --json " + shell_quote(dir.path()));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["moe"]["layout"], "per_expert_v1");
  EXPECT_EQ(j["moe_layers"][0]["ranks_present"], 1);
  EXPECT_EQ(j["moe_layers"][0]["tier_signature_text"], "((3,4))");

  TempDir plain;
  write_synthetic_moe(plain.path(), small_spec(RotationLayout::kPlain, 1));
  r = run_cli("inspect --json " + shell_quote(plain.path()));
  ASSERT_EQ(r.code, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["moe"]["layout"], "plain");
  EXPECT_EQ(j["moe"]["tp"], 1);
  EXPECT_EQ(j["moe_layers"][0]["layout"], "plain");
}

TEST(MoeInspect, BadMetadataFailsClosed) {
  TempDir dir;
  write_synthetic_moe(dir.path(), small_spec(RotationLayout::kPerExpert, 2));
  edit_config(dir.path(), [](nlohmann::json& t) { t["rotation_layout"] = "diagonal"; });
  const auto r = run_cli("inspect " + shell_quote(dir.path()));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("unknown layout 'diagonal'"));
}

}  // namespace
}  // namespace exl3::moe
