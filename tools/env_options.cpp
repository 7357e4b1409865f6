// The CLI's environment reader (env_options.hpp).
#include "env_options.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

#include "exl3/cuda/launch.hpp"
#include "exl3/error.hpp"

namespace exl3::cli {

void env_positive_int(const char* name, int64_t& field) {
  const char* v = std::getenv(name);
  if (v == nullptr) return;
  const std::string s(v);
  if (s.find_first_not_of(" \t") == std::string::npos) return;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
  if (errno != 0 || end == s.c_str() || *end != '\0' || x <= 0) {
    fail("environment variable {}='{}' is not a positive integer (unset it or give e.g. {}=8)",
         name, s, name);
  }
  field = x;
}

namespace {

// A 0/1 switch: unset or blank keeps `field`.
void env_switch(const char* name, bool& field) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return;
  const std::string_view s(v);
  if (s != "0" && s != "1")
    fail("environment variable {}='{}' must be 0 or 1 (unset it or give {}=0)", name, s, name);
  field = s == "1";
}

}  // namespace

cuda::MoeOptions moe_options_from_env(cuda::MoeOptions base) {
  env_positive_int("EXL3_MOE_DECODE_MAX_M", base.decode_max_m);
  env_positive_int("EXL3_MOE_PREFILL_CHUNK", base.prefill_chunk);
  env_positive_int("EXL3_MOE_ARENA_MIB", base.arena_budget_mib);
  env_positive_int("EXL3_MOE_MIN_SPLIT_TILES", base.decode_min_split_tiles);
  env_positive_int("EXL3_MOE_PREFILL_GROUP", base.prefill_group);
  if (!cuda::moe_prefill_group_valid(base.prefill_group)) {
    fail("environment variable EXL3_MOE_PREFILL_GROUP={} must be {} or {} (unset it for automatic)",
         base.prefill_group, cuda::kMoePrefillGroup, cuda::kMoePrefillGroupGemm);
  }
  if (const char* v = std::getenv("EXL3_MOE_TIERS"); v != nullptr) {
    std::string s(v);
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t") + 1);
    if (s == "auto") {
      base.tiers = cuda::MoeOptions::Tiers::kAuto;
    } else if (s == "grid") {
      base.tiers = cuda::MoeOptions::Tiers::kGrid;
    } else if (s == "passes") {
      base.tiers = cuda::MoeOptions::Tiers::kPasses;
    } else if (!s.empty()) {
      fail(
          "environment variable EXL3_MOE_TIERS='{}' is not one of auto, grid, passes (unset it or "
          "give e.g. EXL3_MOE_TIERS=passes)",
          v);
    }
  }
  return base;
}

cuda::Mxfp8Options mxfp8_options_from_env(cuda::Mxfp8Options base) {
  env_positive_int("EXL3_MXFP8_GEMV_MAX_M", base.gemv_max_m);
  return base;
}

cuda::LinearOptions linear_options_from_env(cuda::LinearOptions base) {
  int64_t v = base.gemv_max_splits;
  env_positive_int("EXL3_GEMV_MAX_SPLITS", v);
  base.gemv_max_splits = static_cast<int>(std::min<int64_t>(v, 1024));
  v = base.gemv_min_split_tiles;
  env_positive_int("EXL3_GEMV_MIN_SPLIT_TILES", v);
  base.gemv_min_split_tiles = static_cast<int>(std::min<int64_t>(v, 1 << 20));
  env_switch("EXL3_GEMV_FUSED_ROTATION", base.gemv_fused_rotation);
  return base;
}

void engine_options_from_env(runtime::EngineOptions& eo) {
  if (eo.device != runtime::Device::kCuda) return;
  eo.moe = moe_options_from_env(eo.moe);
  eo.mxfp8 = mxfp8_options_from_env(eo.mxfp8);
  eo.linear = linear_options_from_env(eo.linear);
  if (const char* v = std::getenv("EXL3_PDL"); v != nullptr && *v != '\0') {
    bool on = true;
    env_switch("EXL3_PDL", on);
#if defined(EXL3_HAVE_CUDA)
    cuda::set_programmatic_launch(on);
#endif
  }
}

int64_t quantize_stop_after_from_env() {
  const char* env = std::getenv("EXL3_QUANTIZE_STOP_AFTER");
  if (env == nullptr || *env == '\0') return -1;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || v < 0)
    fail("EXL3_QUANTIZE_STOP_AFTER='{}' must be a non-negative integer", env);
  return v;
}

}  // namespace exl3::cli
