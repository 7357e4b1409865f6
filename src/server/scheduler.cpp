// The continuous-batching worker (see scheduler.hpp).
#include "exl3/server/scheduler.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

#include <fmt/format.h>

#include "exl3/error.hpp"
#include "exl3/server/stop_strings.hpp"

namespace exl3::server {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "error";
}

void LatencyHistogram::observe(double seconds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (seconds <= bounds[i]) {
      ++buckets[i];
      break;
    }
  }
  ++count;
  sum += seconds;
}

// ---- RequestStream -----------------------------------------------------------------------------

StreamUpdate RequestStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return has_news_ || finished_; });
  StreamUpdate out = pending_;
  pending_.text.clear();
  pending_.tokens.clear();
  has_news_ = false;
  return out;
}

void RequestStream::set_listener(std::function<void()> fn) {
  auto l = std::make_shared<const std::function<void()>>(std::move(fn));
  bool now = false;
  {
    std::lock_guard lk(mu_);
    listener_ = l;
    now = has_news_ || finished_;
  }
  if (now) (*l)();
}

void RequestStream::publish(std::string_view text, int32_t token, int64_t completion_tokens) {
  std::shared_ptr<const std::function<void()>> l;
  {
    std::lock_guard lk(mu_);
    pending_.text += text;
    if (token >= 0) pending_.tokens.push_back(token);
    pending_.completion_tokens = completion_tokens;
    has_news_ = true;
    l = listener_;
  }
  cv_.notify_all();
  if (l) (*l)();
}

void RequestStream::finish(FinishReason reason, std::string_view text, std::string error,
                           int64_t completion_tokens) {
  std::shared_ptr<const std::function<void()>> l;
  {
    std::lock_guard lk(mu_);
    if (finished_) return;
    pending_.text += text;
    pending_.completion_tokens = completion_tokens;
    pending_.finished = true;
    pending_.reason = reason;
    pending_.error = std::move(error);
    finished_ = true;
    has_news_ = true;
    l = listener_;
  }
  cv_.notify_all();
  if (l) (*l)();
}

// ---- Scheduler ---------------------------------------------------------------------------------

struct Scheduler::Active {
  Active(GenerationRequest r, std::shared_ptr<RequestStream> s, const Tokenizer& tok)
      : req(std::move(r)),
        stream(std::move(s)),
        sampler(req.sampling),
        decoder(tok, /*skip_special=*/!req.keep_special_tokens),
        matcher(req.stop_strings) {
    if (req.sampling.repetition_penalty != 1.0f) history = req.prompt;
    context = req.prompt;
    if (req.grammar) json.emplace(req.grammar);
  }

  GenerationRequest req;
  std::shared_ptr<RequestStream> stream;
  runtime::Sampler sampler;
  StreamDecoder decoder;
  StopStringMatcher matcher;
  runtime::Engine::SeqId seq = -1;
  runtime::Engine::SeqId dseq = -1;  // its sequence in the draft engine (with a draft)
  int handle = -1;       // the SpeculativeDecoder's, once prefilled (it then owns seq and dseq)
  int64_t reserved = 0;  // KV tokens set aside for it (whole pages)
  int64_t draft_reserved = 0;  // the same in the draft's pool
  // What the KV cache must hold before the next token: the prompt, and after a preemption the
  // prompt and every sampled token but the last (`next`, the next step's input).
  std::vector<int32_t> context;
  size_t prefilled = 0;          // context tokens already in the KV cache
  int64_t generated = 0;         // tokens sampled
  int32_t next = -1;             // the last sampled token: the input of the next decode step
  std::vector<int32_t> output;   // the sampled tokens, to rebuild the context after a preemption
  std::vector<int32_t> history;  // prompt + sampled tokens, kept for a repetition penalty only
  int64_t preemptions = 0;
  // With a draft, a preempted generating sequence's samplers and acceptance record (the
  // SpeculativeDecoder's while it runs), resumed once its context is back in both caches.
  std::optional<runtime::SpeculativeDecoder::Suspended> suspended;
  std::optional<JsonMatcher> json;  // structured output: the reply so far, matched
  std::string trigger_scan;         // call grammar: the last bytes, while looking for the trigger
  std::optional<JsonMatcher> allowed_at;  // the state `allowed` was computed for
  std::vector<uint8_t> allowed;
  std::vector<float> masked;                                    // scratch of sample_constrained()
  std::chrono::steady_clock::time_point submitted, last_token;  // for the latency metrics
  bool done = false;  // finished: retire() drops the sequence, then tells the client
  FinishReason reason = FinishReason::kStop;
  std::string error;

