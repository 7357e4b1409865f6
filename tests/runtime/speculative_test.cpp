// Speculative decoding (runtime::generate_speculative) on the CPU engine: greedy output equal to
// generate()'s token for token for k = 1..4, with a draft that always agrees (the target's own
// weights in a second engine), one that mostly disagrees (another random model) and the EXL3
// MoE conformance model; stop tokens, the repetition penalty and the callback stop it where
// generate() stops; rounds over a batch of sequences keeping different numbers of drafts equal
// plain greedy per sequence; both engines' KV pages all come back; bad options fail clearly.
// Sampling:
// the generated tokens follow the target's exact distribution (a chi-square test over seeded
// runs). Also the KV cache's truncate and Engine::truncate_sequence.
#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/format/synthetic_hf.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/runtime/kv_cache.hpp"
#include "exl3/runtime/speculative.hpp"
#include "runtime_test_util.hpp"
#include "test_mode.hpp"
#include "test_support.hpp"

namespace {

using namespace exl3;
using namespace exl3::runtime;
namespace test = exl3::runtime::test;

// The target; the same weights in a second engine (its own sequences and pages); another random
// model; and a near one: the target's random draws at 1.6x the scale, so mostly the same likely
// tokens with other probabilities (the case where speculative sampling's acceptance ratio and
// residual both matter).
struct Models {
  exl3::test::TempDir target_dir, other_dir, near_dir;
  std::unique_ptr<Engine> target, same, other, near;
  Models() {
    const uint64_t seed = exl3::test::test_seed();
    test::write_model(target_dir.path(), HfArch::kQwen3, seed);
    test::write_model(other_dir.path(), HfArch::kQwen3, seed + 1);
    SyntheticHfSpec s;
    s.arch = HfArch::kQwen3;
    s.seed = seed;
    s.init_std = 0.08;  // write_model's 0.05, scaled
    s.num_layers = 2;
    write_synthetic_hf_model(near_dir.path(), s);
    target = load_engine(target_dir.path());
    same = load_engine(target_dir.path());
    other = load_engine(other_dir.path());
    near = load_engine(near_dir.path());
  }
};

TEST(KvCache, TruncateGivesPagesBack) {
  PagedKvCache cache({{8, 8}}, 4, 6);
  const auto s = cache.add_sequence();
  cache.reserve(s, 11);
  cache.advance(s, 11);
  EXPECT_EQ(cache.free_pages(), 3);
  cache.truncate(s, 5);  // 5 tokens: 2 pages
  EXPECT_EQ(cache.length(s), 5);
  EXPECT_EQ(cache.free_pages(), 4);
  EXPECT_EQ(cache.page_table(s).size(), 2u);
  cache.truncate(s, 4);  // exactly one page
  EXPECT_EQ(cache.free_pages(), 5);
  EXPECT_THROW(cache.truncate(s, 5), Error);  // past its length
  EXPECT_THROW(cache.truncate(s, -1), Error);
  cache.truncate(s, 0);
  EXPECT_EQ(cache.free_pages(), 6);
}

TEST(Engine, TruncatedSequenceContinuesLikeAFreshOne) {
  Models m;
  const std::vector<int32_t> ids = {5, 17, 99, 3, 250, 41, 7, 8, 300};
  const auto want = forward_logits(*m.target, ids);
  const auto s = m.target->new_sequence();
  m.target->forward(s, std::span(ids).first(6));
  const std::vector<int32_t> wrong = {400, 401, 402};
  m.target->forward(s, wrong);
  EXPECT_THROW(m.target->truncate_sequence(s, 10), Error);
  m.target->truncate_sequence(s, 6);
  EXPECT_EQ(m.target->sequence_length(s), 6);
  const auto got = m.target->forward(s, std::span(ids).subspan(6), LogitsMode::kAll);
  const std::vector<float> tail(want.end() - static_cast<std::ptrdiff_t>(got.size()), want.end());
  EXPECT_LE(exl3::test::rel_l2(got, tail), 1e-6);
  m.target->drop_sequence(s);
}

TEST(Speculative, GreedyEqualsPlainForEveryDraftAndK) {
  Models m;
  const int64_t full = m.target->free_cache_tokens();
  const std::vector<int32_t> prompt = {12, 200, 37, 5, 411};
  GenerateOptions go;
  go.max_new_tokens = 23;
  const auto plain = generate(*m.target, prompt, go);
  ASSERT_EQ(plain.tokens.size(), 23u);
  for (int k = 1; k <= 4; ++k) {
    SpeculativeStats same, other;
    const auto a = generate_speculative(*m.target, *m.same, prompt, go, {k, false}, &same);
    const auto b = generate_speculative(*m.target, *m.other, prompt, go, {k, false}, &other);
    EXPECT_EQ(a.tokens, plain.tokens) << "k=" << k << " (same weights)";
    EXPECT_EQ(b.tokens, plain.tokens) << "k=" << k << " (other model)";
    EXPECT_EQ(a.stop_reason, "max_tokens");
    // The target's own weights agree with it; fewer target passes than tokens.
    EXPECT_EQ(same.accepted, same.drafted) << "k=" << k;
    EXPECT_LT(same.rounds, 22);
    EXPECT_EQ(a.decode_steps, same.rounds);
    EXPECT_EQ(a.decode_tokens, 22);
    // A random other model disagrees most of the time: the rejection path runs.
    EXPECT_LT(other.accepted, other.drafted) << "k=" << k;
    EXPECT_EQ(other.accepted + other.rounds, 22);
    // Adaptive draft counts (timed, so they vary run to run) give the same tokens.
    EXPECT_EQ(generate_speculative(*m.target, *m.other, prompt, go, {k, true}).tokens, plain.tokens)
        << "k=" << k << " (adaptive)";
  }
  EXPECT_EQ(m.target->free_cache_tokens(), full);
  EXPECT_EQ(m.same->free_cache_tokens(), full);
  EXPECT_EQ(m.other->free_cache_tokens(), full);
}

// Rounds over four sequences at once (one batched pass per draft step, one batched verify pass):
// each sequence's tokens equal its plain greedy ones, though the sequences keep different numbers
// of drafts in the same round (the near draft agrees part of the time) and one sequence takes
// plain steps (0 drafts) throughout; every KV page comes back when the decoder goes.
TEST(Speculative, BatchedRoundsEqualPlainPerSequence) {
  Models m;
  const int64_t full = m.target->free_cache_tokens();
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 4, 5}, {100, 200, 300, 400}, {7, 7, 7, 7, 7, 7}, {511, 0}};
  GenerateOptions go;
  go.max_new_tokens = 20;
  std::vector<std::vector<int32_t>> want, got(prompts.size());
  for (const auto& p : prompts) want.push_back(generate(*m.target, p, go).tokens);
  bool differing = false;
  {
    SpeculativeDecoder dec(*m.target, *m.near, {3});
    std::vector<int> handles;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto a = dec.add(prompts[i], go.sampling);
      handles.push_back(a.handle);
      got[i].push_back(a.first);
    }
    for (;;) {
      std::vector<SpeculativeDecoder::Slot> slots;
      std::vector<size_t> which;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const int64_t left = go.max_new_tokens - static_cast<int64_t>(got[i].size());
        if (left <= 0) continue;
        const int k = i == 3 ? 0 : static_cast<int>(std::min<int64_t>(3, left - 1));
        slots.push_back({handles[i], k});
        which.push_back(i);
      }
      if (slots.empty()) break;
      const auto out = dec.round(slots);
      ASSERT_EQ(out.size(), slots.size());
      for (size_t j = 0; j < out.size(); ++j) {
        auto& g = got[which[j]];
        g.insert(g.end(), out[j].begin(), out[j].end());
        if (out[j].size() != out[0].size()) differing = true;
      }
    }
    EXPECT_EQ(dec.stats(handles[3]).drafted, 0);
    const std::vector<SpeculativeDecoder::Slot> twice = {{handles[0], 1}, {handles[0], 1}};
    EXPECT_THAT(test::error_of([&] { dec.round(twice); }), testing::HasSubstr("twice"));
    const std::vector<SpeculativeDecoder::Slot> many = {{handles[0], 4}};
    EXPECT_THAT(test::error_of([&] { dec.round(many); }), testing::HasSubstr("0..3"));
    dec.remove(handles[1]);
    const std::vector<SpeculativeDecoder::Slot> gone = {{handles[1], 1}};
    EXPECT_THAT(test::error_of([&] { dec.round(gone); }), testing::HasSubstr("no sequence"));
  }
  EXPECT_EQ(got, want);
  EXPECT_TRUE(differing);
  EXPECT_EQ(m.target->free_cache_tokens(), full);
  EXPECT_EQ(m.near->free_cache_tokens(), full);
}

