// Speculative decoding with a draft model (see speculative.hpp).
#include "exl3/runtime/speculative.hpp"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "exl3/error.hpp"
#include "generation_loop.hpp"
#include "stopwatch.hpp"

namespace exl3::runtime {

double SpeculativeStats::acceptance_rate() const {
  return drafted > 0 ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0;
}

double SpeculativeStats::tokens_per_round() const {
  return rounds > 0 ? static_cast<double>(accepted + rounds) / static_cast<double>(rounds) : 0.0;
}

namespace {

constexpr int kMaxDraftTokens = 16;
// The draft sampler's seed is the target's with these bits flipped: two independent streams.
constexpr uint64_t kDraftSeedXor = 0x9E3779B97F4A7C15ull;

SamplingOptions draft_sampling(SamplingOptions s) {
  s.seed ^= kDraftSeedXor;
  return s;
}

}  // namespace

// One sequence: its ids in both engines, its samplers, the stream so far (prompt + emitted), and
// what each cache still lacks. The target's cache holds the stream but `next` (the last emitted
// token); the draft's holds the stream but `pending`.
struct SpeculativeDecoder::Seq {
  Engine::SeqId t = -1, d = -1;
  SamplingOptions sampling;
  Sampler sampler, draft_sampler;
  bool greedy, penalty;
  std::vector<int32_t> stream, pending, drafts;
  std::vector<std::vector<float>> q;  // sampling: the draft's probability of each id, per draft
  int32_t next = -1;
  int k = 0;  // this round's draft count
  SpeculativeStats stats;
  DraftPolicy::Acceptance acceptance;

