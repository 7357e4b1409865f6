// Token sampling and the generation loop (token ids only; text is the caller's business).
//
// Sampling, in vLLM's order: first the repetition penalty (every token id already in the
// sequence, prompt included, has its logit divided by the penalty when positive and multiplied
// by it otherwise, as transformers and vLLM do). Then temperature 0 is greedy (argmax, the lowest
// id among equal logits). Otherwise p = softmax(logits / T); min_p drops tokens less likely than
// min_p times the most likely one; top_k keeps the k most likely; top_p keeps the smallest set of
// most likely tokens whose probabilities reach top_p of what is left (nucleus); one draw from the
// renormalised rest with a seeded std::mt19937_64, so a seed gives the same tokens on every run
// and machine. Ties are broken by the lower id everywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "exl3/runtime/engine.hpp"

namespace exl3::runtime {

struct SamplingOptions {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]; 1 = off
  uint64_t seed = 0;
  int64_t top_k = 0;                // >= 0; 0 = off
  float min_p = 0.0f;               // [0, 1]; 0 = off
  float repetition_penalty = 1.0f;  // > 0; 1 = off
};

// Index of the largest value (lowest index on ties).
int32_t argmax(std::span<const float> logits);

class Sampler {
 public:
  // Throws exl3::Error for an option out of its range (see SamplingOptions).
  explicit Sampler(const SamplingOptions& opts);
  // `history`: the sequence's tokens so far (prompt and generated), read only for the
  // repetition penalty.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history = {});
  // Whether sample() is the plain argmax of the logits (temperature 0, no repetition penalty),
  // so an engine may pick the token itself (Engine::forward_batch_argmax).
  bool plain_greedy() const {
    return opts_.temperature == 0.0f && opts_.repetition_penalty == 1.0f;
  }

  // The distribution sample() draws from at temperature > 0: (weight, id) entries and their
  // total, so an id's probability is weight / total (0 for ids not listed). Valid until the next
  // call. Speculative sampling reads it for the target's and the draft's probabilities.
  struct Weights {
    std::span<const std::pair<float, int32_t>> entries;
    double total = 0.0;
  };
  Weights weights(std::span<const float> logits, std::span<const int32_t> history = {});
  // One draw from `w` (a weights() result of this sampler), using its seeded stream.
  int32_t draw(const Weights& w);
  // One uniform number in [0, 1) from the seeded stream.
  double uniform();

 private:
  // `logits` with the repetition penalty applied (a view of penalized_, or logits itself).
  std::span<const float> penalize(std::span<const float> logits, std::span<const int32_t> history);

  SamplingOptions opts_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;
  std::vector<float> penalized_;
  std::vector<uint8_t> seen_;  // repetition penalty: ids already penalized this step
};

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  std::vector<int32_t> stop_tokens;  // EOS / end-of-turn ids; generation stops on any
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, the stop token excluded
  std::string stop_reason;      // "stop_token" | "max_tokens" | "callback"
  int32_t stop_token = -1;      // the stop token seen, when stop_reason is "stop_token"
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0.0;  // the prefill forward pass
  int64_t decode_steps = 0;     // forward passes after the prompt (one token each in generate())
  int64_t decode_tokens = 0;    // tokens those passes produced (more than one per speculative pass)
  double decode_seconds = 0.0;  // their time, sampling included

  double prompt_tokens_per_second() const;
  double decode_tokens_per_second() const;
};

// Throws exl3::Error when `prompt_tokens` + `max_new_tokens` exceed the model's
// max_position_embeddings (when its config gives one), naming both numbers and the limit: the
// model was not trained for positions past it. `what` names the request in the message (e.g.
// "generate"); `new_tokens_option` is how the caller's user sets max_new_tokens (e.g. "-n").
void check_context_length(const ModelSpec& spec, int64_t prompt_tokens, int64_t max_new_tokens,
                          std::string_view what = "generate",
                          std::string_view new_tokens_option = "max_new_tokens");

// Prefills `prompt` (non-empty) into a fresh sequence in one pass, then samples and decodes one
// token at a time until a stop token, max_new_tokens or on_token returning false. on_token is
// called with every generated token (not the stop token) as soon as it is sampled. Refuses
// (check_context_length) a prompt + max_new_tokens beyond the model's max_position_embeddings
// before running anything.
GenerateResult generate(Engine& engine, std::span<const int32_t> prompt,
                        const GenerateOptions& opts,
                        const std::function<bool(int32_t)>& on_token = {});

}  // namespace exl3::runtime