TEST(Speculative, StopsWherePlainStops) {
  Models m;
  const std::vector<int32_t> prompt = {9, 8, 7};
  GenerateOptions go;
  go.max_new_tokens = 16;
  const auto plain = generate(*m.target, prompt, go);
  ASSERT_GE(plain.tokens.size(), 6u);
  go.stop_tokens = {plain.tokens[5]};
  const auto want = generate(*m.target, prompt, go);
  const auto got = generate_speculative(*m.target, *m.same, prompt, go, {3});
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.stop_reason, "stop_token");
  EXPECT_EQ(got.stop_token, want.stop_token);
  // The callback ends it after 4 tokens; max_new_tokens 1 and 0.
  go.stop_tokens.clear();
  int seen = 0;
  const auto cb = generate_speculative(*m.target, *m.other, prompt, go, {4}, nullptr,
                                       [&](int32_t) { return ++seen < 4; });
  EXPECT_EQ(cb.stop_reason, "callback");
  EXPECT_EQ(cb.tokens, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + 4));
  go.max_new_tokens = 1;
  EXPECT_EQ(generate_speculative(*m.target, *m.same, prompt, go, {4}).tokens,
            std::vector<int32_t>{plain.tokens[0]});
  go.max_new_tokens = 0;
  EXPECT_TRUE(generate_speculative(*m.target, *m.same, prompt, go, {4}).tokens.empty());
}

