// The --tp option shared by the runtime commands (logits, generate, serve, bench model).
#pragma once

#include <CLI/CLI.hpp>

namespace exl3::cli {

inline void add_tp_option(CLI::App& app, int& tp) {
  app.add_option("--tp", tp,
                 "Tensor-parallel ranks. N > 1 runs N ranks in this process, each on its own thread with its\n"
                 "slice of the weights and KV heads: with --device cuda rank r drives GPU r (NCCL between\n"
                 "them; CUDA_VISIBLE_DEVICES picks the GPUs), with --device cpu they share the CPU. A TP that\n"
                 "would cut an EXL3 128-channel block is refused, naming the TP sizes that work")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
}

}  // namespace exl3::cli
