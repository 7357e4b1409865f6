// `exl3 bench model --draft-tokens K`: speculative decoding with forced acceptance, and
// `--mtp K`: with the model's MTP head (see model_bench.hpp).
#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "exl3/error.hpp"
#include "exl3/runtime/model_bench.hpp"
#include "exl3/runtime/speculative.hpp"
#include "stopwatch.hpp"

namespace exl3::runtime {
namespace {

// The wrapped engine with every logits row rotated by one id (row[i] = wrapped[i - 1]), so its
// greedy choice is always the id after the wrapped engine's: a draft that never agrees. A
// benchmark fixture; sequences are the wrapped engine's.
class DisagreeingDraft final : public Engine {
 public:
  explicit DisagreeingDraft(Engine& e) : e_(e) {}
  const ModelSpec& spec() const override { return e_.spec(); }
  Device device() const override { return e_.device(); }
  SeqId new_sequence() override { return e_.new_sequence(); }
  void drop_sequence(SeqId seq) override { e_.drop_sequence(seq); }
  int64_t sequence_length(SeqId seq) const override { return e_.sequence_length(seq); }
  void truncate_sequence(SeqId seq, int64_t length) override { e_.truncate_sequence(seq, length); }
  KvCacheInfo kv_cache_info() const override { return e_.kv_cache_info(); }
  int64_t free_cache_tokens() const override { return e_.free_cache_tokens(); }
  int64_t cache_tokens_needed(SeqId seq, int64_t new_tokens) const override {
    return e_.cache_tokens_needed(seq, new_tokens);
  }
  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    const BatchEntry e{seq, tokens, mode};
    return std::move(forward_batch(std::span<const BatchEntry>(&e, 1)).front());
  }
  std::vector<std::vector<float>> forward_batch(std::span<const BatchEntry> batch) override {
    auto out = e_.forward_batch(batch);
    const auto v = static_cast<std::ptrdiff_t>(spec().vocab_size);
    for (auto& l : out) {
      for (auto row = l.begin(); row != l.end(); row += v) std::rotate(row, row + v - 1, row + v);
    }
    return out;
  }
  // The rotated rows' argmax is the id after the wrapped engine's (exact but for a tie between
  // the last id and another), picked where the wrapped engine picks its own.
  std::vector<std::vector<int32_t>> forward_batch_argmax(
      std::span<const BatchEntry> batch) override {
    auto ids = e_.forward_batch_argmax(batch);
    const auto v = static_cast<int32_t>(spec().vocab_size);
    for (auto& l : ids) {
      for (auto& id : l) id = (id + 1) % v;
    }
    return ids;
  }

 private:
  Engine& e_;
};

enum class Drafting { kNone, kFixed, kAdaptive };

struct RoundsResult {
  double tokens_per_second = 0.0;
  SpeculativeStats stats;  // summed over the sequences
};

// `batch` sequences of the prompts generate `tokens` each (greedy) in rounds of one decoder;
// the rate counts the tokens after each prompt's first over the rounds' wall time.
RoundsResult run_rounds(Engine& target, Engine& draft,
                        const std::vector<std::vector<int32_t>>& prompts, int64_t tokens, int k,
                        Drafting mode) {
  SpeculativeDecoder dec(target, draft, {k, mode == Drafting::kAdaptive});
  std::vector<int> handles;
  std::vector<int64_t> emitted;
  for (const auto& p : prompts) {
    handles.push_back(dec.add(p, {}).handle);
    emitted.push_back(1);
  }
  double seconds = 0.0;
  int64_t counted = 0;
  std::vector<SpeculativeDecoder::Slot> slots;
  std::vector<size_t> index;
  for (;;) {
    slots.clear();
    index.clear();
    for (size_t i = 0; i < handles.size(); ++i) {
      const int64_t left = tokens - emitted[i];
      if (left <= 0) continue;
      // kFixed: the decoder is not adaptive, so it answers k (capped at the end).
      const int want =
          mode == Drafting::kNone
              ? 0
              : dec.next_draft_tokens(handles[i], static_cast<int64_t>(handles.size()), left);
      slots.push_back({handles[i], want});
      index.push_back(i);
    }
    if (slots.empty()) break;
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = dec.round(slots);
    seconds += seconds_since(t0);
    for (size_t j = 0; j < out.size(); ++j) {
      const auto n = static_cast<int64_t>(out[j].size());
      emitted[index[j]] += n;
      counted += n;
    }
  }
  RoundsResult r;
  r.tokens_per_second = static_cast<double>(counted) / seconds;
  for (const int h : handles) {
    const auto& s = dec.stats(h);
    r.stats.rounds += s.rounds;
    r.stats.drafted += s.drafted;
    r.stats.accepted += s.accepted;
  }
  return r;
}

// `batch` prompts of `context` ids drawn from `tok`.
std::vector<std::vector<int32_t>> random_prompts(std::mt19937_64& rng,
                                                 std::uniform_int_distribution<int32_t>& tok,
                                                 int64_t batch, int64_t context) {
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(context));
    for (auto& t : p) t = tok(rng);
  }
  return prompts;
}

}  // namespace