TEST(Speculative, RepetitionPenaltyAndTheMoeConformanceModel) {
  Models m;
  const std::vector<int32_t> prompt = {100, 101, 102, 103};
  GenerateOptions go;
  go.max_new_tokens = 20;
  go.sampling.repetition_penalty = 1.3f;
  EXPECT_EQ(generate_speculative(*m.target, *m.other, prompt, go, {3}).tokens,
            generate(*m.target, prompt, go).tokens);
  EXL3_REQUIRE_CONFORMANCE(dir);
  auto moe = load_engine(test::tiny_model(dir)), moe_draft = load_engine(test::tiny_model(dir));
  go.sampling.repetition_penalty = 1.0f;
  SpeculativeStats st;
  EXPECT_EQ(generate_speculative(*moe, *moe_draft, prompt, go, {4, false}, &st).tokens,
            generate(*moe, prompt, go).tokens);
  EXPECT_EQ(st.accepted, st.drafted);
  EXPECT_GT(st.tokens_per_round(), 3.0);
}

// The target's exact distribution of the next token after `context` under `opts` (the same
// transforms the samplers apply): probability per id.
std::vector<double> next_token_probs(Engine& e, std::vector<int32_t> context,
                                     const SamplingOptions& opts) {
  const auto logits = forward_logits(e, context);
  const auto vocab = static_cast<size_t>(e.spec().vocab_size);
  Sampler s(opts);
  const auto w = s.weights(std::span<const float>(logits).last(vocab));
  std::vector<double> p(vocab, 0.0);
  for (const auto& [wt, id] : w.entries) p[static_cast<size_t>(id)] = wt / w.total;
  return p;
}

