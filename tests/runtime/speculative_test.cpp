// Speculative decoding (runtime::generate_speculative) on the CPU engine: greedy output equal to
// generate()'s token for token for k = 1..4, with a draft that always agrees (the target's own
// weights in a second engine), one that mostly disagrees (another random model) and the EXL3
// MoE conformance model; stop tokens, the repetition penalty and the callback stop it where
// generate() stops; both engines' KV pages all come back; bad options fail clearly. Also the
// KV cache's truncate and Engine::truncate_sequence.
#include <filesystem>
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
#include "test_support.hpp"

namespace {

using namespace exl3;
using namespace exl3::runtime;
namespace test = exl3::runtime::test;

struct Models {
  exl3::test::TempDir target_dir, other_dir;
  std::unique_ptr<Engine> target, same, other;
  Models() {
    const uint64_t seed = exl3::test::test_seed();
    test::write_model(target_dir.path(), HfArch::kQwen3, seed);
    test::write_model(other_dir.path(), HfArch::kQwen3, seed + 1);
    target = load_engine(target_dir.path());
    same = load_engine(target_dir.path());  // a second engine: its own sequences and pages
    other = load_engine(other_dir.path());
  }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exl3::Error thrown";
  return {};
}

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
    const auto a = generate_speculative(*m.target, *m.same, prompt, go, {k}, &same);
    const auto b = generate_speculative(*m.target, *m.other, prompt, go, {k}, &other);
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
  }
  EXPECT_EQ(m.target->free_cache_tokens(), full);
  EXPECT_EQ(m.same->free_cache_tokens(), full);
  EXPECT_EQ(m.other->free_cache_tokens(), full);
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
  EXPECT_EQ(generate_speculative(*moe, *moe_draft, prompt, go, {4}, &st).tokens,
            generate(*moe, prompt, go).tokens);
  EXPECT_EQ(st.accepted, st.drafted);
  EXPECT_GT(st.tokens_per_round(), 3.0);
}

TEST(Speculative, BadOptionsFailClearly) {
  Models m;
  const std::vector<int32_t> prompt = {1, 2, 3};
  GenerateOptions go;
  go.sampling.temperature = 0.7f;
  EXPECT_THAT(error_of([&] { generate_speculative(*m.target, *m.same, prompt, go, {2}); }),
              testing::HasSubstr("temperature 0.7"));
  go.sampling.temperature = 0.0f;
  EXPECT_THAT(error_of([&] { generate_speculative(*m.target, *m.same, prompt, go, {0}); }),
              testing::HasSubstr("draft tokens 0 outside 1..16"));
  EXPECT_THAT(error_of([&] { generate_speculative(*m.target, *m.same, prompt, go, {17}); }),
              testing::HasSubstr("outside 1..16"));
  exl3::test::TempDir small;
  SyntheticHfSpec s;
  s.arch = HfArch::kQwen3;
  s.vocab_size = 300;
  write_synthetic_hf_model(small.path(), s);
  auto other_vocab = load_engine(small.path());
  EXPECT_THAT(error_of([&] { generate_speculative(*m.target, *other_vocab, prompt, go, {2}); }),
              testing::HasSubstr("draft model's vocabulary has 300 tokens, the target's 512"));
  EXPECT_THAT(error_of([&] { generate_speculative(*m.target, *m.same, {}, go, {2}); }),
              testing::HasSubstr("no tokens"));
}

}  // namespace
