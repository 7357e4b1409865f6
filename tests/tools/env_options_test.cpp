// The CLI's environment reader (tools/env_options.hpp): good values, blank values (unset), and
// garbage failing with an error that names the variable and its value. CPU only: the library
// reads no environment, so these need neither a GPU nor the exl3 binary.
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "env_options.hpp"
#include "exl3/cuda/launch.hpp"
#include "exl3/error.hpp"
#include "test_support.hpp"

namespace {

using exl3::cuda::MoeOptions;
using exl3::cuda::Mxfp8Options;
using testing::HasSubstr;

// Sets (or, with nullptr, unsets) one variable for a scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void set(const char* value) {
    if (value != nullptr) {
      ::setenv(name_, value, 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

using exl3::test::error_of;

TEST(EnvOptions, MoeOverridesAreValidated) {
  ScopedEnv decode("EXL3_MOE_DECODE_MAX_M", "16");
  ScopedEnv chunk("EXL3_MOE_PREFILL_CHUNK", "  ");  // blank = unset
  ScopedEnv arena("EXL3_MOE_ARENA_MIB", nullptr);
  ScopedEnv tiers("EXL3_MOE_TIERS", nullptr);
  MoeOptions base;
  base.capacity = 77;  // not a variable: passes through
  const MoeOptions o = exl3::cli::moe_options_from_env(base);
  EXPECT_EQ(o.capacity, 77);
  EXPECT_EQ(o.decode_max_m, 16);
  EXPECT_EQ(o.prefill_chunk, 0);
  EXPECT_EQ(o.arena_budget_mib, MoeOptions{}.arena_budget_mib);
  EXPECT_EQ(o.tiers, MoeOptions::Tiers::kAuto);

  arena.set(" 64 ");  // surrounding blanks are allowed
  EXPECT_EQ(exl3::cli::moe_options_from_env().arena_budget_mib, 64);
  chunk.set("12x");
  EXPECT_THAT(error_of([] { exl3::cli::moe_options_from_env(); }),
              HasSubstr("EXL3_MOE_PREFILL_CHUNK='12x' is not a positive integer"));
  chunk.set("-3");
  EXPECT_THAT(error_of([] { exl3::cli::moe_options_from_env(); }),
              HasSubstr("EXL3_MOE_PREFILL_CHUNK='-3' is not a positive integer"));
  chunk.set("0");
  EXPECT_THAT(error_of([] { exl3::cli::moe_options_from_env(); }),
              HasSubstr("EXL3_MOE_PREFILL_CHUNK='0'"));
  chunk.set("99999999999999999999");  // out of range
  EXPECT_THAT(error_of([] { exl3::cli::moe_options_from_env(); }),
              HasSubstr("EXL3_MOE_PREFILL_CHUNK"));
  chunk.set(nullptr);
  decode.set("eight");
  EXPECT_THAT(error_of([] { exl3::cli::moe_options_from_env(); }),
              HasSubstr("EXL3_MOE_DECODE_MAX_M='eight' is not a positive integer"));
}

TEST(EnvOptions, MoeTiersAreOneOfThreeWords) {
  ScopedEnv tiers("EXL3_MOE_TIERS", " passes ");
  EXPECT_EQ(exl3::cli::moe_options_from_env().tiers, MoeOptions::Tiers::kPasses);
  tiers.set("grid");
  EXPECT_EQ(exl3::cli::moe_options_from_env().tiers, MoeOptions::Tiers::kGrid);
  MoeOptions grid;
  grid.tiers = MoeOptions::Tiers::kGrid;
  tiers.set("auto");
  EXPECT_EQ(exl3::cli::moe_options_from_env(grid).tiers, MoeOptions::Tiers::kAuto);
  tiers.set("");  // blank = unset: the base stays
  EXPECT_EQ(exl3::cli::moe_options_from_env(grid).tiers, MoeOptions::Tiers::kGrid);
  tiers.set("fast");
  EXPECT_THAT(error_of([] { exl3::cli::moe_options_from_env(); }),
              HasSubstr("EXL3_MOE_TIERS='fast' is not one of auto, grid, passes"));
}

TEST(EnvOptions, MoePrefillGroupIs32Or128) {
  ScopedEnv group("EXL3_MOE_PREFILL_GROUP", "128");
  EXPECT_EQ(exl3::cli::moe_options_from_env().prefill_group, 128);
  group.set(" 32 ");
  EXPECT_EQ(exl3::cli::moe_options_from_env().prefill_group, 32);
  group.set(nullptr);
  EXPECT_EQ(exl3::cli::moe_options_from_env().prefill_group, 0);  // automatic
  group.set("64");
  EXPECT_THAT(error_of([] { exl3::cli::moe_options_from_env(); }),
              HasSubstr("EXL3_MOE_PREFILL_GROUP=64 must be 32 or 128"));
}

TEST(EnvOptions, Mxfp8GemvCrossover) {
  ScopedEnv gemv("EXL3_MXFP8_GEMV_MAX_M", "8");
  Mxfp8Options base;
  base.max_m = 123;
  const Mxfp8Options o = exl3::cli::mxfp8_options_from_env(base);
  EXPECT_EQ(o.gemv_max_m, 8);
  EXPECT_EQ(o.max_m, 123);
  gemv.set(" ");
  EXPECT_EQ(exl3::cli::mxfp8_options_from_env().gemv_max_m, Mxfp8Options{}.gemv_max_m);
  gemv.set(nullptr);
  EXPECT_EQ(exl3::cli::mxfp8_options_from_env().gemv_max_m, Mxfp8Options{}.gemv_max_m);
  gemv.set("lots");
  EXPECT_THAT(error_of([] { exl3::cli::mxfp8_options_from_env(); }),
              HasSubstr("EXL3_MXFP8_GEMV_MAX_M='lots' is not a positive integer"));
}

// The engine commands read the CUDA tunables for --device cuda only: the CPU engine never read
// them, so a malformed value must not stop it.
TEST(EnvOptions, EngineOptionsOnCudaOnly) {
  ScopedEnv tiers("EXL3_MOE_TIERS", "passes");
  ScopedEnv gemv("EXL3_MXFP8_GEMV_MAX_M", "4");
  exl3::runtime::EngineOptions cuda;
  cuda.device = exl3::runtime::Device::kCuda;
  exl3::cli::engine_options_from_env(cuda);
  EXPECT_EQ(cuda.moe.tiers, MoeOptions::Tiers::kPasses);
  EXPECT_EQ(cuda.mxfp8.gemv_max_m, 4);

  gemv.set("garbage");
  exl3::runtime::EngineOptions cpu;
  exl3::cli::engine_options_from_env(cpu);
  EXPECT_EQ(cpu.moe.tiers, MoeOptions::Tiers::kAuto);
  EXPECT_EQ(cpu.mxfp8.gemv_max_m, Mxfp8Options{}.gemv_max_m);
  EXPECT_THAT(error_of([&] { exl3::cli::engine_options_from_env(cuda); }),
              HasSubstr("EXL3_MXFP8_GEMV_MAX_M='garbage'"));
}

TEST(EnvOptions, LinearOptions) {
  ScopedEnv splits("EXL3_GEMV_MAX_SPLITS", "6");
  ScopedEnv tiles("EXL3_GEMV_MIN_SPLIT_TILES", "3");
  ScopedEnv fused("EXL3_GEMV_FUSED_ROTATION", "0");
  const auto o = exl3::cli::linear_options_from_env();
  EXPECT_EQ(o.gemv_max_splits, 6);
  EXPECT_EQ(o.gemv_min_split_tiles, 3);
  EXPECT_FALSE(o.gemv_fused_rotation);
  fused.set("1");
  EXPECT_TRUE(exl3::cli::linear_options_from_env().gemv_fused_rotation);
  fused.set("");
  exl3::cuda::LinearOptions on;
  on.gemv_fused_rotation = true;
  EXPECT_TRUE(exl3::cli::linear_options_from_env(on).gemv_fused_rotation) << "blank = unset";
  fused.set("yes");
  EXPECT_THAT(error_of([] { exl3::cli::linear_options_from_env(); }),
              HasSubstr("EXL3_GEMV_FUSED_ROTATION='yes' must be 0 or 1"));
  splits.set("0");
  EXPECT_THAT(error_of([] { exl3::cli::linear_options_from_env(); }),
              HasSubstr("EXL3_GEMV_MAX_SPLITS='0' is not a positive integer"));
}

TEST(EnvOptions, ProgrammaticLaunchSwitch) {
  ScopedEnv pdl("EXL3_PDL", "maybe");
  exl3::runtime::EngineOptions cpu;
  exl3::cli::engine_options_from_env(cpu);  // the CPU engine reads none of them
  exl3::runtime::EngineOptions cuda;
  cuda.device = exl3::runtime::Device::kCuda;
  EXPECT_THAT(error_of([&] { exl3::cli::engine_options_from_env(cuda); }),
              HasSubstr("EXL3_PDL='maybe' must be 0 or 1"));
  pdl.set("0");
  exl3::cli::engine_options_from_env(cuda);
#if defined(EXL3_HAVE_CUDA)
  EXPECT_FALSE(exl3::cuda::programmatic_launch());
#endif
  pdl.set("1");
  exl3::cli::engine_options_from_env(cuda);
#if defined(EXL3_HAVE_CUDA)
  EXPECT_TRUE(exl3::cuda::programmatic_launch());
#endif
}

TEST(EnvOptions, QuantizeStopAfter) {
  ScopedEnv stop("EXL3_QUANTIZE_STOP_AFTER", nullptr);
  EXPECT_EQ(exl3::cli::quantize_stop_after_from_env(), -1);
  stop.set("");  // empty = unset
  EXPECT_EQ(exl3::cli::quantize_stop_after_from_env(), -1);
  stop.set("3");
  EXPECT_EQ(exl3::cli::quantize_stop_after_from_env(), 3);
  stop.set("0");  // stop before the first tensor
  EXPECT_EQ(exl3::cli::quantize_stop_after_from_env(), 0);
  for (const char* bad : {"x", "-1", "3 tensors"}) {
    stop.set(bad);
    EXPECT_THAT(error_of([] { exl3::cli::quantize_stop_after_from_env(); }),
                HasSubstr("EXL3_QUANTIZE_STOP_AFTER='" + std::string(bad) +
                          "' must be a non-negative integer"));
  }
}

}  // namespace
