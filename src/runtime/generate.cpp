// Sampling and the generation loop (see generate.hpp).
#include "exl3/runtime/generate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "exl3/error.hpp"
#include "generation_loop.hpp"
#include "stopwatch.hpp"

namespace exl3::runtime {
int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) fail("argmax: no logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingOptions& opts) : opts_(opts), rng_(opts.seed) {
  if (!std::isfinite(opts.temperature) || opts.temperature < 0.0f) {
    fail("sampling: temperature {} must be a finite number >= 0 (0 = greedy)", opts.temperature);
  }
  if (!(opts.top_p > 0.0f && opts.top_p <= 1.0f)) {
    fail("sampling: top_p {} must be in (0, 1]", opts.top_p);
  }
  if (opts.top_k < 0) fail("sampling: top_k {} must be >= 0 (0 = off)", opts.top_k);
  if (!(opts.min_p >= 0.0f && opts.min_p <= 1.0f))
    fail("sampling: min_p {} must be in [0, 1]", opts.min_p);
  if (!std::isfinite(opts.repetition_penalty) || opts.repetition_penalty <= 0.0f) {
    fail("sampling: repetition_penalty {} must be a finite number > 0 (1 = off)",
         opts.repetition_penalty);
  }
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (opts_.temperature == 0.0f) {
    if (logits.empty()) fail("sample: no logits");
    return argmax(penalize(logits, history));
  }
  return draw(weights(logits, history));
}

std::span<const float> Sampler::penalize(std::span<const float> logits,
                                         std::span<const int32_t> history) {
  if (opts_.repetition_penalty == 1.0f || history.empty()) return logits;
  // Each distinct id once: a flag per vocabulary entry, so a step costs O(vocab + history)
  // (the logits copy is O(vocab) already) rather than a sort of the whole history.
  penalized_.assign(logits.begin(), logits.end());
  seen_.assign(logits.size(), 0);
  for (const int32_t t : history) {
    if (t < 0 || static_cast<size_t>(t) >= penalized_.size() || seen_[static_cast<size_t>(t)])
      continue;
    seen_[static_cast<size_t>(t)] = 1;
    float& l = penalized_[static_cast<size_t>(t)];
    l = l > 0.0f ? l / opts_.repetition_penalty : l * opts_.repetition_penalty;
  }
  return penalized_;
}

Sampler::Weights Sampler::weights(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) fail("sample: no logits");
  if (opts_.temperature == 0.0f) fail("sampling: weights() at temperature 0 (greedy has none)");
  logits = penalize(logits, history);
  const float mx = logits[static_cast<size_t>(argmax(logits))];
  if (!std::isfinite(mx)) fail("sample: the logits are not finite");
  // Unnormalised probabilities: the most likely token has 1, so min_p is a plain threshold.
  scratch_.clear();
  scratch_.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const auto p =
        static_cast<float>(std::exp(static_cast<double>(logits[i] - mx) / opts_.temperature));
    if (opts_.min_p > 0.0f && p < opts_.min_p) continue;
    scratch_.push_back({p, static_cast<int32_t>(i)});
  }
  const bool top_k = opts_.top_k > 0 && static_cast<size_t>(opts_.top_k) < scratch_.size();
  if (top_k || opts_.top_p < 1.0f) {
    // Most likely first, ties by id: top_k is a prefix, and the nucleus the shortest prefix
    // reaching top_p of the mass left.
    std::sort(scratch_.begin(), scratch_.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    if (top_k) scratch_.resize(static_cast<size_t>(opts_.top_k));
  }
  double total = 0.0;
  for (const auto& e : scratch_) total += e.first;
  size_t keep = scratch_.size();
  if (opts_.top_p < 1.0f) {
    const double target = static_cast<double>(opts_.top_p) * total;
    double cum = 0.0;
    keep = 0;
    while (keep < scratch_.size()) {
      cum += scratch_[keep].first;
      ++keep;
      if (cum >= target) break;
    }
    total = cum;
  }
  return {std::span<const std::pair<float, int32_t>>(scratch_).first(keep), total};
}

