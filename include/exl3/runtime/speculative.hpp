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
#include <memory>
#include <span>
#include <vector>

#include "exl3/runtime/draft_policy.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"

namespace exl3::runtime {

struct SpeculativeOptions {
  int draft_tokens = 4;  // K, the most tokens the draft proposes per round (1..16)
  // Adapt each sequence's draft count in 0..K to its acceptance and the measured costs
  // (DraftPolicy); false: always K (reproducible sampled text for a seed).
  bool adaptive = true;
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

// Rounds of speculative decoding over any number of sequences at once: every draft step runs
// the sequences' drafts as one batch, and the verify pass scores every sequence's drafts in one
// target pass, whatever each sequence's draft count and however many of its drafts it keeps.
// The decoder owns its sequences in both engines (dropped by remove() or its destructor); the
// caller decides when a sequence ends (stop tokens, lengths) from the tokens a round returns.
class SpeculativeDecoder {
 public:
  // Refuses, naming the problem, k outside 1..16 and a draft whose vocabulary size differs from
  // the target's.
  SpeculativeDecoder(Engine& target, Engine& draft, const SpeculativeOptions& spec);
  ~SpeculativeDecoder();
  SpeculativeDecoder(const SpeculativeDecoder&) = delete;
  SpeculativeDecoder& operator=(const SpeculativeDecoder&) = delete;

  struct Added {
    int handle = -1;
    int32_t first = -1;  // the first generated token, sampled from the prompt pass
  };
  // Prefills `prompt` (non-empty) in both engines and samples the first token with `sampling`
  // (this sequence's own samplers: the target's seeded with sampling.seed, the draft's with
  // fixed bits of it flipped).
  Added add(std::span<const int32_t> prompt, const SamplingOptions& sampling);
  // Takes over a sequence prefilled outside the decoder (a server's chunked prefill):
  // `target_seq` and `draft_seq` each hold exactly `prompt` in their engine, and `first` was
  // sampled from the prompt pass by `sampler`, whose seeded stream the rounds continue (the
  // draft's sampler is made from `sampling` as in add()). From here the decoder owns both
  // sequences. Refuses, naming the problem, caches that do not hold the prompt.
  int adopt(Engine::SeqId target_seq, Engine::SeqId draft_seq, std::span<const int32_t> prompt,
            int32_t first, Sampler sampler, const SamplingOptions& sampling);
  void remove(int handle);

  // What a sequence's rounds carry besides its two caches: both samplers' seeded streams, its
  // acceptance record and its statistics. A server that preempts a sequence (frees its KV pages
  // to make room for others) keeps this, recomputes the caches later and resumes, and the rounds
  // continue as if nothing had happened (the same draws, and draft counts chosen from the same
  // record).
  struct Suspended {
    SamplingOptions sampling;
    Sampler sampler, draft_sampler;
    DraftPolicy::Acceptance acceptance;
    SpeculativeStats stats;
  };
  // Drops the sequence's KV in both engines (as remove()) and returns its state.
  Suspended suspend(int handle);
  // adopt() for a suspended sequence whose caches were recomputed: `target_seq` and `draft_seq`
  // each hold exactly `held`, every token of its stream but the last, and `next` is that last
  // token (the input of its next round). Refuses what adopt() refuses.
  int resume(Engine::SeqId target_seq, Engine::SeqId draft_seq, std::span<const int32_t> held,
             int32_t next, Suspended state);

  struct Slot {
    int handle = -1;
    int draft_tokens = 0;  // 0..k: 0 makes a plain target step
  };
  // One round for each listed sequence (each at most once): the tokens it emits, in order (its
  // kept drafts, then one token of the target's: 1 to draft_tokens + 1 of them). A round that
  // throws from an engine (e.g. a full KV pool) leaves its sequences unusable: remove them.
  std::vector<std::vector<int32_t>> round(std::span<const Slot> slots);

  const SpeculativeStats& stats(int handle) const;
  int draft_tokens() const { return spec_.draft_tokens; }
  // The draft count for the sequence's next round in a round of `batch` sequences: K, or with
  // SpeculativeOptions::adaptive the policy's choice from its acceptance and the costs so far;
  // at most remaining - 1 when the sequence may emit only `remaining` (>= 1) more tokens, since
  // a round emits up to k + 1 and drafts past the end would be thrown away.
  int next_draft_tokens(int handle, int64_t batch, int64_t remaining) const;

 private:
  struct Seq;
  Seq& seq(int handle);
  const Seq& seq(int handle) const;

  Engine& target_;
  Engine& draft_;
  SpeculativeOptions spec_;
  DraftPolicy policy_;                      // timed by every round, adaptive or not
  std::vector<std::unique_ptr<Seq>> seqs_;  // by handle; null once removed
};

// generate() for `target` with `draft` proposing (a SpeculativeDecoder over one sequence).
// Refuses what SpeculativeDecoder refuses and (check_context_length) a prompt + max_new_tokens
// past either model's limit. decode_steps in the result counts the target's passes after the
// prompt.
GenerateResult generate_speculative(Engine& target, Engine& draft, std::span<const int32_t> prompt,
                                    const GenerateOptions& opts, const SpeculativeOptions& spec,
                                    SpeculativeStats* stats = nullptr,
                                    const std::function<bool(int32_t)>& on_token = {});

}  // namespace exl3::runtime