  void end(FinishReason r, std::string why = {}) {
    done = true;
    reason = r;
    error = std::move(why);
  }

  bool decoding() const { return prefilled == context.size(); }
  // Text still held by the detokenizer and the stop-string matcher, at the end.
  std::string tail() {
    auto r = matcher.push(decoder.finish());
    return r.stopped ? r.text : r.text + matcher.flush();
  }
};

Scheduler::Scheduler(runtime::Engine& engine, Tokenizer tokenizer, const SchedulerOptions& opts)
    : engine_(engine), tokenizer_(std::move(tokenizer)), opts_(opts) {
  if (opts.max_seqs < 1) fail("server: max_seqs {} must be at least 1", opts.max_seqs);
  if (opts.max_queue < 1) fail("server: max_queue {} must be at least 1", opts.max_queue);
  if (opts.step_tokens < 1) fail("server: step_tokens {} must be at least 1", opts.step_tokens);
  if (opts.max_context < 0)
    fail("server: max_context {} is negative (0 = the model's)", opts.max_context);
  // The page size, measured rather than assumed: one token of a fresh sequence takes one page.
  const auto probe = engine_.new_sequence();
  page_tokens_ = std::max<int64_t>(1, engine_.cache_tokens_needed(probe, 1));
  align_prefill_ = engine_.spec().has_recurrent_layers();
  engine_.drop_sequence(probe);
  cache_tokens_ = engine_.free_cache_tokens();
  const int64_t model_ctx = engine_.spec().max_position_embeddings;
  max_context_ = model_ctx > 0 ? std::min(model_ctx, cache_tokens_) : cache_tokens_;
  if (opts.max_context > 0) {
    if (opts.max_context > cache_tokens_) {
      fail(
          "server: max_context {} exceeds the KV cache of {} tokens; hint: raise --cache-tokens to "
          "at "
          "least the context",
          opts.max_context, cache_tokens_);
    }
    if (model_ctx > 0 && opts.max_context > model_ctx) {
      fail("server: max_context {} exceeds the model's max_position_embeddings {} ({})",
           opts.max_context, model_ctx, engine_.spec().label);
    }
    max_context_ = opts.max_context;
  }
  if (opts.draft != nullptr) {
    draft_ = opts.draft;
    spec_ = std::make_unique<runtime::SpeculativeDecoder>(engine_, *draft_, opts.speculative);
    const auto dprobe = draft_->new_sequence();
    draft_page_tokens_ = std::max<int64_t>(1, draft_->cache_tokens_needed(dprobe, 1));
    draft_->drop_sequence(dprobe);
    draft_cache_tokens_ = draft_->free_cache_tokens();
    const int64_t draft_ctx = draft_->spec().max_position_embeddings;
    const int64_t draft_max =
        draft_ctx > 0 ? std::min(draft_ctx, draft_cache_tokens_) : draft_cache_tokens_;
    if (opts.max_context > draft_max) {
      fail(
          "server: max_context {} exceeds what the draft model holds ({} tokens: its KV cache or "
          "max_position_embeddings); hint: a smaller --max-context",
          opts.max_context, draft_max);
    }
    max_context_ = std::min(max_context_, draft_max);
    stats_.draft_cache_tokens = stats_.draft_free_cache_tokens = draft_cache_tokens_;
  }
  if (max_context_ < 2)
    fail("server: a context of {} tokens leaves no room for a prompt and a reply", max_context_);
  stats_.cache_tokens = stats_.free_cache_tokens = cache_tokens_;
  stats_.max_context = max_context_;
  worker_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  shutdown();
}

