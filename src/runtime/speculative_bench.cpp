// `exl3 bench model --draft-tokens K`: speculative decoding with forced acceptance (see
// model_bench.hpp).
#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "exl3/error.hpp"
#include "exl3/runtime/generate.hpp"
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
  int64_t free_cache_tokens() const override { return e_.free_cache_tokens(); }
  int64_t cache_tokens_needed(SeqId seq, int64_t new_tokens) const override {
    return e_.cache_tokens_needed(seq, new_tokens);
  }
  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    std::vector<float> l = e_.forward(seq, tokens, mode);
    const auto v = static_cast<std::ptrdiff_t>(spec().vocab_size);
    for (auto row = l.begin(); row != l.end(); row += v) std::rotate(row, row + v - 1, row + v);
    return l;
  }

 private:
  Engine& e_;
};

}  // namespace

SpeculativeBenchResult bench_speculative(Engine& engine, int draft_tokens,
                                         const ModelBenchOptions& opts) {
  SpeculativeBenchResult res;
  res.draft_tokens = draft_tokens;
  res.tokens = std::max<int64_t>(opts.decode_steps, 2);
  const int64_t need = 2 * (opts.context + res.tokens + draft_tokens + 1);
  if (need > engine.free_cache_tokens()) {
    fail(
        "bench model --draft-tokens: needs {} KV cache tokens, {} are free; hint: raise "
        "--cache-tokens",
        need, engine.free_cache_tokens());
  }
  std::mt19937_64 rng(opts.seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(engine.spec().vocab_size) - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(std::max<int64_t>(opts.context, 1)));
  for (auto& t : prompt) t = tok(rng);
  GenerateOptions go;
  go.max_new_tokens = res.tokens;
  const auto rate = [](const GenerateResult& r) { return r.decode_tokens_per_second(); };
  // Each figure is the median of three runs after a warm-up (CUDA graphs are captured there).
  DisagreeingDraft never(engine);
  std::vector<double> plain, all, none, all_acc, none_acc;
  for (int rep = 0; rep < 4; ++rep) {
    const auto p = generate(engine, prompt, go);
    SpeculativeStats sa, sn;
    const auto a = generate_speculative(engine, engine, prompt, go, {draft_tokens}, &sa);
    const auto n = generate_speculative(engine, never, prompt, go, {draft_tokens}, &sn);
    if (rep == 0) continue;
    plain.push_back(rate(p));
    all.push_back(rate(a));
    none.push_back(rate(n));
    all_acc.push_back(sa.acceptance_rate());
    none_acc.push_back(sn.acceptance_rate());
  }
  res.plain_tokens_per_second = median(plain);
  res.all_tokens_per_second = median(all);
  res.none_tokens_per_second = median(none);
  res.all_acceptance = median(all_acc);
  res.none_acceptance = median(none_acc);
  res.decode_step_seconds = 1.0 / res.plain_tokens_per_second;

  // The verify pass alone: k + 1 tokens appended to a sequence of the prompt, then cut back.
  const auto seq = engine.new_sequence();
  engine.forward(seq, prompt, LogitsMode::kLast);
  std::vector<int32_t> block(static_cast<size_t>(draft_tokens) + 1);
  std::vector<double> times;
  for (int rep = 0; rep < 12; ++rep) {
    for (auto& t : block) t = tok(rng);
    const auto t0 = std::chrono::steady_clock::now();
    engine.forward(seq, block, LogitsMode::kAll);
    if (rep >= 2) times.push_back(seconds_since(t0));
    engine.truncate_sequence(seq, static_cast<int64_t>(prompt.size()));
  }
  engine.drop_sequence(seq);
  res.verify_seconds = median(times);
  return res;
}

}  // namespace exl3::runtime
