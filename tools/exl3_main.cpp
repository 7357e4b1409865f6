// exl3: inspect, dequantize and run EXL3 (exllamav3 trellis) checkpoints.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <tbb/global_control.h>

#include "commands.hpp"
#include "exl3/error.hpp"

namespace {

// "<path>: <OS reason>; hint: ... (<what the library said>)".
std::string filesystem_error_message(const std::filesystem::filesystem_error& e) {
  std::string paths = e.path1().string();
  if (!e.path2().empty()) paths += (paths.empty() ? "" : " -> ") + e.path2().string();
  if (paths.empty()) paths = "file system";
  return fmt::format(
      "{}: {}; hint: check that the path exists, is the kind of file the command expects and is "
      "readable (for outputs: writable); pick another path otherwise ({})",
      paths, e.code().message(), e.what());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "exl3 — EXL3 trellis-quantized LLM engine.\n\n"
      "EXL3 stores each linear layer as 16x16 tiles of a tail-biting bitshift trellis (K = 1..8 "
      "bits per\n"
      "weight) between two Hadamard-128 rotations with per-channel scales (suh, svh). exl3 reads\n"
      "checkpoints written by exllamav3 bit-exactly.\n\n"
      "Examples:\n"
      "  exl3 inspect ./my-model-exl3                 list every EXL3 linear and tensor\n"
      "  exl3 inspect ./my-model-exl3 --json | jq .totals\n"
      "  exl3 dequant ./m --prefix model.layers.0.mlp.down_proj --out w.safetensors\n"
      "  exl3 linear ./m --prefix lm_head --input x.safetensors --out y.safetensors\n"
      "  exl3 sample ./demo-model                     write a small random EXL3 checkpoint\n"
      "  exl3 quantize ./hf-model ./model-exl3 --bits 4   convert a Hugging Face model\n"
      "  exl3 tokenize ./m --text 'Hello world'         token ids with the model's tokenizer\n"
      "  exl3 generate ./m --prompt 'Once upon a time'  stream text from the model (CPU runtime)\n"
      "  exl3 logits ./m --tokens 1,2,3 --out l.safetensors   logits of one forward pass\n"
      "  exl3 eval ./m --text builtin --reference ./hf  perplexity, KL and top-1 vs the source "
      "model\n"
      "  exl3 serve ./m --port 8000                       OpenAI-compatible HTTP server",
      "exl3"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "exl3 0.1.0");
  exl3::cli::Common common;
  app.add_option("--threads,-t", common.threads, "CPU worker threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);

  std::vector<std::pair<CLI::App*, exl3::cli::Runner>> cmds;
  auto reg = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    cmds.emplace_back(sub, adder(*sub, common));
  };
  reg("inspect", "List the EXL3 linears, unquantized tensors and model summary of a checkpoint",
      exl3::cli::add_inspect);
  reg("dequant",
      "Decode one EXL3 linear to its weight (original basis, F32) and W_hat (rotated, F16)",
      exl3::cli::add_dequant);
  reg("linear",
      "Run one EXL3 linear layer on inputs from a safetensors file (CPU reference or CUDA)",
      exl3::cli::add_linear);
  reg("sample", "Write a small synthetic EXL3 checkpoint (random valid trellis) and a sample input",
      exl3::cli::add_sample);
  reg("quantize", "Convert a Hugging Face model (safetensors) to an EXL3 checkpoint",
      exl3::cli::add_quantize);
  reg("sample-hf", "Write a small synthetic Hugging Face model (input for quantize)",
      exl3::cli::add_sample_hf);
  reg("bench", "Benchmarks (bench quant: encoder quality and speed)", exl3::cli::add_bench);
  reg("encode-tiles",
      "Run the trellis tile encoder (CPU or CUDA) on raw tiles from a safetensors file",
      exl3::cli::add_encode_tiles);
  reg("moe-bench",
      "Benchmark the fused CUDA MoE layer (synthetic experts) vs copy bandwidth and BF16 cuBLAS",
      exl3::cli::add_moe_bench);
  reg("tokenize",
      "Encode text (or a chat prompt) to token ids, or decode ids, with the model's tokenizer",
      exl3::cli::add_tokenize);
  reg("logits",
      "Run the model once over token ids and write the logits (F32) to a safetensors file",
      exl3::cli::add_logits);
  reg("generate", "Generate text from a prompt (streamed), greedy or sampled, with tokens/s",
      exl3::cli::add_generate);
  reg("serve", "Serve the model over an OpenAI-compatible HTTP API with continuous batching",
      exl3::cli::add_serve);
  reg("eval",
      "Perplexity over a text; with --reference also mean KL divergence and top-1 agreement",
      exl3::cli::add_eval);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  std::unique_ptr<tbb::global_control> threads;
  if (common.threads > 0) {
    threads = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                    static_cast<size_t>(common.threads));
  }
  try {
    for (auto& [sub, run] : cmds) {
      if (sub->parsed()) return run();
    }
  } catch (const exl3::Error& e) {
    fmt::print(stderr, "exl3: error: {}\n", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A file system failure that no write site turned into an exl3::Error (a folder that cannot
    // be read, created or removed, ...): the user's files or permissions, not a bug in exl3.
    fmt::print(stderr, "exl3: error: {}\n", filesystem_error_message(e));
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "exl3: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