void Scheduler::shutdown() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mu_);
  SchedulerStats s = stats_;
  s.queued = static_cast<int64_t>(queue_.size());
  return s;
}

int64_t Scheduler::pages_for(int64_t tokens, int64_t page_tokens) {
  return (tokens + page_tokens - 1) / page_tokens * page_tokens;
}

Scheduler::Submitted Scheduler::submit(GenerationRequest req) {
  auto refuse = [](Refusal r, std::string msg) { return Submitted{nullptr, r, std::move(msg)}; };
  if (req.prompt.empty())
    return refuse(Refusal::kInvalid, "the prompt is empty (it encodes to no tokens)");
  const int64_t vocab = engine_.spec().vocab_size;
  for (size_t i = 0; i < req.prompt.size(); ++i) {
    if (req.prompt[i] < 0 || req.prompt[i] >= vocab) {
      return refuse(Refusal::kInvalid,
                    fmt::format("prompt token id {} at index {} is outside the vocabulary 0..{}",
                                req.prompt[i], i, vocab - 1));
    }
  }
  if (req.max_tokens <= 0) {
    return refuse(Refusal::kInvalid,
                  fmt::format("max_tokens {} must be at least 1", req.max_tokens));
  }
  for (const auto& s : req.stop_strings) {
    if (s.empty()) return refuse(Refusal::kInvalid, "a stop string is empty");
  }
  if (req.call_grammar && (req.call_trigger.empty() || req.grammar)) {
    return refuse(Refusal::kInvalid,
                  "a call grammar needs a trigger and cannot be combined with a grammar");
  }
  try {
    runtime::Sampler check(req.sampling);
  } catch (const Error& e) {
    return refuse(Refusal::kInvalid, e.what());
  }
  const auto prompt_len = static_cast<int64_t>(req.prompt.size());
  // Compared without adding: prompt + max_tokens overflows for a max_tokens near 2^63.
  if (prompt_len > max_context_ || req.max_tokens > max_context_ - prompt_len) {
    return refuse(
        Refusal::kTooLong,
        fmt::format(
            "the prompt has {} tokens and max_tokens is {}: together they exceed this server's "
            "context of {} tokens; hint: shorten the prompt or set max_tokens to at most {}",
            prompt_len, req.max_tokens, max_context_,
            std::max<int64_t>(0, max_context_ - prompt_len)));
  }
  auto stream = std::make_shared<RequestStream>();
  stream->pending_.prompt_tokens = prompt_len;
  {
    std::lock_guard lk(mu_);
    if (stop_) return refuse(Refusal::kShuttingDown, "the server is shutting down");
    // Free run slots count as room too: the worker admits queued requests only between steps, so
    // a burst arriving during one would otherwise be refused with slots idle.
    if (static_cast<int64_t>(queue_.size()) + stats_.running >= opts_.max_queue + opts_.max_seqs) {
      ++stats_.refused_queue_full;
      return refuse(
          Refusal::kQueueFull,
          fmt::format("the server is busy: {} requests are waiting and {} are running (limits "
                      "--max-queue {}, --max-seqs {}); retry later",
                      queue_.size(), stats_.running, opts_.max_queue, opts_.max_seqs));
    }
    queue_.push_back({std::move(req), stream, std::chrono::steady_clock::now(), nullptr});
  }
  cv_.notify_all();
  return {stream, std::nullopt, {}};
}

