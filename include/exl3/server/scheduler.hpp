// Continuous batching: one worker thread owns the Engine and interleaves every running request.
//
// Requests enter a bounded FIFO queue (submit() refuses when it is full: the HTTP layer answers
// 503). Each iteration of the worker
//   1. drops cancelled requests (their KV pages go back to the pool) and admits queued ones, in
//      order, while fewer than max_seqs run and the KV pool has room for what the head of the
//      queue needs now: its prompt plus a page of growth (with SchedulerOptions::preemption off,
//      its worst case, prompt + max_tokens); a request that does not fit yet waits at the head
//      of the queue, it does not fail. With the engine's prefix cache
//      (EngineOptions::prefix_cache), an admitted prompt adopts the KV pages of its leading full
//      pages that an earlier request left, and only the rest is prefilled;
//   2. gives each generating sequence the pages its next step (or speculative round) needs;
//      when the pool is short, it preempts running sequences, the most recently submitted first
//      (never one older than the sequence asking): their KV pages are freed and they go back to
//      the head of the queue, keeping their stream, sampler and stop-string state and the tokens
//      generated so far, and are prefilled again (prompt + those tokens) when readmitted;
//   3. builds one Engine::forward_batch step: one decode token for every sequence that is
//      generating, then prefill chunks of the admitted prompts in admission order until
//      step_tokens tokens are in the step (so a long prompt costs the decoders at most one step
//      of step_tokens tokens at a time, not its whole prefill);
//   4. samples each finished prefill / decode with the request's own Sampler (temperature,
//      top_p, seed), detokenizes incrementally, checks stop tokens, stop strings and max_tokens,
//      and publishes the new text to the request's RequestStream. A request with a grammar
//      (structured output) samples only among the tokens its JsonMatcher allows, and ends once
//      its JSON value is whole. A request with a call grammar (strict tools under "auto") is
//      free until its tokens write the call's marker, constrained like that until the call is
//      whole, and free again after it.
//
// With a draft engine (SchedulerOptions::draft), prompts are prefilled in both engines (the same
// chunks), and generating sequences advance by rounds of speculative decoding instead of single
// decode steps: one runtime::SpeculativeDecoder round over all of them per iteration, each
// sequence drafting its own count (adaptive by default), so a round emits 1 to K + 1 tokens per
// sequence. The draft's KV pool is reserved like the model's (a round's K drafts included), and a
// preempted sequence leaves both pools and keeps both samplers (SpeculativeDecoder::suspend).
//
// A greedy request produces the same tokens as runtime::generate() whatever else runs beside it
// (each sequence's tokens only ever attend to its own KV pages), with or without a draft, and on
// the CPU engine whether or not it was preempted (recomputing a context there gives the KV the
// decode steps gave it, and the sampler's stream goes on where it stopped, so a seeded request
// keeps its text too).
// Constrained requests are not drafted for: with a draft they decode one token per step (both
// engines fed, so the draft stays in step), beside the speculative rounds of the others.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/runtime/speculative.hpp"
#include "exl3/text/json_schema.hpp"
#include "exl3/text/tokenizer.hpp"

namespace exl3::server {

enum class FinishReason : uint8_t {
  kStop,       // a stop token or stop string
  kLength,     // max_tokens reached
  kCancelled,  // the client went away, or the server is shutting down
  kError,      // the engine failed (message in StreamUpdate::error)
};
// "stop", "length", "cancelled", "error" (the first two are OpenAI's finish_reason values).
std::string_view finish_reason_name(FinishReason r);

struct GenerationRequest {
  std::vector<int32_t> prompt;  // non-empty, ids < vocab
  int64_t max_tokens = 16;      // > 0
  runtime::SamplingOptions sampling;
  std::vector<int32_t> stop_tokens;       // generation ends when one is sampled (not sent as text)
  std::vector<std::string> stop_strings;  // non-empty strings; the text ends before the first one
  // Decode special tokens as text too: a tool call's marker can be one (Mistral's [TOOL_CALLS],
  // Llama's <|python_tag|>), and the reply's tool-call parser must see it.
  bool keep_special_tokens = false;
  // Structured output: the reply must be a JSON value of this grammar (null: free text). Its
  // tokens are sampled from those the grammar allows (stop tokens only once the value is whole),
  // and it ends with kStop as soon as nothing may follow the value.
  std::shared_ptr<const JsonGrammar> grammar;
  // Strict tools the model may call or not: the reply is free text until its tokens write
  // `call_trigger` (the call format's marker); what follows the marker is then generated under
  // `call_grammar` until the call is whole, and the text is free again. Not with `grammar`; such
  // a request is not drafted for.
  std::string call_trigger;
  std::shared_ptr<const JsonGrammar> call_grammar;
};

// What arrived for one request since the last wait().
struct StreamUpdate {
  std::string text;             // new text (stop strings and special tokens removed)
  std::vector<int32_t> tokens;  // new token ids (a final stop token included)
  bool finished = false;
  FinishReason reason = FinishReason::kStop;  // valid when finished
  std::string error;                          // kError / kCancelled: why
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // tokens sampled so far (a stop token counts)
};

// The channel between the worker and the thread serving one request.
class RequestStream {
 public:
  // Waits until there is news or `timeout` passes; returns (and clears) what arrived. After the
  // update with finished = true, further calls return finished immediately.
  StreamUpdate wait(std::chrono::milliseconds timeout);
  // Calls `fn` (from the worker thread, with no lock held) whenever news arrives from now on, and
  // at once when some is already waiting. Replaces an earlier listener. For callers that poll
  // with wait(0) instead of blocking a thread.
  void set_listener(std::function<void()> fn);
  // Asks the worker to drop the request (its sequence is freed at the next iteration).
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class Scheduler;
  void publish(std::string_view text, int32_t token, int64_t completion_tokens);
  void finish(FinishReason reason, std::string_view text, std::string error,
              int64_t completion_tokens);

