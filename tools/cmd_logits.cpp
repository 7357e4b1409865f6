// `exl3 logits`: one forward pass of the model runtime over given token ids; the logits go to a
// safetensors file (the format conformance data and other engines use).
#include <charconv>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "env_options.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"
#include "kv_cache_option.hpp"
#include "overlay_options.hpp"
#include "tp_option.hpp"

namespace exl3::cli {

namespace {

std::vector<int32_t> parse_token_list(const std::string& list) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < list.size()) {
    while (i < list.size() && (list[i] == ' ' || list[i] == ',')) ++i;
    if (i >= list.size()) break;
    int32_t v = 0;
    const auto [p, ec] = std::from_chars(list.data() + i, list.data() + list.size(), v);
    if (ec != std::errc() || v < 0 || (p != list.data() + list.size() && *p != ',' && *p != ' ')) {
      fail("--tokens: '{}' is not a comma-separated list of non-negative token ids", list);
    }
    ids.push_back(v);
    i = static_cast<size_t>(p - list.data());
  }
  if (ids.empty()) fail("--tokens: no token ids given");
  return ids;
}

}  // namespace

Runner add_logits(CLI::App& app, Common&) {
  struct Opts {
    OverlayArgs overlay;
    std::string model, tokens, out, device = "cpu";
    bool json = false;
    int64_t page_size = 32;
    int tp = 1;
    std::string kv_cache = "auto";
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model,
                 "Model folder: config.json + EXL3 *.safetensors (as exllamav3 writes it)")
      ->required();
  app.add_option("--tokens", o->tokens,
                 "Input token ids, comma-separated, e.g. --tokens 9707,1879,0")
      ->required();
  app.add_option("--out,-o", o->out,
                 "Output .safetensors file; receives `logits` (F32, [n_tokens, vocab_size])")
      ->required();
  app.add_option("--device", o->device,
                 "Compute device: cpu (the fp32 reference runtime) or cuda (the GPU kernels; EXL3 "
                 "experts and linears, decode steps as CUDA graphs)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--page-size", o->page_size,
                 "KV cache page size in tokens (results do not depend on it)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_tp_option(app, o->tp);
  add_kv_cache_option(app, o->kv_cache);
  add_overlay_options(app, o->overlay);
  app.add_flag("--json", o->json,
               "Print one JSON document (shape, argmax per position, seconds, out)");
  app.footer(
      "Runs the whole model once over the tokens (causal attention, no sampling) and writes the "
      "logits of\n"
      "every position, fp32. Everything is computed in fp32 on the CPU: EXL3 linears are decoded "
      "tile by\n"
      "tile (cpu::linear_forward), MoE layers route in fp32 and run their experts through "
      "exl3::moe.\n"
      "Compare against other engines with rel-L2 and per-position argmax.\n\n"
      "Examples:\n"
      "  exl3 logits ./Qwen3-30B-A3B-exl3 --tokens 9707,1879 --out logits.safetensors\n"
      "  exl3 logits ./m --tokens 1,2,3 --out tp4.safetensors --tp 4   # 4 ranks; same logits as "
      "--tp 1\n"
      "  exl3 logits ./m --tokens \"$(exl3 tokenize ./m --text 'Hello' --json | jq -r "
      "'.ids|join(\",\")')\" \\\n"
      "      --out l.safetensors --json | jq .argmax\n"
      "  exl3 logits ./m --tokens 1,2,3 --out l.safetensors --overlay "
      "linear=mxfp8,shared_experts=mxfp8 \\\n"
      "      --overlay-ignore 're:.*\\.q_a_proj$' --json | jq .overlay.saved_bytes\n\n"
      "--overlay converts the unquantized (BF16) attention, dense-MLP and shared-expert linears to "
      "MXFP8\n"
      "(E4M3 + one power-of-two scale per 32 inputs) as the model loads; the report gives each "
      "layer's\n"
      "rel-L2 error against its source and the memory saved (docs/mxfp8.md).\n\n"
      "Supported architectures: " +
      supported_architecture_names() + ".");
  return [o] {
    const auto ids = parse_token_list(o->tokens);
    runtime::EngineOptions eo;
    eo.load_progress = runtime::make_load_progress_printer(stderr, ::isatty(2) != 0);
    eo.device = runtime::parse_device(o->device);
    eo.page_size = o->page_size;
    eo.tp = o->tp;
    eo.kv_format = kv_cache_format(o->kv_cache);
    eo.overlay = overlay_policy(o->overlay);
    eo.cache_tokens = static_cast<int64_t>(ids.size());
    engine_options_from_env(eo);
    const auto t_load = std::chrono::steady_clock::now();
    auto engine = runtime::load_engine(std::filesystem::path(o->model), eo);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    const auto t0 = std::chrono::steady_clock::now();
    const auto logits = runtime::forward_logits(*engine, ids);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t n = static_cast<int64_t>(ids.size()), vocab = engine->spec().vocab_size;

    SafetensorsWriter w;
    w.add("logits", DType::kF32, {n, vocab}, std::span<const float>(logits));
    std::string list;
    for (size_t i = 0; i < ids.size(); ++i) list += (i ? "," : "") + std::to_string(ids[i]);
    w.set_metadata("tokens", list);
    w.set_metadata("model", o->model);
    w.set_metadata("device", o->device);
    w.set_metadata("tp", std::to_string(o->tp));
    w.set_metadata("producer", "exl3 logits");
    w.write(o->out);

    std::vector<int32_t> top(ids.size());
    for (int64_t t = 0; t < n; ++t) {
      top[static_cast<size_t>(t)] = runtime::argmax(std::span<const float>(logits).subspan(
          static_cast<size_t>(t * vocab), static_cast<size_t>(vocab)));
    }
    if (o->json) {
      const nlohmann::json j = {
          {"model", o->model},
          {"architecture", std::string(runtime::architecture_name(engine->spec().architecture))},
          {"device", o->device},
          {"tp", o->tp},
          {"spec", runtime::spec_summary(engine->spec())},
          {"tokens", ids},
          {"shape", {n, vocab}},
          {"argmax", top},
          {"load_seconds", load_s},
          {"seconds", secs},
          {"tokens_per_second", secs > 0 ? static_cast<double>(n) / secs : 0.0},
          {"out", o->out},
          {"overlay", engine->overlay_report().to_json()}};
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    print_overlay_summary(engine->overlay_report());
    fmt::print(
        "{}: {} tokens -> logits [{}, {}] F32 in {:.3f} s ({:.1f} tokens/s, load {:.2f} s) -> {}\n",
        runtime::architecture_name(engine->spec().architecture), n, n, vocab, secs,
        secs > 0 ? static_cast<double>(n) / secs : 0.0, load_s, o->out);
    fmt::print("{:>8} {:>8} {:>8} {:>12}\n", "position", "token", "argmax", "max logit");
    for (int64_t t = 0; t < n; ++t) {
      const auto k = static_cast<size_t>(t);
      fmt::print("{:>8} {:>8} {:>8} {:>12.5f}\n", t, ids[k], top[k],
                 logits[static_cast<size_t>(t * vocab + top[k])]);
    }
    return 0;
  };
}

}  // namespace exl3::cli