void Scheduler::run() {
  std::vector<std::unique_ptr<Active>> running;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || !running.empty(); });
      if (stop_) break;
    }
    for (auto& a : running) {
      if (!a->done && a->stream->cancelled())
        a->end(FinishReason::kCancelled, "the request was cancelled");
    }
    retire(running);
    admit(running);
    if (!running.empty()) step(running);
    retire(running);
  }
  // Shutting down: nobody waits forever.
  for (auto& a : running) a->end(FinishReason::kCancelled, "the server is shutting down");
  retire(running);
  std::lock_guard lk(mu_);
  for (auto& p : queue_) {
    p.stream->finish(FinishReason::kCancelled, "", "the server is shutting down",
                     p.preempted ? p.preempted->generated : 0);
    // Counted like the running ones, so completed + cancelled + failed covers every request
    // the scheduler accepted.
    ++stats_.cancelled;
  }
  queue_.clear();
}

void Scheduler::admit(std::vector<std::unique_ptr<Active>>& running) {
  std::lock_guard lk(mu_);
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->stream->cancelled()) {
      it->stream->finish(FinishReason::kCancelled, "", "the request was cancelled",
                         it->preempted ? it->preempted->generated : 0);
      ++stats_.cancelled;
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  // FIFO: the head waits for room rather than being overtaken by smaller requests (no starvation).
  while (static_cast<int64_t>(running.size()) < opts_.max_seqs && !queue_.empty()) {
    Pending& p = queue_.front();
    const GenerationRequest& req = p.preempted ? p.preempted->req : p.req;
    const auto context =
        static_cast<int64_t>(p.preempted ? p.preempted->context.size() : p.req.prompt.size());
    // The worst case, or what the context needs plus room to grow for a step or a round (about a
    // page): reserve_step() adds pages as the sequence grows.
    const int64_t worst = static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
    const int64_t growth = std::max<int64_t>(page_tokens_, 1 + (spec_ ? spec_->draft_tokens() : 0));
    const int64_t tokens = opts_.preemption ? std::min(worst, context + growth) : worst;
    const int64_t need = pages_for(tokens, page_tokens_);
    if (need > cache_tokens_ - reserved_) break;
    const int64_t draft_need = draft_ ? pages_for(tokens, draft_page_tokens_) : 0;
    if (draft_ && draft_need > draft_cache_tokens_ - draft_reserved_) break;
    std::unique_ptr<Active> a = std::move(p.preempted);
    if (!a) {
      a = std::make_unique<Active>(std::move(p.req), std::move(p.stream), tokenizer_);
      a->submitted = p.submitted;
      stats_.prompt_tokens += static_cast<int64_t>(a->req.prompt.size());
    }
    queue_.pop_front();
    a->seq = engine_.new_sequence();
    a->reserved = need;
    reserved_ += need;
    if (draft_) {
      a->dseq = draft_->new_draft_sequence(engine_, a->seq);
      a->draft_reserved = draft_need;
      draft_reserved_ += draft_need;
    }
    // Prefix caching: the prompt's leading pages already in the KV cache are not prefilled
    // again (both engines keep the same count, since prefill feeds them the same chunks).
    int64_t reused = engine_.adopt_prefix(a->seq, a->context);
    if (draft_) {
      const int64_t d = draft_->adopt_prefix(a->dseq, a->context);
      if (d != reused) {
        // Both keep the shorter run, cut at a page boundary of both (pages of other sizes
        // could not be cut inside while another request shares them).
        int64_t keep = std::min(reused, d);
        if (keep % page_tokens_ != 0 || keep % draft_page_tokens_ != 0) keep = 0;
        engine_.truncate_sequence(a->seq, keep);
        draft_->truncate_sequence(a->dseq, keep);
        reused = keep;
      }
    }
    a->prefilled = static_cast<size_t>(reused);
    if (a->preemptions == 0) {
      stats_.prefix_hit_tokens += reused;
    } else {
      stats_.recomputed_tokens += static_cast<int64_t>(a->context.size()) - reused;
    }
    running.push_back(std::move(a));
  }
  stats_.running = static_cast<int64_t>(running.size());
}

