// `exl3 quantize`: convert a Hugging Face model folder into an EXL3 checkpoint (a thin front end
// over exl3::quant::convert_model; progress on stderr, summary or JSON on stdout).
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <unistd.h>

#include "commands.hpp"
#include "env_options.hpp"
#include "exl3/error.hpp"
#include "exl3/eval/builtin_text.hpp"
#include "exl3/format/architectures.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/quant/convert.hpp"

namespace exl3::cli {

namespace {

// The dense linears of a --dense-format run: each MXFP8 linear's error and bytes, then totals.
void print_dense_summary(const quant::ConvertResult& r) {
  constexpr double kMiB = 1024.0 * 1024.0;
  size_t mx = 0;
  for (const auto& t : r.reports) {
    if (!t.mxfp8) continue;
    if (mx++ == 0)
      fmt::print("{:<48} {:>10} {:>10} {:>12}\n", "MXFP8 linear", "rel-L2", "max-abs", "bytes");
    fmt::print("{:<48} {:>10.3e} {:>10.3e} {:>5.2f}->{:.2f} MiB\n", t.name, t.rel_l2, t.max_abs,
               t.source_bytes / kMiB, t.stored_bytes / kMiB);
  }
  fmt::print(
      "dense linears ({}): {} as MXFP8, {} unquantized; MXFP8 {:.2f} -> {:.2f} MiB (saved {:.2f} "
      "MiB)\n",
      quant::dense_format_name(r.dense_format), mx, r.dense_linears - static_cast<int64_t>(mx),
      r.mxfp8_source_bytes() / kMiB, r.mxfp8_bytes() / kMiB,
      (r.mxfp8_source_bytes() - r.mxfp8_bytes()) / kMiB);
}

}  // namespace

Runner add_quantize(CLI::App& app, Common& common) {
  struct Opts {
    std::string in, out;
    quant::ConvertOptions conv;
    std::string codebook = "mul1", out_scales = "always", device = "cpu", calibration = "none",
                dense_format = "exl3";
    uint64_t shard_mb = 8192;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("IN_DIR", o->in, "Hugging Face model folder (config.json + *.safetensors)")
      ->required();
  app.add_option("OUT_DIR", o->out, "Output folder for the EXL3 checkpoint")->required();
  app.add_option(
         "--bits,-b", o->conv.bits,
         "Target average bits per weight over the decoder linears (1..8, fractional allowed)")
      ->required()
      ->check(CLI::Range(1.0, 8.0));
  app.add_option("--head-bits", o->conv.head_bits,
                 "K for lm_head (1..8), or 16 to keep it unquantized")
      ->check(CLI::IsMember({1, 2, 3, 4, 5, 6, 7, 8, 16}))
      ->capture_default_str();
  app.add_option("--codebook", o->codebook, "Trellis codebook")
      ->check(CLI::IsMember({"mul1", "mcg", "3inst"}))
      ->capture_default_str();
  app.add_option("--out-scales", o->out_scales,
                 "Per-output-channel scales: always, never, or auto (skew test; needs calibration)")
      ->check(CLI::IsMember({"always", "never", "auto"}))
      ->capture_default_str();
  app.add_option("--device", o->device,
                 "Tile encoder: cpu (reference, ~150-300 tiles/s/core) or cuda (50-100k tiles/s on "
                 "an H200)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--threads,-t", common.threads, "CPU worker threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o->conv.seed,
                 "Seed of the random sign flips (per tensor, mixed with its name)")
      ->capture_default_str();
  app.add_option("--calibration", o->calibration,
                 "Calibration text: none (identity Hessian), builtin (the bundled calibration "
                 "corpus: prose, code, fifteen languages, maths, chat; never the text `exl3 eval "
                 "--text builtin` scores) or a UTF-8 text file; Hessians are captured layer by "
                 "layer with the CPU runtime")
      ->capture_default_str();
  app.add_option("--calibration-rows", o->conv.calibration_rows,
                 "Calibration sequences; 0 = as many as the text fills (at most 256)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--calibration-length", o->conv.calibration_length,
                 "Tokens per calibration sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--shard-size-mb", o->shard_mb,
                 "Maximum shard size in MiB (a module is never split)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
         "--g-scale", o->conv.g_scale,
         "Fixed global scale instead of the per-tensor search (0 = search; faster, slightly worse)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option(
         "--dense-format", o->dense_format,
         "Attention, dense-MLP and shared-expert linears: exl3 (trellis, in the --bits budget), "
         "bf16 "
         "(kept unquantized) or mxfp8 (stored MXFP8: loads with no --overlay; docs/mxfp8.md)")
      ->check(CLI::IsMember({"exl3", "bf16", "mxfp8"}))
      ->capture_default_str();
  app.add_option("--dense-ignore", o->conv.dense_ignore,
                 "With --dense-format mxfp8: keep this linear BF16 -- a prefix, a last name "
                 "component (k_proj) "
                 "or re:REGEX, as --overlay-ignore (repeatable)");
  app.add_flag(
      "--overwrite", o->conv.overwrite,
      "Replace a different model in OUT_DIR / discard an unfinished run with other settings");
  app.add_flag(
      "--json", o->json,
      "Print a JSON summary (tensors, bits, seconds, peak_rss_bytes, per-tensor proxy errors)");
  app.footer(
      "Supported: " + supported_architecture_names() +
      ".\nTensors are converted one at a time into OUT_DIR/.exl3-partial/; an\n"
      "interrupted run resumes when started again with the same settings. config.json is written\n"
      "last, so a folder that has it is complete.\n\n"
      "Calibration (--calibration builtin|FILE): the text is tokenized with IN_DIR's "
      "tokenizer.json and\n"
      "cut into rows x length tokens (by default as many rows of 512 as it fills: the bundled "
      "corpus\n"
      "whole, about 12k tokens, which gave a real model a quarter less KL than 8 x 128); each "
      "decoder\n"
      "layer runs on the CPU with its original weights to capture H = X^T X per linear, is "
      "quantized\n"
      "with LDLQ, and runs again quantized to feed the next layer. The hidden states (rows*length "
      "x\n"
      "hidden fp32) stay in memory and are saved after each layer, so an interrupted calibrated "
      "run\n"
      "resumes at the next layer. More text calibrates better: give a larger FILE if you have "
      "one.\n\n"
      "Examples:\n"
      "  exl3 quantize ./Qwen3-30B-A3B ./Qwen3-30B-A3B-exl3-4bpw --bits 4 --head-bits 6\n"
      "  exl3 quantize ./Qwen3-0.6B ./q3-3bpw --bits 3 --calibration builtin\n"
      "  exl3 quantize ./Llama-3.2-1B ./l-4bpw --bits 4 --calibration corpus.txt "
      "--calibration-rows 16 --calibration-length 256\n"
      "  exl3 quantize ./GLM-4.5-Air ./glm-3bpw-mx --bits 3 --dense-format mxfp8 --dense-ignore "
      "'re:.*\\.q_a_proj$'\n\n"
      "--dense-format mxfp8 writes the linears that `--overlay linear=mxfp8,shared_experts=mxfp8` "
      "would\n"
      "convert as MXFP8 (E4M3 + one power-of-two scale per 32 inputs, 8.25 bits per weight) with "
      "the\n"
      "runtime's codec, so the result runs exactly like the --dense-format bf16 checkpoint loaded "
      "with\n"
      "that --overlay; --bits then covers the routed experts (and nothing on a dense model). Each "
      "MXFP8\n"
      "linear's error against the source (rel-L2, max-abs) and the bytes saved are printed "
      "(--json: mxfp8).");
  return [o] {
    o->conv.codebook = *quant::parse_codebook(o->codebook);
    o->conv.device = quant::parse_device(o->device);
    if (!quant::encode_device_available(o->conv.device)) {
      fail("--device {}: no usable CUDA device in this build/machine; use --device cpu", o->device);
    }
    o->conv.out_scales = *quant::parse_out_scales(o->out_scales);
    o->conv.dense_format = *quant::parse_dense_format(o->dense_format);
    if (o->calibration == "none") {
      o->conv.calibration = quant::Calibration::kNone;
    } else {
      o->conv.calibration = quant::Calibration::kText;
      o->conv.calibration_label = o->calibration;
      o->conv.calibration_text = o->calibration == kBuiltinTextName
                                     ? std::string(builtin_calibration_text())
                                     : read_text_file(o->calibration);
    }
    o->conv.shard_size_bytes = o->shard_mb << 20;
    o->conv.progress = quant::make_progress_printer(stderr, ::isatty(2) != 0);
    o->conv.stop_after = quantize_stop_after_from_env();  // the tests' resume hook
    const auto r = quant::convert_model(o->in, o->out, o->conv);
    if (o->json) {
      fmt::print("{}\n", r.to_json().dump(2));
      return 0;
    }
    if (r.already_complete) {
      fmt::print("{} already holds this conversion ({:.2f} bits per weight); nothing to do\n",
                 r.out_dir.string(), r.bits_achieved);
      return 0;
    }
    fmt::print(
        "wrote {} ({}): {} tensors, {} EXL3 linears ({} resumed), {:.2f} bits per weight "
        "(target {:g}), head {}; {} shard(s), {:.1f} MiB; {:.1f} s, peak RSS {:.1f} MiB\n",
        r.out_dir.string(), r.architecture, r.tensors, r.quantized, r.resumed, r.bits_achieved,
        r.bits_target,
        r.head_bits == quant::kHeadBitsUnquantized ? std::string("unquantized")
                                                   : fmt::format("K={}", r.head_bits),
        r.num_shards, static_cast<double>(r.total_bytes) / (1 << 20), r.seconds,
        static_cast<double>(r.peak_rss_bytes) / (1 << 20));
    if (r.dense_linears > 0) print_dense_summary(r);
    return 0;
  };
}

}  // namespace exl3::cli