  explicit Seq(const SamplingOptions& s)
      : sampling(s),
        sampler(s),
        draft_sampler(draft_sampling(s)),
        greedy(s.temperature == 0.0f),
        penalty(s.repetition_penalty != 1.0f) {}
  // The history the repetition penalty reads (none without a penalty: no copies to pass).
  std::span<const int32_t> hist(std::span<const int32_t> h) const {
    return penalty ? h : std::span<const int32_t>{};
  }
};

SpeculativeDecoder::SpeculativeDecoder(Engine& target, Engine& draft,
                                       const SpeculativeOptions& spec)
    : target_(target), draft_(draft), spec_(spec), policy_(spec.draft_tokens) {
  if (spec.draft_tokens < 1 || spec.draft_tokens > kMaxDraftTokens) {
    fail("speculative decoding: draft tokens {} outside 1..{}", spec.draft_tokens, kMaxDraftTokens);
  }
  if (draft.spec().vocab_size != target.spec().vocab_size) {
    fail(
        "speculative decoding: the draft model's vocabulary has {} tokens, the target's {}; hint: "
        "the draft must share the target's tokenizer",
        draft.spec().vocab_size, target.spec().vocab_size);
  }
  // Rejected draft tokens are dropped by truncating both sequences, which a recurrent state
  // cannot follow.
  for (const Engine* e : {&target, &draft}) {
    if (e->spec().has_recurrent_layers()) {
      fail(
          "speculative decoding: {} ({}) has gated DeltaNet layers, whose recurrent state cannot "
          "be rewound to drop rejected draft tokens; hint: decode without --draft / --mtp",
          e == &target ? "the target" : "the draft", e->spec().label);
    }
  }
}

SpeculativeDecoder::~SpeculativeDecoder() {
  for (size_t h = 0; h < seqs_.size(); ++h) {
    if (seqs_[h]) remove(static_cast<int>(h));
  }
}

SpeculativeDecoder::Seq& SpeculativeDecoder::seq(int handle) {
  return const_cast<Seq&>(std::as_const(*this).seq(handle));
}

const SpeculativeDecoder::Seq& SpeculativeDecoder::seq(int handle) const {
  if (handle < 0 || static_cast<size_t>(handle) >= seqs_.size() || !seqs_[handle]) {
    fail("speculative decoding: no sequence {}", handle);
  }
  return *seqs_[static_cast<size_t>(handle)];
}

const SpeculativeStats& SpeculativeDecoder::stats(int handle) const {
  return seq(handle).stats;
}

int SpeculativeDecoder::next_draft_tokens(int handle, int64_t batch, int64_t remaining) const {
  const Seq& s = seq(handle);
  const int k = spec_.adaptive ? policy_.choose(s.acceptance, batch) : spec_.draft_tokens;
  return static_cast<int>(std::clamp<int64_t>(remaining - 1, 0, k));
}

SpeculativeDecoder::Added SpeculativeDecoder::add(std::span<const int32_t> prompt,
                                                  const SamplingOptions& sampling) {
  if (prompt.empty()) fail("speculative decoding: the prompt has no tokens");
  const Engine::SeqId t = target_.new_sequence();
  Engine::SeqId d = -1;
  try {
    d = draft_.new_draft_sequence(target_, t);
  } catch (...) {
    target_.drop_sequence(t);
    throw;
  }
  try {
    const std::vector<float> logits = target_.forward(t, prompt, LogitsMode::kLast);
    draft_.forward(d, prompt, LogitsMode::kLast);
    Sampler sampler(sampling);
    const std::vector<int32_t> history(
        prompt.begin(), sampling.repetition_penalty != 1.0f ? prompt.end() : prompt.begin());
    const int32_t first = sampler.sample(logits, history);
    return {adopt(t, d, prompt, first, std::move(sampler), sampling), first};
  } catch (...) {
    target_.drop_sequence(t);
    draft_.drop_sequence(d);
    throw;
  }
}

int SpeculativeDecoder::adopt(Engine::SeqId target_seq, Engine::SeqId draft_seq,
                              std::span<const int32_t> prompt, int32_t first, Sampler sampler,
                              const SamplingOptions& sampling) {
  const auto n = static_cast<int64_t>(prompt.size());
  if (prompt.empty()) fail("speculative decoding: the prompt has no tokens");
  if (target_.sequence_length(target_seq) != n || draft_.sequence_length(draft_seq) != n) {
    fail(
        "speculative decoding: a sequence to take over holds {} tokens in the model and {} in the "
        "draft, but its prompt has {}",
        target_.sequence_length(target_seq), draft_.sequence_length(draft_seq), n);
  }
  auto s = std::make_unique<Seq>(sampling);
  s->sampler = std::move(sampler);
  s->t = target_seq;
  s->d = draft_seq;
  s->stream.assign(prompt.begin(), prompt.end());
  s->next = first;
  s->stream.push_back(first);
  s->pending = {first};
  seqs_.push_back(std::move(s));
  return static_cast<int>(seqs_.size() - 1);
}

void SpeculativeDecoder::remove(int handle) {
  Seq& s = seq(handle);
  target_.drop_sequence(s.t);
  draft_.drop_sequence(s.d);
  seqs_[static_cast<size_t>(handle)].reset();
}

SpeculativeDecoder::Suspended SpeculativeDecoder::suspend(int handle) {
  Seq& s = seq(handle);
  Suspended out{s.sampling, std::move(s.sampler), std::move(s.draft_sampler), s.acceptance,
                s.stats};
  remove(handle);
  return out;
}

int SpeculativeDecoder::resume(Engine::SeqId target_seq, Engine::SeqId draft_seq,
                               std::span<const int32_t> held, int32_t next, Suspended state) {
  // The caches hold the stream but `next`: what adopt() expects after a prompt pass that sampled
  // `next`, so the next round feeds `next` first, as it would have without the interruption.
  const int h = adopt(target_seq, draft_seq, held, next, std::move(state.sampler), state.sampling);
  Seq& s = seq(h);
  s.draft_sampler = std::move(state.draft_sampler);
  s.acceptance = state.acceptance;
  s.stats = state.stats;
  return h;
}

std::vector<std::vector<int32_t>> SpeculativeDecoder::round(std::span<const Slot> slots) {
  if (slots.empty()) return {};
  const int64_t vocab = target_.spec().vocab_size;
  std::vector<Seq*> ss;
  for (const Slot& sl : slots) {
    Seq& s = seq(sl.handle);
    if (sl.draft_tokens < 0 || sl.draft_tokens > spec_.draft_tokens) {
      fail("speculative decoding: {} draft tokens for sequence {} (0..{})", sl.draft_tokens,
           sl.handle, spec_.draft_tokens);
    }
    if (std::find(ss.begin(), ss.end(), &s) != ss.end()) {
      fail("speculative decoding: sequence {} twice in one round", sl.handle);
    }
    s.k = sl.draft_tokens;
    s.drafts.clear();
    ss.push_back(&s);
  }

  // When every sequence is plain greedy, both models pick their argmax ids themselves (on the GPU,
  // no vocabulary-wide rows come back), and the ids are all a round needs.
  const bool ids_only =
      std::ranges::all_of(ss, [](const Seq* s) { return s->greedy && !s->penalty; });

  // Drafts: step i feeds each drafting sequence what its cache lacks (step 0) or its draft i - 1,
  // all as one batch, and draws its draft i from the logits.
  const int steps = std::ranges::max(slots, {}, &Slot::draft_tokens).draft_tokens;
  std::vector<Engine::BatchEntry> batch;
  std::vector<Seq*> in_batch;
  for (int i = 0; i < steps; ++i) {
    batch.clear();
    in_batch.clear();
    for (Seq* s : ss) {
      if (i >= s->k) continue;
      const std::span<const int32_t> feed =
          i == 0 ? std::span<const int32_t>(s->pending) : std::span(s->drafts).subspan(i - 1, 1);
      batch.push_back({s->d, feed, LogitsMode::kLast});
      in_batch.push_back(s);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<int32_t>> ids;
    if (ids_only) {
      ids = draft_.forward_batch_argmax(batch);
    } else {
      logits = draft_.forward_batch(batch);
    }
    policy_.record_draft_step(static_cast<int64_t>(batch.size()), seconds_since(t0));
    for (size_t b = 0; b < in_batch.size(); ++b) {
      Seq& s = *in_batch[b];
      if (i == 0) s.pending.clear();
      std::vector<int32_t> history;  // the penalty's: the stream and the drafts so far
      if (s.penalty) {
        history = s.stream;
        history.insert(history.end(), s.drafts.begin(), s.drafts.end());
      }
      int32_t tok = 0;
      if (ids_only) {
        tok = ids[b].front();
      } else if (s.greedy) {
        tok = s.draft_sampler.sample(logits[b], s.hist(history));
      } else {
        const Sampler::Weights w = s.draft_sampler.weights(logits[b], s.hist(history));
        s.q.resize(static_cast<size_t>(s.k));
        auto& qi = s.q[static_cast<size_t>(i)];
        qi.assign(static_cast<size_t>(vocab), 0.0f);
        for (const auto& [wt, id] : w.entries) {
          qi[static_cast<size_t>(id)] = static_cast<float>(wt / w.total);
        }
        tok = s.draft_sampler.draw(w);
      }
      s.drafts.push_back(tok);
    }
  }

  // The target scores each sequence's `next` and drafts in one pass: row i is its choice after
  // draft i.
  std::vector<std::vector<int32_t>> feeds(ss.size());
  batch.clear();
  for (size_t j = 0; j < ss.size(); ++j) {
    feeds[j].assign(1, ss[j]->next);
    feeds[j].insert(feeds[j].end(), ss[j]->drafts.begin(), ss[j]->drafts.end());
    batch.push_back({ss[j]->t, feeds[j], LogitsMode::kAll});
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> rows;
  std::vector<std::vector<int32_t>> choices;  // ids_only: the target's argmax per row
  if (ids_only) {
    choices = target_.forward_batch_argmax(batch);
  } else {
    rows = target_.forward_batch(batch);
  }
  policy_.record_verify(static_cast<int64_t>(ss.size()), steps, seconds_since(t0));

  std::vector<std::vector<int32_t>> out(ss.size());
  std::vector<std::pair<float, int32_t>> residual;
  for (size_t j = 0; j < ss.size(); ++j) {
    Seq& s = *ss[j];
    const auto row = [&](int i) {
      return std::span<const float>(rows[j]).subspan(static_cast<size_t>(i) * vocab, vocab);
    };
    std::vector<int32_t> tstream;  // the penalty's: the stream and the kept drafts
    if (s.penalty) tstream = s.stream;
    int accepted = 0;
    int32_t bonus = -1;
    if (s.greedy) {
      // The target's own choice after draft i (read when needed: the penalty's history grows).
      const auto choice = [&](int i) {
        return ids_only ? choices[j][static_cast<size_t>(i)]
                        : s.sampler.sample(row(i), s.hist(tstream));
      };
      // A draft is kept while it is the target's own choice.
      while (accepted < s.k && choice(accepted) == s.drafts[static_cast<size_t>(accepted)]) {
        if (s.penalty) tstream.push_back(s.drafts[static_cast<size_t>(accepted)]);
        ++accepted;
      }
      bonus = choice(accepted);
    } else {
      while (accepted < s.k && bonus < 0) {
        const int32_t d = s.drafts[static_cast<size_t>(accepted)];
        const auto& qi = s.q[static_cast<size_t>(accepted)];
        const Sampler::Weights p = s.sampler.weights(row(accepted), s.hist(tstream));
        double pd = 0.0;
        for (const auto& [wt, id] : p.entries) {
          if (id == d) pd = wt / p.total;
        }
        // Keep d with probability min(1, p(d) / q(d)) ...
        if (s.sampler.uniform() * qi[static_cast<size_t>(d)] < pd) {
          if (s.penalty) tstream.push_back(d);
          ++accepted;
          continue;
        }
        // ... else draw from the residual max(0, p - q), renormalised.
        residual.clear();
        double total = 0.0;
        for (const auto& [wt, id] : p.entries) {
          const double left = std::max(0.0, wt / p.total - qi[static_cast<size_t>(id)]);
          if (left > 0.0) residual.push_back({static_cast<float>(left), id});
          total += static_cast<float>(left);
        }
        bonus = residual.empty() ? s.sampler.draw(p) : s.sampler.draw({residual, total});
      }
      if (bonus < 0) bonus = s.sampler.draw(s.sampler.weights(row(accepted), s.hist(tstream)));
    }
    ++s.stats.rounds;
    s.stats.drafted += s.k;
    s.stats.accepted += accepted;
    DraftPolicy::record(s.acceptance, s.k, accepted);

    // Both caches keep the stream and the kept drafts; the draft then lacks at most its last
    // draft and the bonus, and is fed them first next round.
    const auto kept = static_cast<int64_t>(s.stream.size()) + accepted;
    target_.truncate_sequence(s.t, kept);
    if (draft_.sequence_length(s.d) > kept) draft_.truncate_sequence(s.d, kept);
    out[j].assign(s.drafts.begin(), s.drafts.begin() + accepted);
    out[j].push_back(bonus);
    s.stream.insert(s.stream.end(), out[j].begin(), out[j].end());
    s.next = bonus;
    const auto dlen = static_cast<size_t>(draft_.sequence_length(s.d));
    s.pending.assign(s.stream.begin() + static_cast<std::ptrdiff_t>(dlen), s.stream.end());
  }
  return out;
}

GenerateResult generate_speculative(Engine& target, Engine& draft, std::span<const int32_t> prompt,
                                    const GenerateOptions& opts, const SpeculativeOptions& spec,
                                    SpeculativeStats* stats,
                                    const std::function<bool(int32_t)>& on_token) {
  check_generate_request("speculative decoding", prompt, opts);
  SpeculativeDecoder dec(target, draft, spec);
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  check_context_length(target.spec(), n_prompt, opts.max_new_tokens);
  check_context_length(draft.spec(), n_prompt, opts.max_new_tokens, "the draft model");

  GenerateResult r;
  r.prompt_tokens = n_prompt;
  r.stop_reason = "max_tokens";
  if (stats != nullptr) *stats = {};
  if (opts.max_new_tokens == 0) return r;
  const auto emit = [&](int32_t tok) { return emit_token(r, tok, opts, on_token); };
  auto t0 = std::chrono::steady_clock::now();
  const auto added = dec.add(prompt, opts.sampling);
  r.prompt_seconds = seconds_since(t0);
  const auto finish = [&] {
    if (stats != nullptr) *stats = dec.stats(added.handle);
    return r;
  };
  if (!emit(added.first)) return finish();
  while (static_cast<int64_t>(r.tokens.size()) < opts.max_new_tokens) {
    t0 = std::chrono::steady_clock::now();
    const int64_t remaining = opts.max_new_tokens - static_cast<int64_t>(r.tokens.size());
    const SpeculativeDecoder::Slot slot{added.handle,
                                        dec.next_draft_tokens(added.handle, 1, remaining)};
    const auto out = dec.round({&slot, 1});
    r.decode_seconds += seconds_since(t0);
    ++r.decode_steps;
    r.decode_tokens += static_cast<int64_t>(out[0].size());
    for (const int32_t tok : out[0]) {
      if (!emit(tok)) return finish();
    }
  }
  return finish();
}

}  // namespace exl3::runtime
