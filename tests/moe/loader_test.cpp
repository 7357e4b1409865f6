// Loading both rank-sliced layouts (uniform K3, mixed K3+K4 tiers) and plain exllamav3 experts:
// geometry, per-expert K, tier signatures, rank-only reads, and that shared_h_v1 stores one
// hidden-side row per projection (owned bytes) while decoding exactly like per_expert_v1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "exl3/format/checkpoint.hpp"
#include "exl3/format/synthetic.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/moe/reference.hpp"
#include "exl3/moe/router.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/trellis/half.hpp"
#include "moe_test_util.hpp"

namespace exl3::moe {
namespace {

using namespace test;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void expect_geometry(const MoeLayerWeights& w, int rank, int tp, int64_t i_loc) {
  EXPECT_EQ(w.layer, kLayer);
  EXPECT_EQ(w.rank, rank);
  EXPECT_EQ(w.tp, tp);
  EXPECT_EQ(w.hidden, 256);
  EXPECT_EQ(w.intermediate, i_loc);
  EXPECT_EQ(w.codebook, trellis::Codebook::kMcg);
  for (const auto& e : w.experts) {
    for (const auto* p : {&e.gate, &e.up}) {
      EXPECT_EQ(p->in_features, 256);
      EXPECT_EQ(p->out_features, i_loc);
    }
    EXPECT_EQ(e.down.in_features, i_loc);
    EXPECT_EQ(e.down.out_features, 256);
    for (const auto* p : {&e.gate, &e.up, &e.down}) {
      EXPECT_EQ(p->trellis.size(),
                static_cast<size_t>(p->in_features * p->out_features * p->bits / 16));
      EXPECT_EQ(p->suh.size(), static_cast<size_t>(p->in_features));
      EXPECT_EQ(p->svh.size(), static_cast<size_t>(p->out_features));
      EXPECT_NO_THROW(p->view(w.codebook).validate());
    }
  }
  EXPECT_TRUE(w.trellis_copies.empty());  // the writer's tensors are aligned: zero-copy views
}

TEST(MoeLoader, PerExpertUniformK3) {
  TempDir dir;
  write_synthetic_moe(dir.path(), small_spec(RotationLayout::kPerExpert, 2));
  const auto ckpt = Checkpoint::open(dir.path());
  const auto layout = read_moe_layout(ckpt);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->rotation, RotationLayout::kPerExpert);
  EXPECT_EQ(layout->tp, 2);
  EXPECT_EQ(layout->num_experts, 4);
  EXPECT_THAT(layout->layers, ElementsAre(1));
  EXPECT_THAT(layout->k_values, ElementsAre(3));
  EXPECT_FALSE(layout->mixed);
  EXPECT_EQ(layout->bits_source, "bits");
  for (int r = 0; r < 2; ++r) {
    const auto w = load_moe_layer(ckpt, kLayer, r, 2, 4);
    expect_geometry(w, r, 2, 128);
    EXPECT_EQ(w.rotation, RotationLayout::kPerExpert);
    EXPECT_EQ(w.rotations.h_rows, 4);
    EXPECT_EQ(format_tier_signature(w.tier_signature()), "((3,4))");
    EXPECT_THAT(w.tensors_read, Each(HasSubstr(fmt::format(".rank{}.", r))));
    EXPECT_EQ(w.tensors_read.size(), 4u * 3 * 4);  // trellis, suh, svh, mcg per projection
  }
}

TEST(MoeLoader, SharedHMixedK3K4Tiers) {
  TempDir dir;
  auto spec = small_spec(RotationLayout::kSharedH, 2);
  spec.num_experts = 8;
  spec.expert_bits = {3, 4, 3, 4, 3, 3, 4, 3};
  write_synthetic_moe(dir.path(), spec);
  const auto ckpt = Checkpoint::open(dir.path());
  const auto layout = read_moe_layout(ckpt);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->rotation, RotationLayout::kSharedH);
  EXPECT_TRUE(layout->mixed);
  EXPECT_THAT(layout->k_values, ElementsAre(3, 4));
  EXPECT_EQ(layout->bits_source, "tier_bitmap.json:k");
  EXPECT_EQ(layout->bits_of(kLayer), spec.expert_bits);
  for (int r = 0; r < 2; ++r) {
    const auto w = load_moe_layer(ckpt, kLayer, r, 2, 8);
    expect_geometry(w, r, 2, 128);
    EXPECT_EQ(format_tier_signature(w.tier_signature()), "((3,5),(4,3))");
    for (size_t e = 0; e < 8; ++e) EXPECT_EQ(w.experts[e].bits(), spec.expert_bits[e]);
    // One physical hidden-side row per projection, shared by every expert.
    EXPECT_EQ(w.rotations.h_rows, 1);
    for (const auto& e : w.experts) {
      EXPECT_EQ(e.gate.suh.data(), w.rotations.gate_suh.data());
      EXPECT_EQ(e.up.suh.data(), w.rotations.up_suh.data());
      EXPECT_EQ(e.down.svh.data(), w.rotations.down_svh.data());
    }
    EXPECT_THAT(w.tensors_read, Each(HasSubstr(fmt::format(".rank{}.", r))));
    EXPECT_THAT(w.tensors_read, ::testing::Contains(shared_h_name(kLayer, Proj::kDown, r)));
  }
}

