// `exl3 eval`: perplexity of a model over a text, and against a reference model the mean KL
// divergence and top-1 agreement (a thin front end over exl3::evaluate_text; progress on stderr).
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "env_options.hpp"
#include "exl3/error.hpp"
#include "exl3/eval/builtin_text.hpp"
#include "exl3/eval/eval.hpp"
#include "exl3/runtime/engine.hpp"
#include "kv_cache_option.hpp"
#include "overlay_options.hpp"

namespace exl3::cli {
namespace {

// Bytes of a model folder's safetensors files.
uint64_t weight_bytes(const std::filesystem::path& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") n += e.file_size();
  return n;
}

// config.json's quantization_config.bits (an EXL3 checkpoint's target bits per weight), if any.
std::optional<double> quantized_bits(const std::filesystem::path& dir) {
  std::ifstream f(dir / "config.json");
  const auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("quantization_config")) return std::nullopt;
  const auto& q = j["quantization_config"];
  if (!q.is_object() || !q.contains("bits") || !q["bits"].is_number()) return std::nullopt;
  return q["bits"].get<double>();
}

}  // namespace

Runner add_eval(CLI::App& app, Common&) {
  struct Opts {
    std::vector<std::string> models;
    std::string text, reference, device = "cpu";
    EvalOptions eval;
    OverlayArgs overlay;
    std::string kv_cache = "auto";
    bool json = false, quiet = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->models,
                 "Model folder: config.json, weights (EXL3 or unquantized), tokenizer.json; "
                 "several score one after another on the same text, one table line each")
      ->required();
  app.add_option("--text", o->text,
                 "UTF-8 text file to score, or `builtin` for the text bundled with exl3")
      ->required();
  app.add_option("--reference,-r", o->reference,
                 "Reference model folder (e.g. the unquantized source): adds mean KL(reference || "
                 "model), top-1 "
                 "agreement and its perplexity; needs the same vocabulary");
  app.add_option("--context,-c", o->eval.context,
                 "Window length in tokens (capped by max_position_embeddings and the text length)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--stride", o->eval.stride,
                 "Tokens between window starts, 1..context; 0 = context (disjoint windows). With a "
                 "smaller stride "
                 "every scored token keeps at least context - stride tokens of history (slower)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-tokens,-n", o->eval.max_tokens,
                 "Evaluate only the first N tokens of the text (0 = all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--device", o->device,
                 "Compute device for both models: cpu (the fp32 reference runtime) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  add_overlay_options(app, o->overlay);  // the model only, never the reference
  add_kv_cache_option(app, o->kv_cache,
                      ".\nThe model only: the reference keeps auto, so --reference the same folder "
                      "measures the cache's KL");
  app.add_flag("--json", o->json,
               "Print one JSON document (perplexity, nll, reference: kl, top1_agreement, ...)");
  app.add_flag("--quiet,-q", o->quiet, "No progress on stderr");
  app.footer(
      "Tokenizes the text with MODEL's tokenizer, cuts it into windows of --context tokens every "
      "--stride\n"
      "tokens, and scores each token after the first of the stream once (disjoint windows: each "
      "window's\n"
      "first token only gives context). Log-softmax and KL are computed in fp64 from the fp32 "
      "logits:\n"
      "  perplexity = exp(mean over tokens of -log p_model(next token))\n"
      "  KL         = mean over tokens of sum_v p_ref(v) log(p_ref(v) / p_model(v))   (nats)\n"
      "  top-1      = share of positions where both models' most likely next token is the same\n"
      "A quantized model is good when its KL to the unquantized model is small (and its top-1 "
      "high):\n"
      "unlike perplexity, KL compares the whole distributions and needs no good text.\n\n"
      "Examples:\n"
      "  exl3 eval ./Qwen3-8B-exl3-4bpw --text wiki.txt\n"
      "  exl3 eval ./Qwen3-8B-exl3-4bpw --text builtin --reference ./Qwen3-8B\n"
      "  exl3 eval ./m --text notes.txt --context 512 --stride 256 --max-tokens 4096 --json | jq "
      ".reference.kl\n"
      "  exl3 eval ./q2 ./q3 ./q4 --text book.txt --reference ./Qwen3-8B   # one line per model\n\n"
      "  exl3 eval ./Qwen3-8B --text builtin --reference ./Qwen3-8B --overlay linear=mxfp8   # "
      "KL(BF16 || MXFP8)\n"
      "  exl3 eval ./m --text book.txt --reference ./m --kv-cache q4 --context 16384 --device cuda"
      "   # the q4 cache's KL\n\n"
      "--overlay (and --overlay-config / --overlay-ignore) converts MODEL's unquantized attention, "
      "dense-MLP\n"
      "and shared-expert linears to MXFP8 at load, never the reference's: with the same folder as "
      "both, the\n"
      "KL is what the overlay costs; the memory it saves is printed (--json: overlay).\n\n"
      "`--text builtin` is a few KB of English prose, code, JSON and tables written for exl3 (use "
      "./builtin\n"
      "for a file of that name). Both models run on --device; the reference can be an unquantized\n"
      "Hugging Face folder (BF16/FP16/FP32 safetensors) of a supported architecture.");
  return [o] {
    const std::string text = load_eval_text(o->text);
    const std::string label = o->text == kBuiltinTextName ? std::string("builtin text") : o->text;
    auto evaluate_one = [&](const std::string& model) {
      EvalModels models;
      models.model = model;
      if (!o->reference.empty()) models.reference = o->reference;
      models.device = runtime::parse_device(o->device);
      models.overlay = overlay_policy(o->overlay);
      models.kv_format = kv_cache_format(o->kv_cache);
      if (models.device == runtime::Device::kCuda) {  // the CPU engine has no such tunables
        models.moe = moe_options_from_env();
        models.mxfp8 = mxfp8_options_from_env();
      }
      EvalProgressFn progress;
      if (!o->quiet) {
        if (o->models.size() > 1) fmt::print(stderr, "exl3 eval: {}\n", model);
        progress = make_eval_progress_printer(stderr, ::isatty(2) != 0);
        models.load_progress = runtime::make_load_progress_printer(stderr, ::isatty(2) != 0);
      }
      return evaluate_text(models, text, o->eval, progress, label);
    };
    auto model_json = [&](const std::string& model, const EvalResult& r) {
      nlohmann::json j = r.to_json();
      j["model"] = model;
      j["reference_model"] =
          o->reference.empty() ? nlohmann::json(nullptr) : nlohmann::json(o->reference);
      j["text"] = o->text;
      j["text_bytes"] = text.size();
      j["device"] = o->device;
      j["weight_bytes"] = weight_bytes(model);
      const auto bits = quantized_bits(model);
      j["bits"] = bits ? nlohmann::json(*bits) : nlohmann::json(nullptr);
      return j;
    };

    if (o->models.size() > 1) {  // one line per model
      std::vector<EvalResult> results;
      for (const auto& m : o->models) results.push_back(evaluate_one(m));
      if (o->json) {
        nlohmann::json all = nlohmann::json::array();
        for (size_t i = 0; i < results.size(); ++i)
          all.push_back(model_json(o->models[i], results[i]));
        fmt::print("{}\n", nlohmann::json{{"models", all}}.dump(2));
        return 0;
      }
      const EvalResult& first = results.front();
      fmt::print("text       {} ({} bytes, {} tokens, {} evaluated, {} predictions scored)\n",
                 label, text.size(), first.text_tokens, first.tokens, first.scored);
      if (first.reference) fmt::print("reference  {}\n", o->reference);
      fmt::print("{:<40} {:>10} {:>6} {:>11} {:>10} {:>7}\n", "model", "MiB", "bits", "perplexity",
                 first.reference ? "KL" : "", first.reference ? "top-1" : "");
      for (size_t i = 0; i < results.size(); ++i) {
        const EvalResult& r = results[i];
        const auto bits = quantized_bits(o->models[i]);
        fmt::print("{:<40} {:>10.2f} {:>6} {:>11.4f}", o->models[i],
                   static_cast<double>(weight_bytes(o->models[i])) / (1024.0 * 1024.0),
                   bits ? fmt::format("{:.2f}", *bits) : std::string("-"), r.perplexity);
        if (r.reference) {
          fmt::print(" {:>10.6f} {:>6.2f}%", r.reference->kl, 100.0 * r.reference->top1_agreement);
        }
        fmt::print("\n");
      }
      return 0;
    }

    const std::string& model = o->models.front();
    const EvalResult r = evaluate_one(model);
    if (o->json) {
      fmt::print("{}\n", model_json(model, r).dump(2));
      return 0;
    }
    fmt::print("model      {}\n", model);
    if (r.reference) fmt::print("reference  {}\n", o->reference);
    fmt::print("text       {} ({} bytes, {} tokens, {} evaluated)\n", label, text.size(),
               r.text_tokens, r.tokens);
    fmt::print("windows    {} x up to {} tokens, stride {}; {} predictions scored\n", r.windows,
               r.context, r.stride, r.scored);
    if (!r.overlay.layers.empty()) {
      constexpr double kMiB = 1024.0 * 1024.0;
      size_t src = 0, mx = 0;
      for (const auto& l : r.overlay.layers) {
        src += l.source_bytes;
        mx += l.mxfp8_bytes;
      }
      fmt::print("overlay    {} linears as MXFP8: {:.3f} -> {:.3f} MiB (saved {:.3f} MiB)\n",
                 r.overlay.layers.size(), src / kMiB, mx / kMiB, r.overlay.saved_bytes() / kMiB);
    }
    fmt::print("kv cache   {}, {} bytes per token", cpu::kv_format_name(r.kv_cache.format),
               r.kv_cache.bytes_per_token);
    if (r.reference_kv_cache) {
      fmt::print(" (reference: {}, {} bytes)", cpu::kv_format_name(r.reference_kv_cache->format),
                 r.reference_kv_cache->bytes_per_token);
    }
    fmt::print("\n");
    fmt::print("perplexity {:.4f}  (mean NLL {:.5f} nats/token)\n", r.perplexity, r.nll);
    if (r.reference) {
      const auto& s = *r.reference;
      fmt::print("reference perplexity {:.4f}  (mean NLL {:.5f})\n", s.perplexity, s.nll);
      fmt::print("KL(reference || model) {:.6f} nats/token mean, {:.6f} max\n", s.kl, s.kl_max);
      fmt::print("top-1 agreement {:.2f}% ({}/{})\n", 100.0 * s.top1_agreement, s.top1_agree,
                 r.scored);
    }
    fmt::print(
        "[{:.2f} s on {}: model {:.2f} s{}; {:.1f} tokens/s]\n", r.seconds, o->device,
        r.model_seconds,
        r.reference ? fmt::format(", reference {:.2f} s", r.reference_seconds) : std::string(),
        r.seconds > 0 ? static_cast<double>(r.scored) / r.seconds : 0.0);
    return 0;
  };
}

}  // namespace exl3::cli
