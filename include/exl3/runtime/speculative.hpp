// Speculative decoding with a draft model: a smaller model with the target's vocabulary proposes
// k tokens one at a time, the target scores all of them (and the token before them) in one
// forward pass, and the longest prefix the target agrees with is kept, plus one token of the
// target's. Greedy: a draft is kept when it is the target's argmax, and the extra token is the
// target's argmax, so the output equals generate()'s token for token; only the number of target
// passes changes (1 per round instead of 1 per token). Sampling (temperature > 0, with top-k /
// top-p / min-p / the repetition penalty as generate() applies them): draft token d, drawn from
// the draft's distribution q, is kept with probability min(1, p(d) / q(d)) under the target's
// distribution p; the first rejected position draws from max(0, p - q) renormalised, and a round
// with every draft kept draws its extra token from p. Each emitted token then follows the
// target's own distribution exactly (the standard speculative-sampling rule), though a seed gives
// different text than generate()'s, whose random stream is used differently.
//
// Each engine keeps its own sequence, KV pages and scratch (two engines, nothing shared); the
// rejected draft tokens leave both caches through Engine::truncate_sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"

namespace exl3::runtime {

struct SpeculativeOptions {
  int draft_tokens = 4;  // k, tokens the draft proposes per round (1..16)
};

struct SpeculativeStats {
  int64_t rounds = 0;    // target passes after the prompt (one per round)
  int64_t drafted = 0;   // tokens the draft proposed
  int64_t accepted = 0;  // of those, tokens the target agreed with

  // accepted / drafted (0 before any round).
  double acceptance_rate() const;
  // Tokens emitted per target pass: (accepted + rounds) / rounds.
  double tokens_per_round() const;
};

// generate() for `target` with `draft` proposing. Refuses, naming the problem, k outside 1..16, a
// draft whose vocabulary size differs from the target's, and (check_context_length) a prompt +
// max_new_tokens past either model's limit. The draft samples with opts.sampling and its own
// stream (the seed with fixed bits flipped).
// decode_steps in the result counts the target's passes after the prompt.
GenerateResult generate_speculative(Engine& target, Engine& draft, std::span<const int32_t> prompt,
                                    const GenerateOptions& opts, const SpeculativeOptions& spec,
                                    SpeculativeStats* stats = nullptr,
                                    const std::function<bool(int32_t)>& on_token = {});

}  // namespace exl3::runtime