void Scheduler::step(std::vector<std::unique_ptr<Active>>& running) {
  reserve_step(running);
  // With a draft, generating sequences advance by a speculative round, and the step below holds
  // only prefill chunks (fed to both engines).
  if (spec_) speculative_round(running);
  std::vector<runtime::Engine::BatchEntry> batch;
  std::vector<Active*> who;
  std::vector<int64_t> fed;  // prompt tokens each prefill entry feeds (0 for decodes)
  int64_t budget = opts_.step_tokens;
  for (auto& a : running) {
    // With a draft, sequences the speculative decoder took over are advanced by its round.
    if (a->handle >= 0 || a->done || !a->decoding()) continue;
    batch.push_back({a->seq, {&a->next, 1}, runtime::LogitsMode::kLast});
    who.push_back(a.get());
    fed.push_back(0);
    --budget;
  }
  for (auto& a : running) {
    if (budget <= 0) break;
    if (a->done || a->decoding()) continue;
    const int64_t left = static_cast<int64_t>(a->context.size() - a->prefilled);
    int64_t n = std::min(left, budget);
    if (align_prefill_ && n < left) {
      // A chunk that is not the prompt's last ends on a page boundary where it can: there the
      // engine keeps the recurrent state for prefix caching, and a chunk ending inside a page
      // would be cut there, costing the engine one more pass.
      const auto at = static_cast<int64_t>(a->prefilled);
      const int64_t aligned = (at + n) / page_tokens_ * page_tokens_ - at;
      if (aligned > 0) n = aligned;
    }
    batch.push_back(
        {a->seq, std::span<const int32_t>(a->context).subspan(a->prefilled, static_cast<size_t>(n)),
         runtime::LogitsMode::kLast});
    who.push_back(a.get());
    fed.push_back(n);
    budget -= n;
  }
  if (batch.empty()) return;

  // A step of plain greedy requests needs only each row's argmax, which the engine picks where
  // its logits are (on the GPU only the ids come back); a constrained one needs its logits.
  const bool ids_only = std::ranges::all_of(
      who, [](const Active* a) { return a->sampler.plain_greedy() && !a->json; });
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> ids;
  try {
    if (ids_only) {
      ids = engine_.forward_batch_argmax(batch);
    } else {
      logits = engine_.forward_batch(batch);
    }
    if (draft_) {
      std::vector<runtime::Engine::BatchEntry> dbatch = batch;
      for (size_t i = 0; i < dbatch.size(); ++i) dbatch[i].seq = who[i]->dseq;
      draft_->forward_batch(dbatch);
    }
  } catch (const std::exception& e) {
    // reserve_step() set the KV room aside and submit() checked every id, so this is an engine
    // fault: fail the step's requests (their clients get the message) and keep serving the others.
    fail_all(who, "forward_batch", e);
    return;
  }
  {
    std::lock_guard lk(mu_);
    ++stats_.steps;
  }
  for (size_t i = 0; i < who.size(); ++i) {
    Active& a = *who[i];
    a.prefilled += static_cast<size_t>(fed[i]);
    if (!a.decoding()) continue;  // more prompt to prefill before the first sample
    try {
      if (fed[i] > 0 && a.generated > 0) {
        // A preempted request's context is back: it decodes `next` again, as it was about to
        // (its sampler's stream untouched), so nothing is sampled from this prefill.
        // (A constrained request is never drafted for, so it has no suspended decoder state.)
        if (spec_ && a.suspended) {
          a.handle = spec_->resume(a.seq, a.dseq, a.context, a.next, std::move(*a.suspended));
          a.suspended.reset();
        }
        continue;
      }
      const int32_t tok = ids_only ? ids[i].front()
                          : a.json ? sample_constrained(a, logits[i])
                                   : a.sampler.sample(logits[i], a.history);
      if (a.req.sampling.repetition_penalty != 1.0f) a.history.push_back(tok);
      accept_token(a, tok);
      if (spec_ && !a.done && !a.json && !a.req.call_grammar) {
        // Prefilled in both engines: the decoder takes both sequences and the sampler's stream.
        a.handle =
            spec_->adopt(a.seq, a.dseq, a.req.prompt, tok, std::move(a.sampler), a.req.sampling);
      }
    } catch (const std::exception& e) {
      a.end(FinishReason::kError, e.what());
    }
  }
}

