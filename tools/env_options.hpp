// The environment variables of the exl3 CLI. The library reads none: each command reads the ones
// it needs here once, while it builds its options (runtime::EngineOptions, cuda::MoeOptions,
// cuda::Mxfp8Options, quant::ConvertOptions), and a library user sets those fields instead.
// docs/environment.md lists every variable.
#pragma once

#include <cstdint>

#include "exl3/cuda/plan.hpp"
#include "exl3/runtime/engine.hpp"

namespace exl3::cli {

// Sets `field` from the positive integer in environment variable `name`; unset or blank leaves
// it. Anything else throws exl3::Error naming the variable and its value.
void env_positive_int(const char* name, int64_t& field);

// `base` with EXL3_MOE_DECODE_MAX_M, EXL3_MOE_PREFILL_CHUNK, EXL3_MOE_ARENA_MIB,
// EXL3_MOE_MIN_SPLIT_TILES (positive integers), EXL3_MOE_PREFILL_GROUP (32 or 128) and
// EXL3_MOE_TIERS (auto | grid | passes) applied. Blank values count as unset; anything else throws
// exl3::Error naming the variable.
cuda::MoeOptions moe_options_from_env(cuda::MoeOptions base = {});

// `base` with EXL3_MXFP8_GEMV_MAX_M (a positive integer; the layer checks its range) applied:
// the GEMV / cuBLAS crossover. Blank counts as unset; anything else throws naming the variable.
cuda::Mxfp8Options mxfp8_options_from_env(cuda::Mxfp8Options base = {});
// EXL3_GEMV_MAX_SPLITS, EXL3_GEMV_MIN_SPLIT_TILES (the EXL3 GEMV's split-K bounds) and
// EXL3_GEMV_FUSED_ROTATION (0 or 1) over `base`.
cuda::LinearOptions linear_options_from_env(cuda::LinearOptions base = {});

// For --device cuda: eo.moe, eo.mxfp8 and eo.linear from the environment, as above. The CPU engine
// has no such tunables (and never read them, so a malformed value must not stop it): nothing is
// read.
void engine_options_from_env(runtime::EngineOptions& eo);

// EXL3_QUANTIZE_STOP_AFTER, the quantizer's test hook (quant::ConvertOptions::stop_after): a
// non-negative integer, or -1 (off) when unset or empty. Anything else throws naming it.
int64_t quantize_stop_after_from_env();

}  // namespace exl3::cli
