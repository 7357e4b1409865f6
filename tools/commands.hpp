// The `exl3` CLI: each command registers its options on a CLI11 subcommand and returns a
// callback that runs it. Commands are thin: parse, call the library, print.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace exl3::cli {

using Runner = std::function<int()>;

// Options every command shares.
struct Common {
  int threads = 0;  // 0 = all cores
};

Runner add_inspect(CLI::App& app, Common& common);
Runner add_dequant(CLI::App& app, Common& common);
Runner add_linear(CLI::App& app, Common& common);
Runner add_sample(CLI::App& app, Common& common);
Runner add_quantize(CLI::App& app, Common& common);
Runner add_sample_hf(CLI::App& app, Common& common);
Runner add_bench(CLI::App& app, Common& common);
Runner add_encode_tiles(CLI::App& app, Common& common);  // group: `bench quant`, later gemm/model
Runner add_moe_bench(CLI::App& app, Common& common);
Runner add_bench_model(CLI::App& app, Common& common);  // `bench model`
Runner add_bench_serve(CLI::App& app, Common& common);  // `bench serve`
Runner add_tokenize(CLI::App& app, Common& common);
Runner add_logits(CLI::App& app, Common& common);    // model runtime
Runner add_generate(CLI::App& app, Common& common);
Runner add_eval(CLI::App& app, Common& common);      // perplexity / KL vs a reference
Runner add_serve(CLI::App& app, Common& common);     // OpenAI-compatible server (src/server)

}  // namespace exl3::cli