int32_t Scheduler::sample_constrained(Active& a, std::span<const float> logits) {
  if (!trie_) trie_ = TokenTrie::from_tokenizer(tokenizer_);
  if (!a.allowed_at || !a.allowed_at->same_state(*a.json)) {
    a.json->allowed_tokens(*trie_, a.allowed);
    a.allowed_at = a.json;
  }
  const bool whole = a.json->complete();
  const auto& stops = a.req.stop_tokens;
  auto ok = [&](size_t id) {
    if (id < a.allowed.size() && a.allowed[id]) return true;
    return whole && std::find(stops.begin(), stops.end(), static_cast<int32_t>(id)) != stops.end();
  };
  a.masked.assign(logits.begin(), logits.end());
  bool any = false;
  for (size_t id = 0; id < a.masked.size(); ++id) {
    if (ok(id)) {
      any = true;
    } else {
      a.masked[id] = -std::numeric_limits<float>::infinity();
    }
  }
  if (!any) {
    fail(
        "structured output: no token of the vocabulary continues the JSON value here (the "
        "schema may need something the tokenizer cannot write); hint: simplify the schema");
  }
  int32_t tok = a.sampler.sample(a.masked, a.history);
  // A draw lands on a removed token only through rounding at the distribution's very end.
  if (!ok(static_cast<size_t>(tok))) tok = runtime::argmax(a.masked);
  if (std::find(stops.begin(), stops.end(), tok) == stops.end()) {
    const auto bytes = tokenizer_.token_bytes(tok);
    if (!bytes || !a.json->feed(*bytes))
      fail("structured output: token {} does not continue the JSON value", tok);
  }
  return tok;
}

void Scheduler::fail_all(std::span<Active* const> who, const char* what, const std::exception& e) {
  std::fprintf(stderr, "exl3 serve: %s failed: %s\n", what, e.what());
  for (Active* a : who) a->end(FinishReason::kError, e.what());
}

void Scheduler::speculative_round(std::vector<std::unique_ptr<Active>>& running) {
  std::vector<runtime::SpeculativeDecoder::Slot> slots;
  std::vector<Active*> who;
  int64_t n = 0;
  for (auto& a : running) n += !a->done && a->handle >= 0;
  for (auto& a : running) {
    if (a->done || a->handle < 0) continue;
    slots.push_back(
        {a->handle, spec_->next_draft_tokens(a->handle, n, a->req.max_tokens - a->generated)});
    who.push_back(a.get());
  }
  if (slots.empty()) return;
  std::vector<std::vector<int32_t>> out;
  try {
    out = spec_->round(slots);
  } catch (const std::exception& e) {
    // The round's sequences are unusable now (SpeculativeDecoder::round); retire() removes them.
    fail_all(who, "a speculative round", e);
    return;
  }
  {
    std::lock_guard lk(mu_);
    ++stats_.steps;
    for (size_t j = 0; j < slots.size(); ++j) {
      ++stats_.speculative_rounds;
      stats_.drafted_tokens += slots[j].draft_tokens;
      stats_.accepted_tokens += static_cast<int64_t>(out[j].size()) - 1;
    }
  }
  for (size_t j = 0; j < who.size(); ++j) {
    for (const int32_t tok : out[j]) {
      if (who[j]->done) break;  // a stop or max_tokens: the rest of the round is not sent
      accept_token(*who[j], tok);
    }
  }
}

