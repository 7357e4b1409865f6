// Model evaluation over a text: perplexity, and against a reference model (e.g. the unquantized
// source of a conversion) the mean KL divergence and top-1 agreement. Behind `exl3 eval`.
//
// The text is tokenized once with the model's tokenizer (its post-processor adds BOS where the
// model's tokenizer does; windows do not add their own). The token stream is cut into windows of
// `context` tokens starting every `stride` tokens (stride = context: disjoint windows, the
// exllamav3 style; stride < context: every scored token past the first window keeps at least
// context - stride tokens of history, Hugging Face's sliding-window perplexity). A token is scored
// at most once, in the first window that holds it with a token before it: with overlapping
// windows every token after the first, with disjoint ones all but each window's first token.
//
//   nll_t        = logsumexp(z_t) - z_t[target]                     (fp64 log-softmax)
//   perplexity   = exp(mean nll_t)
//   KL_t         = sum_v p_ref(v) (log p_ref(v) - log p_model(v))  (nats; KL(reference || model))
//   top-1 agrees = argmax z_model == argmax z_ref                  (lowest id on ties)
//
// Each window runs in a fresh sequence of each engine, fed in chunks (logits memory stays
// chunk x vocab); positions that only give context are fed without computing their logits.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/cuda/plan.hpp"
#include "exl3/runtime/engine.hpp"

namespace exl3 {

class Tokenizer;

struct EvalOptions {
  int64_t context = 2048;  // window length in tokens; capped by the models' max_position_embeddings
  int64_t stride = 0;      // tokens between window starts, 1..context; 0 = context
  int64_t max_tokens = 0;  // evaluate only the first N tokens of the text; 0 = all
  int64_t chunk = 256;     // tokens per forward call inside a window (memory: chunk x vocab floats)
};

// One window: tokens [begin, end) are fed; targets [first_target, end) are scored, each predicted
// from the window's tokens before it (first_target > begin).
struct EvalWindow {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t first_target = 0;
};

// The windows over `num_tokens` tokens (>= 2), context >= 2, 1 <= stride <= context; windows
// with nothing to score (a last window of one token) are left out. Throws exl3::Error for invalid
// arguments.
std::vector<EvalWindow> plan_eval_windows(int64_t num_tokens, int64_t context, int64_t stride);

struct EvalProgress {
  int64_t window = 0;  // windows finished (a window counts when its last chunk is done)
  int64_t windows = 0;
  int64_t scored = 0;         // predictions scored so far
  int64_t to_score = 0;       // predictions in all windows
  double elapsed = 0.0;       // seconds since evaluation started
  double eta_seconds = -1.0;  // < 0: unknown
};
using EvalProgressFn = std::function<void(const EvalProgress&)>;

struct EvalReferenceStats {
  double nll = 0.0;             // the reference's mean negative log-likelihood (nats per token)
  double perplexity = 0.0;      // exp(nll)
  double kl = 0.0;              // mean KL(reference || model) per scored token, nats
  double kl_max = 0.0;          // the largest per-token KL
  int64_t top1_agree = 0;       // positions where the two argmaxes agree
  double top1_agreement = 0.0;  // top1_agree / scored
};

struct EvalResult {
  int64_t text_tokens = 0;  // tokens of the whole text (before max_tokens)
  int64_t tokens = 0;       // tokens evaluated
  int64_t context = 0;      // effective window length (after the caps)
  int64_t stride = 0;       // effective stride
  int64_t windows = 0;
  int64_t scored = 0;       // predictions scored (tokens - 1 with overlapping windows)
  double nll = 0.0;         // mean negative log-likelihood, nats per token
  double perplexity = 0.0;  // exp(nll)
  std::optional<EvalReferenceStats> reference;
  // What the MXFP8 overlay converted in the model (EvalModels::overlay; empty without one).
  runtime::OverlayReport overlay;
  // The engines' KV cache formats and bytes per token (EvalModels::kv_format is the model's).
  runtime::Engine::KvCacheInfo kv_cache;
  std::optional<runtime::Engine::KvCacheInfo> reference_kv_cache;
  double seconds = 0.0;            // the whole evaluation (both models)
  double model_seconds = 0.0;      // forward passes of the model
  double reference_seconds = 0.0;  // forward passes of the reference

  nlohmann::json to_json() const;
};

// The window length evaluate() uses: opts.context, capped by each engine's
// max_position_embeddings (when the config gives it) and by the number of tokens.
int64_t effective_context(const runtime::Engine& model, const runtime::Engine* reference,
                          int64_t requested, int64_t num_tokens);

// Scores `tokens` (>= 2 after max_tokens) with `model`, and with `reference` when not null (same
// vocab_size required). Both engines need KV room for one window (effective_context tokens) and
// are left with no sequences. Throws exl3::Error on invalid options, a vocabulary mismatch or
// non-finite logits (naming the model and position).
EvalResult evaluate(runtime::Engine& model, runtime::Engine* reference,
                    std::span<const int32_t> tokens, const EvalOptions& opts,
                    const EvalProgressFn& progress = {});

// Fails unless the two tokenizers map every id to the same token (same size, same strings, same
// special flags), naming the first id that differs. KL and top-1 compare distributions over ids,
// which is meaningless when an id means different text in the two models.
void check_same_vocabulary(const Tokenizer& model, const Tokenizer& reference);

// The text behind --text: "builtin" (kBuiltinTextName) is the bundled text, anything else a file
// read whole. Throws exl3::Error for a missing / unreadable / empty file.
std::string load_eval_text(const std::string& file);

struct EvalModels {
  std::filesystem::path model;  // folder with config.json, weights, tokenizer.json
  std::optional<std::filesystem::path> reference;  // its tokenizer.json, when present, must match
  runtime::Device device = runtime::Device::kCpu;
  // Applied to the model only, so `--reference` the same folder measures KL(BF16 || MXFP8).
  runtime::OverlayPolicy overlay;
  // The model's KV cache format; the reference always keeps the engine's own precision, so
  // `--reference` the same folder measures what a quantized cache costs.
  runtime::KvFormat kv_format = runtime::KvFormat::kNative;
  runtime::LoadProgressFn load_progress;  // loading each model (runtime/load_progress.hpp)
  // CUDA tunables of both engines (runtime::EngineOptions::moe / mxfp8).
  cuda::MoeOptions moe;
  cuda::Mxfp8Options mxfp8;
};

// Tokenizes `text` with the model's tokenizer, loads both models on `device` with KV room for
// one window, checks the vocabularies and runs evaluate(). `text_label` names the text in errors.
EvalResult evaluate_text(const EvalModels& models, std::string_view text, const EvalOptions& opts,
                         const EvalProgressFn& progress = {},
                         const std::string& text_label = "text");

// A progress printer for front ends: a redrawn bar with ETA on a terminal, one line per finished
// window otherwise.
EvalProgressFn make_eval_progress_printer(std::FILE* out, bool terminal);

}  // namespace exl3
