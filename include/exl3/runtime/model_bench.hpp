// Model speed benchmark (`exl3 bench model`): decode tokens/s at several batch sizes and prefill
// tokens/s, measured through the Engine interface (each forward call returns host logits, so the
// wall clock around it is the user-visible time), plus the weight bytes a decoded token reads,
// the basis of the bandwidth ceiling the command reports beside each figure.
#pragma once

#include <cstdint>
#include <vector>

#include "exl3/runtime/engine.hpp"

namespace exl3 {
class Checkpoint;
}

namespace exl3::runtime {

// Bytes of weights one token reads at batch 1: every linear outside the routed experts (EXL3 or
// unquantized, lm_head included), top_k experts' worth of each MoE layer (its mean expert size),
// routers, norms and one embedding row.
uint64_t active_weight_bytes_per_token(const Checkpoint& ckpt, const ModelSpec& spec);

struct ModelBenchOptions {
  int64_t max_batch_tokens = 2048;  // the engine's chunk size (prefill collectives run per chunk)
  std::vector<int64_t> batches = {1, 8, 64};
  int64_t context = 128;  // prompt tokens per sequence before decode is timed
  // Timed decode steps per batch size and per output (greedy ids, logits rows; they alternate
  // after 2 warm-up steps).
  int64_t decode_steps = 32;
  int64_t prefill_tokens = 2048;
  uint64_t seed = 1;
  // After each batch size's timed steps, one more step with every op timed
  // (Engine::profile_step), and after the timed prefills one more prefill likewise; fails on
  // engines that cannot time their ops.
  bool profile = false;
};

struct DecodeResult {
  int64_t batch = 0;
  // Median over the timed steps of a greedy step: tokens in, each sequence's argmax id back.
  double seconds_per_step = 0.0;
  double tokens_per_second = 0.0;
  // The same step with every sequence's logits row copied back (what sampling reads), timed on
  // steps interleaved with the greedy ones.
  double seconds_per_step_logits = 0.0;
  double collective_seconds = 0.0;  // the step's collectives alone (tensor parallel; else 0)
  int64_t kernels = 0;  // kernel launches per step (the captured decode graph's); 0: unknown
  std::vector<Engine::OpTime> profile;  // ModelBenchOptions::profile: the profiled step's ops
};

// Tokens one benchmark sequence holds at most: the context plus every decode step.
inline int64_t bench_sequence_tokens(const ModelBenchOptions& o) {
  return o.context + 2 * o.decode_steps + 2 + (o.profile ? 1 : 0);
}

struct ModelBenchResult {
  std::vector<DecodeResult> decode;
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;
  double prefill_tokens_per_second = 0.0;
  double prefill_collective_seconds = 0.0;      // summed over the prefill's chunks
  std::vector<Engine::OpTime> prefill_profile;  // ModelBenchOptions::profile: a prefill's ops
};

// Runs the benchmark (token ids are seeded random, sampling excluded). Throws exl3::Error when
// the engine's KV pool cannot hold the largest batch's sequences or the prefill.
ModelBenchResult bench_model(Engine& engine, const ModelBenchOptions& opts);

// Speculative decoding at each batch size with the model drafting for itself, so acceptance is
// forced: every draft kept (the model's own greedy choices), or none (its logits shifted by one
// id, so every draft is the id after its argmax). With K drafts per round a round costs K draft
// steps and one verify pass in both cases and emits K + 1 tokens or 1, which bounds what any
// draft's acceptance gives between them; with a draft much cheaper than the model, the verify
// pass alone sets the ceiling. The adaptive policy (SpeculativeOptions::adaptive) is run on the
// draft that never agrees: how close to plain decoding it stays is its overhead.
struct SpeculativeBatchResult {
  int64_t batch = 0;
  double plain_tokens_per_second = 0.0;          // the same rounds with no drafts (plain steps)
  double all_tokens_per_second = 0.0;            // K drafts per round, every one kept
  double all_acceptance = 0.0;                   // measured (1 unless rounding flips a near-tie)
  double none_tokens_per_second = 0.0;           // K drafts per round, none kept
  double none_acceptance = 0.0;                  // measured (0)
  double adaptive_none_tokens_per_second = 0.0;  // adaptive counts, the draft never agreeing
  double adaptive_none_drafts_per_round = 0.0;   // the drafts it still made (timing, probes)
  double decode_step_seconds = 0.0;              // one plain step of the batch
  double verify_seconds = 0.0;                   // one pass over K + 1 tokens of each sequence
};
struct SpeculativeBenchResult {
  int draft_tokens = 0;
  int64_t tokens = 0;  // generated per sequence and run (after a prompt of opts.context)
  std::vector<SpeculativeBatchResult> batches;  // one per opts.batches entry
};
// Throws exl3::Error when the pool cannot hold the sequences (2 x batch x (context + tokens + K)).
SpeculativeBenchResult bench_speculative(Engine& engine, int draft_tokens,
                                         const ModelBenchOptions& opts);

// Speculative decoding with the model's MTP head (`mtp`, exl3/runtime/mtp.hpp) at each batch
// size, greedy from seeded random prompts: plain steps, K drafts per round, and adaptive counts,
// with the acceptance the head reached (real acceptance: random prompts are harder to predict
// than text, so it is a floor more than an estimate).
struct MtpBatchResult {
  int64_t batch = 0;
  double plain_tokens_per_second = 0.0;
  double fixed_tokens_per_second = 0.0;  // K drafts per round
  double fixed_acceptance = 0.0;
  double fixed_tokens_per_round = 0.0;
  double adaptive_tokens_per_second = 0.0;
  double adaptive_acceptance = 0.0;
};
struct MtpBenchResult {
  int draft_tokens = 0;
  int64_t tokens = 0;  // generated per sequence and run (after a prompt of opts.context)
  std::vector<MtpBatchResult> batches;
};
// Throws exl3::Error when either KV pool cannot hold the sequences (batch x (context + tokens +
// K)).
MtpBenchResult bench_mtp(Engine& engine, Engine& mtp, int draft_tokens,
                         const ModelBenchOptions& opts);

}  // namespace exl3::runtime