void Scheduler::accept_token(Active& a, int32_t tok) {
  ++a.generated;
  a.output.push_back(tok);
  {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lk(mu_);
    ++stats_.generation_tokens;
    if (a.generated == 1) {
      stats_.time_to_first_token.observe(std::chrono::duration<double>(now - a.submitted).count());
    } else {
      stats_.inter_token_latency.observe(std::chrono::duration<double>(now - a.last_token).count());
    }
    a.last_token = now;
  }
  auto finish = [&](FinishReason reason, const std::string& text, int32_t token) {
    a.stream->publish(text, token, a.generated);
    a.end(reason);
  };
  if (std::find(a.req.stop_tokens.begin(), a.req.stop_tokens.end(), tok) !=
      a.req.stop_tokens.end()) {
    finish(FinishReason::kStop, a.tail(), tok);
    return;
  }
  const auto r = a.matcher.push(a.decoder.push(tok));
  if (a.req.call_grammar) track_call(a, tok);
  if (r.stopped) {
    finish(FinishReason::kStop, r.text, tok);
  } else if (a.json && a.json->finished() && !a.req.call_grammar) {
    finish(FinishReason::kStop, r.text + a.tail(), tok);
  } else if (a.generated >= a.req.max_tokens) {
    finish(FinishReason::kLength, r.text + a.tail(), tok);
  } else {
    a.stream->publish(r.text, tok, a.generated);
    a.next = tok;
  }
}

void Scheduler::track_call(Active& a, int32_t tok) const {
  if (a.json) {
    // The call is whole (sample_constrained fed it this token): free text again.
    if (a.json->finished()) {
      a.json.reset();
      a.allowed_at.reset();
    }
    return;
  }
  // The token's raw bytes, so a marker that is a special token is seen whether or not the text
  // shows special tokens.
  const auto bytes = tokenizer_.token_bytes(tok);
  if (!bytes) return;
  a.trigger_scan += *bytes;
  const std::string& trigger = a.req.call_trigger;
  const size_t at = a.trigger_scan.find(trigger);
  if (at == std::string::npos) {
    // Only an end that could still begin the trigger is kept.
    if (a.trigger_scan.size() >= trigger.size())
      a.trigger_scan.erase(0, a.trigger_scan.size() - (trigger.size() - 1));
    return;
  }
  JsonMatcher m(a.req.call_grammar);
  const std::string rest = a.trigger_scan.substr(at + trigger.size());
  a.trigger_scan.clear();
  // The same token already went past the marker in a way the call's format does not allow:
  // nothing can be constrained now, and the tool-call parser returns that text as content.
  if (!rest.empty() && !m.feed(rest)) return;
  if (m.finished()) return;
  a.json.emplace(std::move(m));
}

std::pair<int64_t, int64_t> Scheduler::step_need(const Active& a) const {
  // Admission reserved the whole context (and at least the worst case for its first step).
  if (!a.decoding()) return {a.reserved, a.draft_reserved};
  // A decode step appends `next`, reaching prompt + generated tokens; a round also appends its
  // drafts (at most K, and none that would pass max_tokens: SpeculativeDecoder::next_draft_tokens).
  int64_t peak = static_cast<int64_t>(a.req.prompt.size()) + a.generated;
  if (spec_) {
    peak += std::clamp<int64_t>(a.req.max_tokens - a.generated - 1, 0, spec_->draft_tokens());
  }
  return {pages_for(peak, page_tokens_), draft_ ? pages_for(peak, draft_page_tokens_) : 0};
}