// Discovery borrows the shared row for validation and Exl3LinearData for decoding, without
// counting the row's bytes against every expert.
TEST(MoeLoader, SharedHExpertsOpenAsLinears) {
  TempDir dir;
  write_synthetic_moe(dir.path(), small_spec(RotationLayout::kSharedH, 2));
  const auto ckpt = Checkpoint::open(dir.path());
  const auto prefix = expert_prefix(kLayer, 2, Proj::kGate, 1);
  const auto& info = ckpt.linear(prefix);
  EXPECT_EQ(info.bytes, 256u / 16 * (128 / 16) * 48 * 2 + 128 * 2 + 4);  // trellis, svh, mcg
  const auto data = Exl3LinearData::load(ckpt, prefix);
  EXPECT_EQ(data.suh(),
            copy_tensor<uint16_t>(ckpt.store().at(shared_h_name(kLayer, Proj::kGate, 1))));
}

TEST(MoeLoader, SharedHOwnsOneRowPerProjection) {
  TempDir shared_dir, per_dir;
  auto spec = small_spec(RotationLayout::kSharedH, 2);
  spec.num_experts = 8;
  spec.shared_h_values = true;
  write_synthetic_moe(shared_dir.path(), spec);
  spec.rotation = RotationLayout::kPerExpert;
  write_synthetic_moe(per_dir.path(), spec);  // same values, expanded per expert
  const auto shared = load_moe_layer(Checkpoint::open(shared_dir.path()), kLayer, 0, 2, 8);
  const auto per = load_moe_layer(Checkpoint::open(per_dir.path()), kLayer, 0, 2, 8);
  const uint64_t e = 8, h = 256, i = 128;
  EXPECT_EQ(per.owned_bytes(), e * (3 * h + 3 * i) * 2);
  EXPECT_EQ(shared.owned_bytes(), (3 * h + e * 3 * i) * 2);
  EXPECT_EQ(per.owned_bytes() - shared.owned_bytes(), (e - 1) * 3 * h * 2);  // shared-H saving
  EXPECT_EQ(shared.trellis_bytes(), per.trellis_bytes());

  // Same numbers, so the two layouts decode bit-identically.
  for (size_t x = 0; x < 8; ++x) {
    EXPECT_TRUE(std::ranges::equal(shared.experts[x].gate.suh, per.experts[x].gate.suh));
    EXPECT_TRUE(std::ranges::equal(shared.experts[x].down.suh, per.experts[x].down.suh));
  }
  const int64_t m = 5;
  const auto xs = random_normal(static_cast<size_t>(m * 256));
  const auto routes = route_softmax(random_normal(static_cast<size_t>(m * 8)), m, 8, {.top_k = 2});
  std::vector<float> a(xs.size()), b(xs.size());
  moe_forward(shared, routes, xs.data(), m, a.data());
  moe_forward(per, routes, xs.data(), m, b.data());
  EXPECT_EQ(a, b);
}

// Rank 1's shard is garbage (non-finite scales, a trellis of the wrong K): rank 0 still loads
// from a bare store, reading nothing of rank 1; rank 1 fails closed.
TEST(MoeLoader, ReadsOnlyTheLocalRank) {
  TempDir dir;
  auto spec = small_spec(RotationLayout::kPerExpert, 2);
  spec.one_file_per_rank = true;
  write_synthetic_moe(dir.path(), spec);
  const auto shard1 = dir / "model-rank1.safetensors";
  edit_tensors(shard1, [](TensorMap& m) {
    for (auto& [name, t] : m) {
      if (name.ends_with(".suh") || name.ends_with(".svh"))
        t = filled(DType::kF16, t.shape, 0x7E00);
    }
  });
  const auto store = TensorStore::open(dir.path());
  const auto layout = read_hybrid_tr3_tail(dir.path());
  ASSERT_TRUE(layout);
  const auto w = load_moe_layer(store, *layout, kLayer, 0, 2, 4);
  expect_geometry(w, 0, 2, 128);
  EXPECT_THAT(w.tensors_read, Each(HasSubstr(".rank0.")));
  for (const auto& f : w.mapped_files) EXPECT_NE(f->path(), shard1);
  EXPECT_THAT(error_of([&] { load_moe_layer(store, *layout, kLayer, 1, 2, 4); }),
              AllOf(HasSubstr(shard1.string()), HasSubstr(".rank1.suh"), HasSubstr("not finite")));
  // Whole-checkpoint discovery validates every rank, so it refuses the folder.
  EXPECT_THAT(error_of([&] { (void)Checkpoint::open(dir.path()); }), HasSubstr("rank1"));
}

