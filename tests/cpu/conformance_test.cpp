// Golden vectors produced by exllamav3 itself (../shared/conformance/tensors): for each of the
// 24 codebook x K cases, W_hat bit-exact, the original-basis weight within 1e-6 relative, and the
// CPU forward within 1e-3 of the fp64 expectation. Plus the legacy packed-sign case.
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "exl3/cpu/linear.hpp"
#include "exl3/format/checkpoint.hpp"
#include "test_support.hpp"

namespace tr = exl3::trellis;

namespace {

struct Loaded {
  exl3::Checkpoint ckpt;
  std::string file;
};

const Loaded& open_case_file(const std::filesystem::path& dir, const std::string& cb) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto& slot = cache[cb];
  if (!slot) {
    const auto file = dir / "tensors" / fmt::format("exl3_public_{}.safetensors", cb);
    slot = std::make_unique<Loaded>(Loaded{exl3::Checkpoint::open(file), file.string()});
  }
  return *slot;
}

// Runs every check of one case (prefix "<name>" with ".layer", ".expected.*", ".input.x").
void check_case(const Loaded& f, const std::string& name, int expect_bits, tr::Codebook expect_cb) {
  const auto& store = f.ckpt.store();
  const auto data = exl3::Exl3LinearData::load(f.ckpt, name + ".layer");
  EXPECT_EQ(data.info().bits, expect_bits);
  EXPECT_EQ(data.info().codebook, expect_cb);
  const auto view = exl3::cpu::LinearView::of(data);

  const auto w_hat = exl3::cpu::reconstruct_w_hat(view);
  const auto expect_w_hat = exl3::copy_tensor<uint16_t>(store.at(name + ".expected.w_hat"));
  ASSERT_EQ(w_hat.size(), expect_w_hat.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < w_hat.size(); ++i) mismatches += w_hat[i] != expect_w_hat[i];
  EXPECT_EQ(mismatches, 0u) << name << ": W_hat differs from exllamav3's reconstruct";

  if (const auto* ew = store.find(name + ".expected.weight"); ew != nullptr) {
    const auto weight = exl3::cpu::reconstruct_weight(view);
    const auto expect = exl3::read_as_double(*ew);
    EXPECT_LE(exl3::test::rel_l2(std::span<const float>(weight), std::span<const double>(expect)), 1e-6) << name;
  }

  const auto& x = store.at(name + ".input.x");
  const int64_t m = x.info->shape[0];
  const auto x16 = exl3::copy_tensor<uint16_t>(x);
  std::vector<float> y(static_cast<size_t>(m * view.out_features), NAN);
  exl3::cpu::linear_forward(view, x16.data(), exl3::cpu::ActDType::kF16, m, y.data());
  const auto y64 = exl3::read_as_double(store.at(name + ".expected.y_fp64"));
  EXPECT_LE(exl3::test::rel_l2(std::span<const float>(y), std::span<const double>(y64)), 1e-3) << name;
  const auto y_peer = exl3::read_as_double(store.at(name + ".expected.y"));
  EXPECT_LE(exl3::test::rel_l2(std::span<const float>(y), std::span<const double>(y_peer)), 2e-3) << name;
}

}  // namespace

class Conformance : public ::testing::TestWithParam<std::tuple<tr::Codebook, int>> {};

TEST_P(Conformance, LinearCase) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto [cb, K] = GetParam();
  const std::string cbn = tr::codebook_name(cb);
  check_case(open_case_file(dir, cbn), fmt::format("cb_{}.k{}", cbn, K), K, cb);
}

INSTANTIATE_TEST_SUITE_P(AllCases, Conformance,
                         ::testing::Combine(::testing::Values(tr::Codebook::k3Inst, tr::Codebook::kMcg,
                                                              tr::Codebook::kMul1),
                                            ::testing::Range(1, 9)),
                         [](const auto& param_info) {
                           return fmt::format("{}_k{}", tr::codebook_name(std::get<0>(param_info.param)),
                                              std::get<1>(param_info.param));
                         });

TEST(ConformanceLegacy, PackedSignsCase) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto& f = open_case_file(dir, "3inst");
  const auto data = exl3::Exl3LinearData::load(f.ckpt, "legacy_3inst.k4.layer");
  EXPECT_EQ(data.info().rotation, exl3::Rotation::kSuSv);
  EXPECT_EQ(data.suh(), exl3::copy_tensor<uint16_t>(f.ckpt.store().at("legacy_3inst.k4.expected.suh")));
  EXPECT_EQ(data.svh(), exl3::copy_tensor<uint16_t>(f.ckpt.store().at("legacy_3inst.k4.expected.svh")));
  check_case(f, "legacy_3inst.k4", 4, tr::Codebook::k3Inst);
}