void Scheduler::reserve_step(std::vector<std::unique_ptr<Active>>& running) {
  std::vector<std::unique_ptr<Active>> preempted;  // newest first
  for (size_t i = 0; i < running.size();) {
    Active& a = *running[i];
    if (a.done) {
      ++i;
      continue;
    }
    const auto [need, draft_need] = step_need(a);
    const int64_t grow = std::max<int64_t>(0, need - a.reserved);
    const int64_t draft_grow = std::max<int64_t>(0, draft_need - a.draft_reserved);
    // Newer sequences give their pages back until this one's fit, this one last: the oldest
    // always fits alone (submit() refused what cannot), so the oldest always progresses.
    bool self = false;
    while (!self && (reserved_ + grow > cache_tokens_ ||
                     draft_reserved_ + draft_grow > draft_cache_tokens_)) {
      size_t j = running.size() - 1;
      while (running[j]->done) --j;  // stops at i at the latest
      self = j == i;
      preempt(*running[j]);
      preempted.push_back(std::move(running[j]));
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(j));
    }
    if (self) continue;  // running[i] is the next one now
    a.reserved += grow;
    reserved_ += grow;
    a.draft_reserved += draft_grow;
    draft_reserved_ += draft_grow;
    ++i;
  }
  if (preempted.empty()) return;
  std::lock_guard lk(mu_);
  // Back to the head of the queue, the oldest first, ahead of every request not yet admitted.
  for (auto& a : preempted) {
    Pending p;
    p.stream = a->stream;
    p.submitted = a->submitted;
    p.preempted = std::move(a);
    queue_.push_front(std::move(p));
  }
  stats_.preemptions += static_cast<int64_t>(preempted.size());
  stats_.running = static_cast<int64_t>(running.size());
  stats_.free_cache_tokens = engine_.free_cache_tokens();
  if (draft_) stats_.draft_free_cache_tokens = draft_->free_cache_tokens();
}

void Scheduler::preempt(Active& a) {
  if (a.handle >= 0) {
    a.suspended = spec_->suspend(a.handle);  // drops both engines' sequences
    a.handle = -1;
  } else {
    engine_.drop_sequence(a.seq);
    if (draft_) draft_->drop_sequence(a.dseq);
  }
  a.seq = a.dseq = -1;
  reserved_ -= a.reserved;
  draft_reserved_ -= a.draft_reserved;
  a.reserved = a.draft_reserved = 0;
  // Recomputed on readmission: what the KV held, the prompt and every sampled token but `next`.
  a.context = a.req.prompt;
  if (a.generated > 0) a.context.insert(a.context.end(), a.output.begin(), a.output.end() - 1);
  a.prefilled = 0;
  ++a.preemptions;
}

void Scheduler::retire(std::vector<std::unique_ptr<Active>>& running) {
  // Drop the sequences and count them first, then tell the clients: whoever sees a request end
  // also sees its KV pages back in the pool (and /health agrees).
  std::vector<std::unique_ptr<Active>> ended;
  for (auto& a : running) {
    if (!a->done) continue;
    if (a->handle >= 0) {
      spec_->remove(a->handle);  // both engines' sequences
    } else {
      engine_.drop_sequence(a->seq);
      if (draft_) draft_->drop_sequence(a->dseq);
    }
    reserved_ -= a->reserved;
    draft_reserved_ -= a->draft_reserved;
    ended.push_back(std::move(a));
  }
  std::erase(running, nullptr);
  {
    std::lock_guard lk(mu_);
    for (const auto& a : ended) {
      if (a->reason == FinishReason::kCancelled) {
        ++stats_.cancelled;
      } else if (a->reason == FinishReason::kError) {
        ++stats_.failed;
      } else {
        ++stats_.completed;
      }
    }
    stats_.running = static_cast<int64_t>(running.size());
    stats_.free_cache_tokens = engine_.free_cache_tokens();
    if (draft_) stats_.draft_free_cache_tokens = draft_->free_cache_tokens();
  }
  for (const auto& a : ended) a->stream->finish(a->reason, "", a->error, a->generated);
}

}  // namespace exl3::server