  std::mutex mu_;
  std::condition_variable cv_;
  StreamUpdate pending_;
  std::shared_ptr<const std::function<void()>> listener_;
  bool has_news_ = false;
  bool finished_ = false;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int max_seqs = 8;           // sequences generating at once
  int max_queue = 32;         // requests waiting beyond those (submit refuses when full)
  int64_t max_context = 0;    // prompt + max_tokens per request; 0 = the model's
                              // max_position_embeddings, capped by the KV pool
  int64_t step_tokens = 256;  // tokens per forward_batch step (decodes + prefill chunks)
  // Speculative decoding: a draft engine with the model's vocabulary (no live sequences; it must
  // outlive the scheduler), and how it drafts.
  runtime::Engine* draft = nullptr;
  runtime::SpeculativeOptions speculative{};
  // Admit requests on what they need now and preempt the newest when the KV pool runs short
  // (true), or reserve every request's prompt + max_tokens at admission so that none is ever
  // preempted, at the cost of fewer requests running at once (false).
  bool preemption = true;
};

// A latency histogram as Prometheus exposes one: cumulative counts per upper bound, sum, count.
struct LatencyHistogram {
  std::vector<double> bounds;    // upper bounds in seconds, increasing (+Inf implied)
  std::vector<int64_t> buckets;  // observations <= bounds[i], one per bound (not cumulative)
  int64_t count = 0;             // all observations (the +Inf bucket)
  double sum = 0.0;              // seconds
  explicit LatencyHistogram(std::vector<double> b = {})
      : bounds(std::move(b)), buckets(bounds.size(), 0) {}
  void observe(double seconds);
};

struct SchedulerStats {
  int64_t running = 0;
  int64_t queued = 0;
  int64_t cache_tokens = 0;       // KV pool capacity
  int64_t free_cache_tokens = 0;  // not held by any sequence (after the last step)
  int64_t max_context = 0;
  int64_t completed = 0;           // finished with stop / length
  int64_t cancelled = 0;           // dropped because the client went away
  int64_t failed = 0;              // finished with an engine error
  int64_t steps = 0;               // forward_batch calls
  int64_t refused_queue_full = 0;  // submit() answered kQueueFull
  int64_t prompt_tokens = 0;       // of admitted requests
  int64_t prefix_hit_tokens = 0;   // of those, found in the KV cache (not prefilled again)
  int64_t generation_tokens = 0;   // sampled (a final stop token included)
  // Running sequences sent back to the queue to free KV pages, and the tokens their
  // readmissions prefilled again (prompt + generated, less prefix-cache hits): the cost.
  int64_t preemptions = 0;
  int64_t recomputed_tokens = 0;
  // Speculative decoding (0 without a draft): the draft's KV pool, and per sequence and round
  // the rounds run, the tokens drafted and the drafts kept.
  int64_t draft_cache_tokens = 0;
  int64_t draft_free_cache_tokens = 0;
  int64_t speculative_rounds = 0;
  int64_t drafted_tokens = 0;
  int64_t accepted_tokens = 0;
  // Time to first token: from submit() to the first sampled token (queueing and prefill).
  LatencyHistogram time_to_first_token{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  // Inter-token latency: between one request's consecutive sampled tokens.
  LatencyHistogram inter_token_latency{
      {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
};

class Scheduler {
 public:
  // `engine` must have no live sequences and outlive the scheduler; the worker starts here.
  // Throws exl3::Error for options out of range (and, with a draft, for a draft whose vocabulary
  // differs or whose pool or positions cannot hold max_context).
  Scheduler(runtime::Engine& engine, Tokenizer tokenizer, const SchedulerOptions& opts);
  ~Scheduler();  // shutdown()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Refusal : uint8_t {
    kInvalid,       // bad request (empty prompt, ids outside the vocabulary, max_tokens <= 0, ...)
    kTooLong,       // prompt + max_tokens over max_context
    kQueueFull,     // try again later (HTTP 503)
    kShuttingDown,  // HTTP 503
  };
  struct Submitted {
    std::shared_ptr<RequestStream> stream;  // null when refused
    std::optional<Refusal> refusal;
    std::string message;  // why it was refused
  };
  // Validates and queues a request; never blocks on the engine.
  Submitted submit(GenerationRequest req);

  // Stops the worker: every queued and running request finishes with kCancelled. Idempotent.
  void shutdown();

  SchedulerStats stats() const;
  int64_t max_context() const { return max_context_; }
  const runtime::ModelSpec& spec() const { return engine_.spec(); }

 private:
  struct Active;
  struct Pending {
    GenerationRequest req;
    std::shared_ptr<RequestStream> stream;
    std::chrono::steady_clock::time_point submitted;
    // A preempted request (req moved into it): readmitted as it is, stream and sampler included.
    std::unique_ptr<Active> preempted;
  };

  void run();
  void admit(std::vector<std::unique_ptr<Active>>& running);
  void step(std::vector<std::unique_ptr<Active>>& running);
  void speculative_round(std::vector<std::unique_ptr<Active>>& running);
  // Grows the reservations of the running sequences to what this iteration's step needs,
  // oldest first, preempting the newest while the pool is short.
  void reserve_step(std::vector<std::unique_ptr<Active>>& running);
  // Frees `a`'s KV pages in both engines and readies it to be prefilled again.
  void preempt(Active& a);
  // KV tokens (whole pages of each pool) that `a` needs by the end of the next step.
  std::pair<int64_t, int64_t> step_need(const Active& a) const;
  // An engine call of a step failed: its requests end with kError (their clients get the
  // message); the others keep running.
  static void fail_all(std::span<Active* const> who, const char* what, const std::exception& e);
  void accept_token(Active& a, int32_t tok);
  // A request with a call grammar: starts constraining once `tok` completes the trigger, and
  // stops once the call is whole.
  void track_call(Active& a, int32_t tok) const;
  // Samples a constrained request's next token from `logits` with every token its grammar does
  // not allow removed, and advances its matcher.
  int32_t sample_constrained(Active& a, std::span<const float> logits);
  void retire(std::vector<std::unique_ptr<Active>>& running);
  // `tokens` rounded up to whole pages of `page_tokens`.
  static int64_t pages_for(int64_t tokens, int64_t page_tokens);

  runtime::Engine& engine_;
  Tokenizer tokenizer_;
  SchedulerOptions opts_;
  int64_t page_tokens_ = 1;  // KV page size in tokens
  // Prefill chunks other than a prompt's last end on page boundaries (models with recurrent
  // layers, whose engines keep their state there for prefix caching).
  bool align_prefill_ = false;
  int64_t cache_tokens_ = 0;  // pool capacity
  int64_t max_context_ = 0;
  int64_t reserved_ = 0;  // KV tokens set aside for the running sequences (worker only)
  // With a draft: its engine, page size, pool and reservations, and the decoder that owns the
  // generating sequences in both engines (worker only after construction).
  runtime::Engine* draft_ = nullptr;
  int64_t draft_page_tokens_ = 1, draft_cache_tokens_ = 0, draft_reserved_ = 0;
  std::unique_ptr<runtime::SpeculativeDecoder> spec_;
  // The vocabulary's byte trie for structured output, built on the first constrained request
  // (worker only).
  std::shared_ptr<const TokenTrie> trie_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Oldest first. Every queued request was submitted after every running one (admission takes
  // the head, preemption returns the newest running ones to the head), so `running` is in
  // submission order too and its back is always the newest.
  std::deque<Pending> queue_;
  bool stop_ = false;
  SchedulerStats stats_;  // guarded by mu_
  std::thread worker_;
};

}  // namespace exl3::server
