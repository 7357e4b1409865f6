// The --kv-cache option shared by the runtime commands (generate, logits, serve, eval, bench model,
// bench serve).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "exl3/cpu/kv_codec.hpp"

namespace exl3::cli {

inline void add_kv_cache_option(CLI::App& app, std::string& name, const std::string& extra = {}) {
  app.add_option(
         "--kv-cache", name,
         "KV cache format: auto (the engine's own precision: fp32 on the CPU, fp16 on CUDA),\n"
         "fp8 (E4M3), q8 or q4 (signed integers): 8.5, 8.5 and 4.5 bits per channel, with an\n"
         "fp16 scale per 32 channels (q8 and q4 Hadamard-rotate keys per head), so a pool of\n"
         "--cache-tokens takes about 1/2, 1/2 and 1/4 of the fp16 memory on CUDA. Attention\n"
         "reads the codes directly. GQA models with a power-of-two head_dim (MLA keeps its\n"
         "latent cache at full precision)" +
             extra)
      ->check(CLI::IsMember({"auto", "fp8", "q8", "q4"}))
      ->capture_default_str();
}

// The format a checked --kv-cache value names.
inline cpu::KvFormat kv_cache_format(const std::string& name) {
  return cpu::parse_kv_format(name).value_or(cpu::KvFormat::kNative);
}

}  // namespace exl3::cli