// The first three of four generated tokens with top_k 3 (27 outcomes; the first round drafts two,
// so both a first and a second draft position are checked), 2000 / 500 / 500 seeded runs per draft:
// the counts against the target's exact joint distribution by Pearson's chi-square (26 degrees of
// freedom; 63 is past the 1 - 1e-4 quantile). The other model's top 3 mostly differ from the
// target's, so its drafts are mostly rejected (the residual draws); the target's own weights are
// always accepted; the near model's drafts are accepted part of the time (the ratio p / q decides).
TEST(Speculative, SamplingFollowsTheTargetsDistribution) {
  Models m;
  const std::vector<int32_t> prompt = {77, 78, 79};
  GenerateOptions go;
  go.max_new_tokens = 4;  // t1 from the prompt pass, then one round drafting 2: t2 and t3 verified
  go.sampling.temperature = 1.0f;
  go.sampling.top_k = 3;
  // Exact joint probabilities of (t1, t2, t3).
  std::map<std::array<int32_t, 3>, double> exact;
  const auto p1 = next_token_probs(*m.target, prompt, go.sampling);
  for (size_t a = 0; a < p1.size(); ++a) {
    if (p1[a] == 0.0) continue;
    auto c1 = prompt;
    c1.push_back(static_cast<int32_t>(a));
    const auto p2 = next_token_probs(*m.target, c1, go.sampling);
    for (size_t b = 0; b < p2.size(); ++b) {
      if (p2[b] == 0.0) continue;
      auto c2 = c1;
      c2.push_back(static_cast<int32_t>(b));
      const auto p3 = next_token_probs(*m.target, c2, go.sampling);
      for (size_t c = 0; c < p3.size(); ++c) {
        if (p3[c] == 0.0) continue;
        exact[{static_cast<int32_t>(a), static_cast<int32_t>(b), static_cast<int32_t>(c)}] =
            p1[a] * p2[b] * p3[c];
      }
    }
  }
  ASSERT_EQ(exact.size(), 27u);
  // Most runs go to the near draft, where a wrong acceptance rule shows (accepting with
  // min(1, 2 p / q) instead gives a chi-square near 300 there at 2000 runs, about 120 at the 800
  // of sanitizer builds: the statistic grows with the runs, its bound under the right rule does
  // not).
  const bool fast = exl3::test::fast_mode();
  for (const auto& [draft, runs] :
       {std::pair{m.near.get(), fast ? 800 : 2000}, std::pair{m.other.get(), fast ? 300 : 500},
        std::pair{m.same.get(), fast ? 300 : 500}}) {
    std::map<std::array<int32_t, 3>, int> seen;
    SpeculativeStats total;
    for (int seed = 0; seed < runs; ++seed) {
      go.sampling.seed = static_cast<uint64_t>(seed);
      SpeculativeStats st;
      const auto r = generate_speculative(*m.target, *draft, prompt, go, {2, false}, &st);
      ASSERT_EQ(r.tokens.size(), 4u);
      ++seen[{r.tokens[0], r.tokens[1], r.tokens[2]}];
      total.drafted += st.drafted;
      total.accepted += st.accepted;
    }
    double chi2 = 0.0;
    for (const auto& [key, p] : exact) {
      const double want = runs * p, got = seen.contains(key) ? seen[key] : 0;
      chi2 += (got - want) * (got - want) / want;
    }
    for (const auto& [key, n] : seen) EXPECT_TRUE(exact.contains(key)) << "an impossible output";
    const char* name = draft == m.same.get() ? "same" : draft == m.other.get() ? "other" : "near";
    EXPECT_LT(chi2, 63.0) << name << " draft";
    std::printf("%s draft: chi-square %.1f, %lld of %lld drafts accepted\n", name, chi2,
                static_cast<long long>(total.accepted), static_cast<long long>(total.drafted));
    if (draft == m.same.get()) {
      EXPECT_EQ(total.accepted, total.drafted);
    } else if (draft == m.other.get()) {
      EXPECT_LT(total.accepted, total.drafted / 2);
    } else {  // both outcomes common
      EXPECT_GT(total.accepted, total.drafted / 5);
      EXPECT_LT(total.accepted, total.drafted * 19 / 20);
    }
  }
}

TEST(Speculative, BadOptionsFailClearly) {
  Models m;
  const std::vector<int32_t> prompt = {1, 2, 3};
  GenerateOptions go;
  EXPECT_THAT(test::error_of([&] { generate_speculative(*m.target, *m.same, prompt, go, {0}); }),
              testing::HasSubstr("draft tokens 0 outside 1..16"));
  EXPECT_THAT(test::error_of([&] { generate_speculative(*m.target, *m.same, prompt, go, {17}); }),
              testing::HasSubstr("outside 1..16"));
  exl3::test::TempDir small;
  SyntheticHfSpec s;
  s.arch = HfArch::kQwen3;
  s.vocab_size = 300;
  write_synthetic_hf_model(small.path(), s);
  auto other_vocab = load_engine(small.path());
  EXPECT_THAT(
      test::error_of([&] { generate_speculative(*m.target, *other_vocab, prompt, go, {2}); }),
      testing::HasSubstr("draft model's vocabulary has 300 tokens, the target's 512"));
  EXPECT_THAT(test::error_of([&] { generate_speculative(*m.target, *m.same, {}, go, {2}); }),
              testing::HasSubstr("no tokens"));
}

}  // namespace
