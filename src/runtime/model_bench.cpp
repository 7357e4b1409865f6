// `exl3 bench model` measurements (see model_bench.hpp).
#include "exl3/runtime/model_bench.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <variant>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "stopwatch.hpp"

namespace exl3::runtime {
uint64_t active_weight_bytes_per_token(const Checkpoint& ckpt, const ModelSpec& spec) {
  uint64_t bytes = 0;
  // Routed experts: per layer, the mean expert's bytes times top_k.
  std::map<int, std::pair<uint64_t, std::set<int>>> experts;  // layer -> (bytes, expert ids)
  for (const auto& l : ckpt.linears()) {
    if (l.expert && l.expert->layer >= 0 && l.prefix.find(".experts.") != std::string::npos) {
      auto& e = experts[l.expert->layer];
      e.first += l.bytes;
      e.second.insert(l.expert->expert);
    } else {
      bytes += l.bytes;
    }
  }
  for (const auto& ls : spec.layers) {
    const auto* m = std::get_if<MoeSpec>(&ls.mlp);
    const auto it = experts.find(ls.index);
    if (m == nullptr || it == experts.end() || it->second.second.empty()) continue;
    bytes += it->second.first / it->second.second.size() * static_cast<uint64_t>(m->top_k);
  }
  for (const auto& t : ckpt.plain_tensors()) {
    if (t.role == "embedding") {
      if (!t.shape.empty() && t.shape[0] > 0)
        bytes += t.bytes / static_cast<uint64_t>(t.shape[0]);  // one row
      if (spec.lm_head_tied && t.name == spec.embed_tokens)
        bytes += t.bytes;  // the head reads all of it
    } else if (t.name.find(".experts.") == std::string::npos) {
      bytes += t.bytes;  // norms, routers, unquantized linears
    }
  }
  return bytes;
}

ModelBenchResult bench_model(Engine& engine, const ModelBenchOptions& opts) {
  ModelBenchResult res;
  std::mt19937_64 rng(opts.seed);
  const auto vocab = static_cast<int32_t>(engine.spec().vocab_size);
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  const auto random_ids = [&](int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = tok(rng);
    return v;
  };
  for (const int64_t batch : opts.batches) {
    const int64_t need = batch * bench_sequence_tokens(opts);
    if (need > engine.free_cache_tokens()) {
      fail(
          "bench model: batch {} x {} tokens needs {} KV cache tokens, {} are free; hint: raise "
          "--cache-tokens",
          batch, bench_sequence_tokens(opts), need, engine.free_cache_tokens());
    }
    std::vector<Engine::SeqId> seqs;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<Engine::BatchEntry> entries;
    for (int64_t b = 0; b < batch; ++b) {
      seqs.push_back(engine.new_sequence());
      prompts.push_back(random_ids(opts.context));
    }
    for (int64_t b = 0; b < batch; ++b)
      entries.push_back({seqs[static_cast<size_t>(b)], prompts[static_cast<size_t>(b)]});
    engine.forward_batch(entries);
    std::vector<int32_t> step_tokens(static_cast<size_t>(batch));
    // Steps alternate between greedy ids back (what generation runs) and every row's logits
    // back (what sampling needs), so both are timed over the same stretch of the run.
    std::vector<double> times, logits_times;
    for (int64_t s = 0; s < 2 * opts.decode_steps + 2; ++s) {
      entries.clear();
      for (int64_t b = 0; b < batch; ++b) {
        step_tokens[static_cast<size_t>(b)] = tok(rng);
        entries.push_back({seqs[static_cast<size_t>(b)],
                           std::span(step_tokens).subspan(static_cast<size_t>(b), 1)});
      }
      const bool ids = s % 2 == 0;
      const auto t0 = std::chrono::steady_clock::now();
      if (ids) {
        engine.forward_batch_argmax(entries);
      } else {
        engine.forward_batch(entries);
      }
      if (s < 2) continue;  // two warm-up steps (graph capture)
      (ids ? times : logits_times).push_back(seconds_since(t0));
    }
    DecodeResult d;
    if (opts.profile) {
      for (int64_t b = 0; b < batch; ++b) step_tokens[static_cast<size_t>(b)] = tok(rng);
      auto p = engine.profile_step(entries);  // the same sequences, one token further
      if (!p) {
        fail("bench model --profile: the {} engine cannot time its ops (hint: --device cuda)",
             device_name(engine.device()));
      }
      d.profile = std::move(*p);
    }
    for (const auto s : seqs) engine.drop_sequence(s);
    d.batch = batch;
    d.seconds_per_step = median(times);
    d.seconds_per_step_logits = median(logits_times);
    d.tokens_per_second = static_cast<double>(batch) / d.seconds_per_step;
    d.collective_seconds = engine.collective_seconds(batch, batch);
    d.kernels = engine.decode_step_kernels(batch).value_or(0);
    res.decode.push_back(d);
  }
  if (opts.prefill_tokens > 0) {
    if (opts.prefill_tokens > engine.free_cache_tokens()) {
      fail(
          "bench model: a prefill of {} tokens needs as many KV cache tokens, {} are free; hint: "
          "raise "
          "--cache-tokens",
          opts.prefill_tokens, engine.free_cache_tokens());
    }
    const auto ids = random_ids(opts.prefill_tokens);
    std::vector<double> times;
    for (int rep = 0; rep < 3; ++rep) {  // the first is a warm-up
      const auto seq = engine.new_sequence();
      const auto t0 = std::chrono::steady_clock::now();
      engine.forward(seq, ids, LogitsMode::kLast);
      if (rep > 0) times.push_back(seconds_since(t0));
      engine.drop_sequence(seq);
    }
    if (opts.profile) {  // one more prefill, every op timed
      const auto seq = engine.new_sequence();
      const Engine::BatchEntry e{seq, ids, LogitsMode::kLast};
      auto p = engine.profile_step(std::span<const Engine::BatchEntry>(&e, 1));
      engine.drop_sequence(seq);
      if (!p) {
        fail("bench model --profile: the {} engine cannot time its ops (hint: --device cuda)",
             device_name(engine.device()));
      }
      res.prefill_profile = std::move(*p);
    }
    res.prefill_tokens = opts.prefill_tokens;
    res.prefill_seconds = median(times);
    res.prefill_tokens_per_second = static_cast<double>(opts.prefill_tokens) / res.prefill_seconds;
    for (int64_t done = 0; done < opts.prefill_tokens; done += opts.max_batch_tokens) {
      const int64_t chunk = std::min(opts.max_batch_tokens, opts.prefill_tokens - done);
      res.prefill_collective_seconds +=
          engine.collective_seconds(chunk, done + chunk == opts.prefill_tokens ? 1 : 0);
    }
  }
  return res;
}

}  // namespace exl3::runtime