TEST(MoeLoader, PlainExllamav3Experts) {
  TempDir dir;
  auto spec = small_spec(RotationLayout::kPlain, 1);
  spec.expert_bits = {3, 4, 4, 3};
  write_synthetic_moe(dir.path(), spec);
  const auto ckpt = Checkpoint::open(dir.path());
  const auto layout = read_moe_layout(ckpt);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->rotation, RotationLayout::kPlain);
  EXPECT_EQ(layout->tp, 1);
  EXPECT_EQ(layout->bits_source, "tensors");
  EXPECT_THAT(layout->k_values, ElementsAre(3, 4));
  const auto w = load_moe_layer(ckpt, kLayer, 0, 1, 4);
  expect_geometry(w, 0, 1, 256);
  EXPECT_EQ(w.rotation, RotationLayout::kPlain);
  EXPECT_EQ(format_tier_signature(w.tier_signature()), "((3,2),(4,2))");
  EXPECT_THAT(w.tensors_read, Each(::testing::Not(HasSubstr(".rank"))));
  EXPECT_THAT(error_of([&] { load_moe_layer(ckpt, kLayer, 0, 2, 4); }),
              HasSubstr("plain experts load on one rank"));
}

// exllamav3 gives each projection its own K: the loader keeps them, the tier is K 0.
TEST(MoeLoader, PlainPerProjectionK) {
  TempDir dir;
  write_synthetic_moe(dir.path(), small_spec(RotationLayout::kPlain, 1));
  const auto file = dir / "model.safetensors";
  const auto name = expert_prefix(kLayer, 1, Proj::kDown, -1) + ".trellis";
  edit_tensors(file, [&](TensorMap& m) { m[name] = filled(DType::kI16, {16, 16, 80}, 0x1234); });
  const auto ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(read_moe_layout(ckpt)->bits_of(kLayer), (std::vector<int>{3, 0, 3, 3}));
  const auto w = load_moe_layer(ckpt, kLayer, 0, 1, 4);
  EXPECT_EQ(w.experts[1].down.bits, 5);
  EXPECT_EQ(w.experts[1].bits(), 0);
  EXPECT_EQ(format_tier_signature(w.tier_signature()), "((0,1),(3,3))");
}

TEST(MoeLoader, LegacyPackedSignsInPlainExperts) {
  TempDir dir;
  write_synthetic_moe(dir.path(), small_spec(RotationLayout::kPlain, 1));
  const auto prefix = expert_prefix(kLayer, 0, Proj::kUp, -1);
  edit_tensors(dir / "model.safetensors", [&](TensorMap& m) {
    m.erase(prefix + ".suh");
    m.erase(prefix + ".svh");
    m[prefix + ".su"] = filled(DType::kI16, {256 / 16}, 0x0002);  // channel 1 negative
    m[prefix + ".sv"] = filled(DType::kI16, {256 / 16}, 0x0005);  // channels 0 and 2 negative
  });
  const auto w = load_moe_layer(Checkpoint::open(dir.path()), kLayer, 0, 1, 4);
  const auto& up = w.experts[0].up;
  EXPECT_EQ(up.suh[0], 0x3C00);
  EXPECT_EQ(up.suh[1], 0xBC00);
  EXPECT_EQ(up.svh[0], 0xBC00);
  EXPECT_EQ(up.svh[1], 0x3C00);
  EXPECT_EQ(up.svh[2], 0xBC00);
  EXPECT_EQ(up.svh[16], 0xBC00);
}

TEST(MoeLoader, NoExpertsNoLayout) {
  TempDir dir;
  SyntheticSpec s;
  s.num_experts = 0;
  s.num_layers = 1;
  write_synthetic_checkpoint(dir.path(), s);
  const auto ckpt = Checkpoint::open(dir.path());
  EXPECT_FALSE(read_moe_layout(ckpt));
  EXPECT_THAT(error_of([&] { load_moe_layer(ckpt, 0, 0, 1, 4); }), HasSubstr("no MoE experts"));
}

}  // namespace
}  // namespace exl3::moe