SpeculativeBenchResult bench_speculative(Engine& engine, int draft_tokens,
                                         const ModelBenchOptions& opts) {
  SpeculativeBenchResult res;
  res.draft_tokens = draft_tokens;
  res.tokens = std::max<int64_t>(opts.decode_steps, 2);
  const int64_t context = std::max<int64_t>(opts.context, 1);
  std::mt19937_64 rng(opts.seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(engine.spec().vocab_size) - 1);
  DisagreeingDraft never(engine);
  for (const int64_t batch : opts.batches) {
    // The model drafting for itself holds two sequences per stream.
    const int64_t need = 2 * batch * (context + res.tokens + draft_tokens + 1);
    if (need > engine.free_cache_tokens()) {
      fail(
          "bench model --draft-tokens: batch {} needs {} KV cache tokens, {} are free; hint: "
          "raise --cache-tokens",
          batch, need, engine.free_cache_tokens());
    }
    const auto prompts = random_prompts(rng, tok, batch, context);
    SpeculativeBatchResult b;
    b.batch = batch;
    // Each figure is the median of three runs after a warm-up (CUDA graphs are captured there).
    std::vector<double> plain, all, none, adaptive, all_acc, none_acc, adaptive_drafts;
    for (int rep = 0; rep < 4; ++rep) {
      const auto p = run_rounds(engine, engine, prompts, res.tokens, draft_tokens, Drafting::kNone);
      const auto a =
          run_rounds(engine, engine, prompts, res.tokens, draft_tokens, Drafting::kFixed);
      const auto n = run_rounds(engine, never, prompts, res.tokens, draft_tokens, Drafting::kFixed);
      const auto d =
          run_rounds(engine, never, prompts, res.tokens, draft_tokens, Drafting::kAdaptive);
      if (rep == 0) continue;
      plain.push_back(p.tokens_per_second);
      all.push_back(a.tokens_per_second);
      none.push_back(n.tokens_per_second);
      adaptive.push_back(d.tokens_per_second);
      all_acc.push_back(a.stats.acceptance_rate());
      none_acc.push_back(n.stats.acceptance_rate());
      adaptive_drafts.push_back(static_cast<double>(d.stats.drafted) /
                                static_cast<double>(std::max<int64_t>(d.stats.rounds, 1)));
    }
    b.plain_tokens_per_second = median(plain);
    b.all_tokens_per_second = median(all);
    b.none_tokens_per_second = median(none);
    b.adaptive_none_tokens_per_second = median(adaptive);
    b.all_acceptance = median(all_acc);
    b.none_acceptance = median(none_acc);
    b.adaptive_none_drafts_per_round = median(adaptive_drafts);
    b.decode_step_seconds = static_cast<double>(batch) / b.plain_tokens_per_second;

    // The verify pass alone: K + 1 tokens appended to each sequence of the prompts in one pass,
    // then cut back.
    std::vector<Engine::SeqId> seqs;
    for (const auto& p : prompts) {
      seqs.push_back(engine.new_sequence());
      engine.forward(seqs.back(), p, LogitsMode::kLast);
    }
    std::vector<std::vector<int32_t>> blocks(static_cast<size_t>(batch),
                                             std::vector<int32_t>(draft_tokens + 1));
    std::vector<Engine::BatchEntry> entries;
    for (size_t i = 0; i < seqs.size(); ++i)
      entries.push_back({seqs[i], blocks[i], LogitsMode::kAll});
    std::vector<double> times;
    for (int rep = 0; rep < 12; ++rep) {
      for (auto& blk : blocks) {
        for (auto& t : blk) t = tok(rng);
      }
      const auto t0 = std::chrono::steady_clock::now();
      engine.forward_batch(entries);
      if (rep >= 2) times.push_back(seconds_since(t0));
      for (const auto s : seqs) engine.truncate_sequence(s, context);
    }
    for (const auto s : seqs) engine.drop_sequence(s);
    b.verify_seconds = median(times);
    res.batches.push_back(b);
  }
  return res;
}

MtpBenchResult bench_mtp(Engine& engine, Engine& mtp, int draft_tokens,
                         const ModelBenchOptions& opts) {
  MtpBenchResult res;
  res.draft_tokens = draft_tokens;
  res.tokens = std::max<int64_t>(opts.decode_steps, 2);
  const int64_t context = std::max<int64_t>(opts.context, 1);
  std::mt19937_64 rng(opts.seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(engine.spec().vocab_size) - 1);
  for (const int64_t batch : opts.batches) {
    const int64_t need = batch * (context + res.tokens + draft_tokens + 1);
    if (need > engine.free_cache_tokens() || need > mtp.free_cache_tokens()) {
      fail(
          "bench model --mtp: batch {} needs {} KV cache tokens in the model and in the MTP "
          "head, {} and {} are free; hint: raise --cache-tokens",
          batch, need, engine.free_cache_tokens(), mtp.free_cache_tokens());
    }
    const auto prompts = random_prompts(rng, tok, batch, context);
    // Each figure is the median of three runs after a warm-up.
    std::vector<double> plain, fixed, fixed_acc, fixed_round, adaptive, adaptive_acc;
    for (int rep = 0; rep < 4; ++rep) {
      const auto p = run_rounds(engine, mtp, prompts, res.tokens, draft_tokens, Drafting::kNone);
      const auto f = run_rounds(engine, mtp, prompts, res.tokens, draft_tokens, Drafting::kFixed);
      const auto a =
          run_rounds(engine, mtp, prompts, res.tokens, draft_tokens, Drafting::kAdaptive);
      if (rep == 0) continue;
      plain.push_back(p.tokens_per_second);
      fixed.push_back(f.tokens_per_second);
      fixed_acc.push_back(f.stats.acceptance_rate());
      fixed_round.push_back(f.stats.tokens_per_round());
      adaptive.push_back(a.tokens_per_second);
      adaptive_acc.push_back(a.stats.acceptance_rate());
    }
    MtpBatchResult b;
    b.batch = batch;
    b.plain_tokens_per_second = median(plain);
    b.fixed_tokens_per_second = median(fixed);
    b.fixed_acceptance = median(fixed_acc);
    b.fixed_tokens_per_round = median(fixed_round);
    b.adaptive_tokens_per_second = median(adaptive);
    b.adaptive_acceptance = median(adaptive_acc);
    res.batches.push_back(b);
  }
  return res;
}

}  // namespace exl3::runtime
