// Greedy speculative decoding with a draft model (see speculative.hpp).
#include "exl3/runtime/speculative.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "exl3/error.hpp"
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

// A sequence dropped when the generation ends, however it ends.
struct OwnedSequence {
  Engine& engine;
  Engine::SeqId id;
  explicit OwnedSequence(Engine& e) : engine(e), id(e.new_sequence()) {}
  ~OwnedSequence() { engine.drop_sequence(id); }
  OwnedSequence(const OwnedSequence&) = delete;
  OwnedSequence& operator=(const OwnedSequence&) = delete;
};

}  // namespace

GenerateResult generate_speculative(Engine& target, Engine& draft, std::span<const int32_t> prompt,
                                    const GenerateOptions& opts, const SpeculativeOptions& spec,
                                    SpeculativeStats* stats,
                                    const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) fail("speculative decoding: the prompt has no tokens");
  if (opts.max_new_tokens < 0) {
    fail("speculative decoding: max_new_tokens {} is negative", opts.max_new_tokens);
  }
  if (spec.draft_tokens < 1 || spec.draft_tokens > kMaxDraftTokens) {
    fail("speculative decoding: draft tokens {} outside 1..{}", spec.draft_tokens, kMaxDraftTokens);
  }
  const int64_t vocab = target.spec().vocab_size;
  if (draft.spec().vocab_size != vocab) {
    fail(
        "speculative decoding: the draft model's vocabulary has {} tokens, the target's {}; hint: "
        "the draft must share the target's tokenizer",
        draft.spec().vocab_size, vocab);
  }
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  check_context_length(target.spec(), n_prompt, opts.max_new_tokens);
  check_context_length(draft.spec(), n_prompt, opts.max_new_tokens, "the draft model");

  // The target's sampler and the draft's (its own stream, seeded apart). The repetition penalty
  // reads the stream so far, as in generate().
  Sampler sampler(opts.sampling);
  SamplingOptions draft_opts = opts.sampling;
  draft_opts.seed ^= kDraftSeedXor;
  Sampler draft_sampler(draft_opts);
  const bool greedy = opts.sampling.temperature == 0.0f;
  const bool penalty = opts.sampling.repetition_penalty != 1.0f;
  std::vector<int32_t> stream(prompt.begin(), prompt.end());  // prompt + emitted tokens
  const auto hist = [&](std::span<const int32_t> history) {
    return penalty ? history : std::span<const int32_t>{};
  };
  const auto pick = [&](std::span<const float> logits, std::span<const int32_t> history) {
    return sampler.sample(logits, hist(history));
  };
  // Sampling: q[i][id], the draft's probability of each id at draft position i.
  std::vector<std::vector<float>> q;

  GenerateResult r;
  r.prompt_tokens = n_prompt;
  SpeculativeStats local;
  SpeculativeStats& st = stats != nullptr ? *stats : local;
  st = {};
  OwnedSequence seq_t(target), seq_d(draft);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = target.forward(seq_t.id, prompt, LogitsMode::kLast);
  draft.forward(seq_d.id, prompt, LogitsMode::kLast);
  r.prompt_seconds = seconds_since(t0);
  r.stop_reason = "max_tokens";

  // false: generation ends (a stop token, or the callback said so).
  const auto emit = [&](int32_t tok) {
    if (std::find(opts.stop_tokens.begin(), opts.stop_tokens.end(), tok) !=
        opts.stop_tokens.end()) {
      r.stop_reason = "stop_token";
      r.stop_token = tok;
      return false;
    }
    r.tokens.push_back(tok);
    stream.push_back(tok);
    if (on_token && !on_token(tok)) {
      r.stop_reason = "callback";
      return false;
    }
    return true;
  };
  if (opts.max_new_tokens == 0) return r;
  int32_t next = pick(logits, stream);
  if (!emit(next)) return r;

  // The target's cache holds the stream but `next`; the draft's holds the stream but `pending`.
  std::vector<int32_t> pending = {next}, drafts, feed;
  std::vector<std::pair<float, int32_t>> residual;
  while (static_cast<int64_t>(r.tokens.size()) < opts.max_new_tokens) {
    t0 = std::chrono::steady_clock::now();
    const int64_t remaining = opts.max_new_tokens - static_cast<int64_t>(r.tokens.size());
    // A round emits up to k + 1 tokens; the last round drafts only what it can still emit.
    const auto k = static_cast<int>(std::min<int64_t>(spec.draft_tokens, remaining - 1));
    const auto base = static_cast<int64_t>(stream.size());  // with `next`
    drafts.clear();
    if (k > 0) {
      std::vector<int32_t> dstream = stream;
      std::vector<float> dl = draft.forward(seq_d.id, pending, LogitsMode::kLast);
      pending.clear();
      for (int i = 0; i < k; ++i) {
        int32_t tok = 0;
        if (greedy) {
          tok = draft_sampler.sample(dl, hist(dstream));
        } else {
          const Sampler::Weights w = draft_sampler.weights(dl, hist(dstream));
          q.resize(static_cast<size_t>(k));
          auto& qi = q[static_cast<size_t>(i)];
          qi.assign(static_cast<size_t>(vocab), 0.0f);
          for (const auto& [wt, id] : w.entries) {
            qi[static_cast<size_t>(id)] = static_cast<float>(wt / w.total);
          }
          tok = draft_sampler.draw(w);
        }
        drafts.push_back(tok);
        dstream.push_back(tok);
        if (i + 1 < k) dl = draft.forward(seq_d.id, {&tok, 1}, LogitsMode::kLast);
      }
    }
    // The target scores `next` and every draft in one pass: row i is its choice after draft i.
    feed.assign(1, next);
    feed.insert(feed.end(), drafts.begin(), drafts.end());
    const std::vector<float> rows = target.forward(seq_t.id, feed, LogitsMode::kAll);
    const auto row = [&](int i) {
      return std::span<const float>(rows).subspan(static_cast<size_t>(i) * vocab, vocab);
    };
    std::vector<int32_t> tstream = stream;
    int accepted = 0;
    int32_t bonus = -1;
    if (greedy) {
      while (accepted < k &&
             pick(row(accepted), tstream) == drafts[static_cast<size_t>(accepted)]) {
        tstream.push_back(drafts[static_cast<size_t>(accepted)]);
        ++accepted;
      }
      bonus = pick(row(accepted), tstream);
    } else {
      while (accepted < k && bonus < 0) {
        const int32_t d = drafts[static_cast<size_t>(accepted)];
        const auto& qi = q[static_cast<size_t>(accepted)];
        const Sampler::Weights p = sampler.weights(row(accepted), hist(tstream));
        double pd = 0.0;
        for (const auto& [wt, id] : p.entries) {
          if (id == d) pd = wt / p.total;
        }
        // Keep d with probability min(1, p(d) / q(d)) ...
        if (sampler.uniform() * qi[static_cast<size_t>(d)] < pd) {
          tstream.push_back(d);
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
        bonus = residual.empty() ? sampler.draw(p) : sampler.draw({residual, total});
      }
      if (bonus < 0) bonus = sampler.draw(sampler.weights(row(accepted), hist(tstream)));
    }
    ++st.rounds;
    st.drafted += k;
    st.accepted += accepted;

    // Both caches keep the stream and the accepted drafts; the draft then owes what it lacks.
    const int64_t kept = base + accepted;
    target.truncate_sequence(seq_t.id, kept);
    if (draft.sequence_length(seq_d.id) > kept) draft.truncate_sequence(seq_d.id, kept);
    r.decode_seconds += seconds_since(t0);
    ++r.decode_steps;
    r.decode_tokens += accepted + 1;
    for (int i = 0; i < accepted; ++i) {
      if (!emit(drafts[static_cast<size_t>(i)])) return r;
    }
    if (!emit(bonus)) return r;
    next = bonus;
    // The draft's cache holds stream[0 .. its length); it is fed the rest (`next` included) first
    // thing next round: one token, or two when it had proposed every accepted draft.
    const auto dlen = static_cast<size_t>(draft.sequence_length(seq_d.id));
    pending.assign(stream.begin() + static_cast<std::ptrdiff_t>(dlen), stream.end());
  }
  return r;
}

}  // namespace exl3::runtime