double Sampler::uniform() {
  // From the raw 64-bit stream (std distributions differ between libraries).
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::draw(const Weights& w) {
  if (w.entries.empty()) fail("sample: an empty distribution");
  const double u = uniform() * w.total;
  double cum = 0.0;
  for (const auto& [p, id] : w.entries) {
    cum += p;
    if (u < cum) return id;
  }
  return w.entries.back().second;
}

double GenerateResult::prompt_tokens_per_second() const {
  return prompt_seconds > 0.0 ? static_cast<double>(prompt_tokens) / prompt_seconds : 0.0;
}

double GenerateResult::decode_tokens_per_second() const {
  return decode_seconds > 0.0 ? static_cast<double>(decode_tokens) / decode_seconds : 0.0;
}

void check_context_length(const ModelSpec& spec, int64_t prompt_tokens, int64_t max_new_tokens,
                          std::string_view what, std::string_view new_tokens_option) {
  const int64_t limit = spec.max_position_embeddings;
  if (limit <= 0) return;  // the config gives no limit
  // Compared without overflow: max_new_tokens may be anything up to INT64_MAX.
  if (prompt_tokens <= limit && max_new_tokens <= limit - prompt_tokens) return;
  if (prompt_tokens >= limit) {
    fail(
        "{}: a {}-token prompt + {} new tokens exceed the model's max_position_embeddings {} ({}); "
        "hint: shorten the prompt to fewer than {} tokens",
        what, prompt_tokens, max_new_tokens, limit, spec.label, limit);
  }
  fail(
      "{}: a {}-token prompt + {} new tokens exceed the model's max_position_embeddings {} ({}); "
      "hint: lower {} to at most {}, or shorten the prompt",
      what, prompt_tokens, max_new_tokens, limit, spec.label, new_tokens_option,
      limit - prompt_tokens);
}

void check_generate_request(std::string_view what, std::span<const int32_t> prompt,
                            const GenerateOptions& opts) {
  if (prompt.empty()) fail("{}: the prompt has no tokens", what);
  if (opts.max_new_tokens < 0) fail("{}: max_new_tokens {} is negative", what, opts.max_new_tokens);
}

bool emit_token(GenerateResult& r, int32_t tok, const GenerateOptions& opts,
                const std::function<bool(int32_t)>& on_token) {
  if (std::find(opts.stop_tokens.begin(), opts.stop_tokens.end(), tok) != opts.stop_tokens.end()) {
    r.stop_reason = "stop_token";
    r.stop_token = tok;
    return false;
  }
  r.tokens.push_back(tok);
  if (on_token && !on_token(tok)) {
    r.stop_reason = "callback";
    return false;
  }
  return true;
}

GenerateResult generate(Engine& engine, std::span<const int32_t> prompt,
                        const GenerateOptions& opts, const std::function<bool(int32_t)>& on_token) {
  check_generate_request("generate", prompt, opts);
  check_context_length(engine.spec(), static_cast<int64_t>(prompt.size()), opts.max_new_tokens);
  Sampler sampler(opts.sampling);
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  const auto seq = engine.new_sequence();
  struct Drop {
    Engine& e;
    Engine::SeqId s;
    ~Drop() { e.drop_sequence(s); }
  } drop{engine, seq};

  // The repetition penalty reads every token of the sequence so far.
  std::vector<int32_t> history;
  if (opts.sampling.repetition_penalty != 1.0f) history.assign(prompt.begin(), prompt.end());
  // Appends `tokens` and returns the next token. Plain greedy needs only the argmax, which the
  // engine picks where its logits are (on the GPU, no vocabulary-wide row comes back).
  const bool ids_only = sampler.plain_greedy();
  auto next = [&](std::span<const int32_t> tokens) {
    if (!ids_only) return sampler.sample(engine.forward(seq, tokens, LogitsMode::kLast), history);
    const Engine::BatchEntry e{seq, tokens, LogitsMode::kLast};
    return engine.forward_batch_argmax(std::span<const Engine::BatchEntry>(&e, 1)).front().front();
  };
  auto t0 = std::chrono::steady_clock::now();
  int32_t tok = next(prompt);
  r.prompt_seconds = seconds_since(t0);
  r.stop_reason = "max_tokens";
  while (static_cast<int64_t>(r.tokens.size()) < opts.max_new_tokens) {
    if (opts.sampling.repetition_penalty != 1.0f) history.push_back(tok);
    if (!emit_token(r, tok, opts, on_token)) break;
    if (static_cast<int64_t>(r.tokens.size()) >= opts.max_new_tokens) break;
    t0 = std::chrono::steady_clock::now();
    tok = next({&tok, 1});
    r.decode_seconds += seconds_since(t0);
    ++r.decode_steps;
    ++r.decode_tokens;
  }
  return r;
}

}  // namespace exl3::runtime
