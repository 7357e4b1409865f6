// Tensor-parallel slicing rules on model descriptions alone: column/row kinds, head padding, kv
// replication, block dealing, vocab split, and every fail-closed check (EXL3 block cuts with the
// working TP sizes listed, rank-sliced TP mismatches, TP out of range).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/model/tp_plan.hpp"
#include "runtime_test_util.hpp"
#include "test_support.hpp"

namespace exl3::model {
namespace test = exl3::runtime::test;  // the tiny-checkpoint writers of the runtime tests
namespace {

using ::testing::HasSubstr;

ModelSpec spec_of(nlohmann::json patch, const std::string& arch = "LlamaForCausalLM") {
  auto c = test::base_config(arch);
  c.merge_patch(patch);
  return describe_model(test::config_of(c), "m/config.json");
}

// Every EXL3-able prefix of a spec marked EXL3 (what a fully quantized checkpoint stores).
TpWeightInfo all_exl3(const ModelSpec& s) {
  TpWeightInfo w;
  w.exl3.insert(s.lm_head);
  for (const auto& l : s.layers) {
    const auto& a = std::get<GqaAttentionSpec>(l.attention);
    for (const char* p : {".q_proj", ".k_proj", ".v_proj", ".o_proj"}) w.exl3.insert(a.prefix + p);
    if (const auto* d = std::get_if<DenseMlpSpec>(&l.mlp)) {
      for (const char* p : {".gate_proj", ".up_proj", ".down_proj"}) w.exl3.insert(d->prefix + p);
    }
  }
  return w;
}

std::vector<int64_t> counts(const std::vector<Extent>& v) {
  std::vector<int64_t> out;
  for (const auto& e : v) out.push_back(e.count);
  return out;
}

// Extents tile [0, n) in rank order with no gap or overlap.
void expect_partition(const std::vector<Extent>& v, int64_t n) {
  int64_t at = 0;
  for (const auto& e : v) {
    EXPECT_EQ(e.begin, std::min(at, n));
    at = e.end();
  }
  EXPECT_EQ(at, n);
}

TEST(TpPlan, DealExtentsInWholeBlocks) {
  EXPECT_EQ(deal_extents(512, 3, 128), (std::vector<Extent>{{0, 256}, {256, 128}, {384, 128}}));
  EXPECT_EQ(deal_extents(500, 4, 128), (std::vector<Extent>{{0, 128}, {128, 128}, {256, 128}, {384, 116}}));
  EXPECT_EQ(deal_extents(256, 3, 128), (std::vector<Extent>{{0, 128}, {128, 128}, {256, 0}}));
  EXPECT_EQ(deal_extents(10, 4, 1), (std::vector<Extent>{{0, 3}, {3, 3}, {6, 2}, {8, 2}}));
  auto rng = exl3::test::make_rng();
  for (int i = 0; i < 200; ++i) {
    const int64_t n = static_cast<int64_t>(rng() % 5000);
    const int tp = 1 + static_cast<int>(rng() % 24);
    const int64_t block = rng() & 1 ? 128 : 1;
    const auto v = deal_extents(n, tp, block);
    ASSERT_EQ(v.size(), static_cast<size_t>(tp));
    expect_partition(v, n);
    for (const auto& e : v) {
      if (e.empty()) continue;  // trailing ranks with nothing sit at the end
      EXPECT_EQ(e.begin % block, 0);
      if (e.end() != n) {
        EXPECT_EQ(e.count % block, 0);
      }
    }
  }
  EXPECT_THROW(deal_extents(10, 0, 1), Error);
}

TEST(TpPlan, KindsAndExtentsOfADenseModel) {
  const auto s = spec_of({{"head_dim", 128}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}});
  const auto p = plan_tensor_parallel(s, 2, all_exl3(s));
  ASSERT_EQ(p.layers.size(), 4u);
  const auto& a = p.layers[0].attention;
  EXPECT_EQ(a.q.split, TpSplit::kColumn);
  EXPECT_EQ(a.k.split, TpSplit::kColumn);
  EXPECT_EQ(a.v.split, TpSplit::kColumn);
  EXPECT_EQ(a.o.split, TpSplit::kRow);
  EXPECT_TRUE(a.q.exl3);
  EXPECT_EQ(a.q.ranks, (std::vector<Extent>{{0, 256}, {256, 256}}));
  EXPECT_EQ(a.o.ranks, a.q.ranks);
  EXPECT_EQ(a.k.ranks, (std::vector<Extent>{{0, 128}, {128, 128}}));
  EXPECT_EQ(a.kv_replicas, 1);
  const auto& m = std::get<TpMlpPlan>(p.layers[0].mlp);
  EXPECT_EQ(m.ranks, (std::vector<Extent>{{0, 256}, {256, 256}}));
  EXPECT_EQ(p.vocab, (std::vector<Extent>{{0, 256}, {256, 256}}));
  EXPECT_EQ(p.lm_head.split, TpSplit::kColumn);
  EXPECT_EQ(tp_split_name(TpSplit::kRow), "row");
  const auto j = tp_plan_summary(p);
  EXPECT_EQ(j["tp"], 2);
  EXPECT_EQ(j["layers"][0]["q_heads"][1][0], 2);
}

TEST(TpPlan, KvHeadsReplicateWhenTpExceedsThem) {
  const auto s = spec_of({{"head_dim", 128}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}});
  const auto p = plan_tensor_parallel(s, 4, all_exl3(s));
  const auto& a = p.layers[0].attention;
  EXPECT_EQ(a.q_heads, (std::vector<Extent>{{0, 1}, {1, 1}, {2, 1}, {3, 1}}));
  EXPECT_EQ(a.kv_heads, (std::vector<Extent>{{0, 1}, {0, 1}, {1, 1}, {1, 1}}));
  EXPECT_EQ(a.kv_replicas, 2);
  // Unquantized: 8 kv heads at TP 16 on 32 heads.
  const auto s2 = spec_of({{"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"hidden_size", 2048}});
  const auto p2 = plan_tensor_parallel(s2, 16, {});
  EXPECT_EQ(p2.layers[0].attention.kv_replicas, 2);
  EXPECT_EQ(p2.layers[0].attention.kv_heads[15], (Extent{7, 1}));
}

TEST(TpPlan, AttentionHeadsArePadded) {
  // Kimi-style 96 heads: TP9 -> 99, TP10 -> 100, TP8 / TP16 -> 96 (docs/tensor-parallel.md, Heads).
  const auto s = spec_of({{"num_attention_heads", 96}, {"num_key_value_heads", 8}, {"hidden_size", 1024}, {"head_dim", 64}});
  const std::pair<int, int64_t> cases[] = {{9, 99}, {10, 100}, {8, 96}, {16, 96}, {3, 96}, {7, 98}};
  for (const auto& [tp, padded] : cases) {
    const auto p = plan_tensor_parallel(s, tp, {});
    const auto& a = p.layers[0].attention;
    EXPECT_EQ(a.padded_heads, padded) << "TP " << tp;
    expect_partition(a.q_heads, 96);
    for (int r = 0; r < tp; ++r) {
      const auto& q = a.q_heads[static_cast<size_t>(r)];
      const auto& kv = a.kv_heads[static_cast<size_t>(r)];
      if (q.empty()) continue;
      EXPECT_LE(q.count, padded / tp);
      EXPECT_EQ(kv.begin, q.begin / 12);                 // every local q head finds its kv head
      EXPECT_EQ(kv.end(), (q.end() - 1) / 12 + 1);
    }
  }
  // TP9: ranks 0..7 hold 11 heads, rank 8 the last 8 real ones plus 3 padding heads.
  const auto p9 = plan_tensor_parallel(s, 9, {});
  EXPECT_EQ(counts(p9.layers[0].attention.q_heads), (std::vector<int64_t>{11, 11, 11, 11, 11, 11, 11, 11, 8}));
  // Rank 1 (heads 11..21) straddles kv heads 0 and 1.
  EXPECT_EQ(p9.layers[0].attention.kv_heads[1], (Extent{0, 2}));
}

TEST(TpPlan, Exl3HeadCutFailsNamingLayerAndWorkingSizes) {
  // head_dim 64: at TP 4 one q head per rank is half a Hadamard block of q_proj / o_proj.
  const auto s = spec_of({{"head_dim", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}});
  const auto w = all_exl3(s);
  try {
    plan_tensor_parallel(s, 4, w);
    FAIL() << "expected a block-cut error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("m/config.json (model.layers.0.self_attn.q_proj: TP 4 gives rank 0 its q heads = "
                                    "output channels [0, 64) of 256, which cuts a 128-channel EXL3 block"));
    EXPECT_THAT(e.what(), HasSubstr("TP sizes that work for this model: 1, 2, 3"));
  }
  EXPECT_EQ(working_tp_sizes(s, w, 8), (std::vector<int>{1, 2, 3}));
  // Unquantized, the same model splits anywhere that keeps heads whole.
  EXPECT_NO_THROW(plan_tensor_parallel(s, 4, {}));
  EXPECT_EQ(working_tp_sizes(s, {}, 8), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
  // Only o_proj EXL3: the row-parallel cut is named.
  auto w2 = w;
  w2.exl3.clear();
  for (const auto& l : s.layers) w2.exl3.insert(std::get<GqaAttentionSpec>(l.attention).prefix + ".o_proj");
  EXPECT_THAT([&] { plan_tensor_parallel(s, 4, w2); },
              ::testing::ThrowsMessage<Error>(HasSubstr("o_proj: TP 4 gives rank 0 its q heads = input channels [0, 64)")));
}

TEST(TpPlan, Exl3KvSlicesCoverWholeBlocks) {
  // One 64-wide kv head per rank at TP 2: each rank computes the 128-channel block holding both
  // kv heads (replicating its neighbour's) instead of cutting it.
  const auto s = spec_of({{"head_dim", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}});
  const auto p = plan_tensor_parallel(s, 2, all_exl3(s));
  const auto& a = p.layers[0].attention;
  EXPECT_EQ(a.kv_heads, (std::vector<Extent>{{0, 1}, {1, 1}}));
  EXPECT_EQ(a.k.ranks, (std::vector<Extent>{{0, 128}, {0, 128}}));
  EXPECT_EQ(a.v.ranks, a.k.ranks);
  EXPECT_EQ(a.q.ranks, (std::vector<Extent>{{0, 128}, {128, 128}}));
  // Unquantized k/v are cut exactly at the heads.
  const auto pu = plan_tensor_parallel(s, 2, {});
  EXPECT_EQ(pu.layers[0].attention.k.ranks, (std::vector<Extent>{{0, 64}, {64, 64}}));
}

TEST(TpPlan, MoeExpertsDealtInBlocksOrFixedByTheCheckpoint) {
  const auto s = spec_of({{"moe_intermediate_size", 384}}, "Qwen3MoeForCausalLM");
  auto p = plan_tensor_parallel(s, 2, {});
  const auto& m = std::get<TpMoePlan>(p.layers[0].mlp);
  EXPECT_FALSE(m.rank_sliced);
  EXPECT_EQ(m.ranks, (std::vector<Extent>{{0, 256}, {256, 128}}));
  TpWeightInfo sliced;
  sliced.checkpoint_tp = 3;
  p = plan_tensor_parallel(s, 3, sliced);
  const auto& m3 = std::get<TpMoePlan>(p.layers[0].mlp);
  EXPECT_TRUE(m3.rank_sliced);
  EXPECT_EQ(m3.ranks, (std::vector<Extent>{{0, 128}, {128, 128}, {256, 128}}));
  EXPECT_THAT([&] { plan_tensor_parallel(s, 2, sliced); },
              ::testing::ThrowsMessage<Error>(::testing::AllOf(
                  HasSubstr("rank-sliced for TP 3"), HasSubstr("runtime asks for TP 2"), HasSubstr("never reshuffled"),
                  HasSubstr("TP sizes that work for this model: 1, 3"))));
}

TEST(TpPlan, RejectsTpOutOfRange) {
  const auto s = spec_of(nlohmann::json::object());
  EXPECT_THAT([&] { plan_tensor_parallel(s, 0, {}); }, ::testing::ThrowsMessage<Error>(HasSubstr("TP 0 is outside 1..64")));
  EXPECT_THROW(plan_tensor_parallel(s, 65, {}), Error);
  const auto p = plan_tensor_parallel(s, 1, all_exl3(s));
  EXPECT_EQ(p.vocab, (std::vector<Extent>{{0, 512}}));
}

}  // namespace
}  // namespace exl3::model
