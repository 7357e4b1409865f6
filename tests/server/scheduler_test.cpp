// The continuous-batching scheduler without HTTP, on the conformance model: concurrent greedy
// requests each equal runtime::generate() alone, and were batched (fewer steps than tokens);
// chunked prefill changes nothing; a KV pool too small for two requests makes them wait, not
// fail; cancellation frees the KV pages; stop strings cut the text; bad requests are refused.
#include <chrono>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../runtime/runtime_test_util.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/runtime/mtp.hpp"
#include "exl3/server/scheduler.hpp"
#include "exl3/text/json_schema.hpp"
#include "exl3/text/stop_tokens.hpp"
#include "server_test_util.hpp"
#include "test_support.hpp"

using namespace exl3::server;
namespace st = exl3::server::test;
using exl3::Tokenizer;
namespace runtime = exl3::runtime;
using ::testing::HasSubstr;

namespace {

using st::Done;
using st::drain;
using st::random_prompt;

struct Fixture {
  // `draft`: a draft model folder for speculative decoding (its engine made here).
  explicit Fixture(const std::filesystem::path& conf, SchedulerOptions so = {},
                   int64_t cache = 4096, const std::filesystem::path& draft = {},
                   bool prefix_cache = false)
      : model(st::tiny_model(conf)), tok(Tokenizer::load(model)) {
    runtime::EngineOptions eo;
    eo.cache_tokens = cache;
    eo.prefix_cache = prefix_cache;
    engine = runtime::load_engine(model, eo);
    if (!draft.empty()) {
      draft_engine = runtime::load_engine(draft, eo);
      so.draft = draft_engine.get();
    }
    stops = exl3::model_stop_tokens(model, engine->spec().eos_token_ids, tok);
    sched = std::make_unique<Scheduler>(*engine, tok, so);
  }
  GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) const {
    GenerationRequest g;
    g.prompt = std::move(prompt);
    g.max_tokens = max_tokens;
    g.stop_tokens = stops;
    return g;
  }
  std::filesystem::path model;
  Tokenizer tok;
  std::unique_ptr<runtime::Engine> engine, draft_engine;
  std::vector<int32_t> stops;
  std::unique_ptr<Scheduler> sched;
};

void expect_equals_reference(const Fixture& f, const GenerationRequest& g, const Done& d,
                             const std::string& what) {
  const auto ref = st::reference_generate(f.model, g.prompt, g.max_tokens, g.stop_tokens);
  auto expected = ref.tokens;
  if (ref.stopped) {
    ASSERT_FALSE(d.tokens.empty()) << what;
    expected.push_back(d.tokens.back());  // the stop token itself is reported (and counted)
  }
  EXPECT_EQ(d.tokens, expected) << what;
  EXPECT_EQ(d.text, f.tok.decode(ref.tokens, /*skip_special=*/true)) << what;
  EXPECT_EQ(d.last.reason, ref.stopped ? FinishReason::kStop : FinishReason::kLength) << what;
  EXPECT_EQ(d.last.completion_tokens, static_cast<int64_t>(expected.size())) << what;
  EXPECT_EQ(d.last.prompt_tokens, static_cast<int64_t>(g.prompt.size())) << what;
}

}  // namespace

TEST(Scheduler, ConcurrentGreedyRequestsEqualGenerateAndAreBatched) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  Fixture f(conf, {.max_seqs = 4, .max_queue = 8, .max_context = 0, .step_tokens = 64});
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<RequestStream>> streams;
  int64_t total_tokens = 0;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(f.greedy(random_prompt(rng, 5 + rng() % 20), 24));
    if (i % 2 == 0) reqs.back().stop_tokens.clear();  // at least 48 tokens, whatever the model says
    auto sub = f.sched->submit(reqs.back());
    ASSERT_TRUE(sub.stream) << sub.message;
    streams.push_back(sub.stream);
  }
  std::vector<Done> done;
  for (auto& s : streams) done.push_back(drain(s));
  for (size_t i = 0; i < reqs.size(); ++i) {
    expect_equals_reference(f, reqs[i], done[i], "request " + std::to_string(i));
    total_tokens += done[i].last.completion_tokens;
  }
  const auto st = f.sched->stats();
  EXPECT_EQ(st.completed, 4);
  EXPECT_LT(st.steps, total_tokens) << "the requests were not batched together";
  EXPECT_EQ(st.free_cache_tokens, st.cache_tokens);
  EXPECT_EQ(st.running, 0);
}

// serve --draft: concurrent greedy requests decoded by speculative rounds equal generate() alone,
// with a draft that always agrees (the model's own weights, 3 drafts per round) and with one that
// rarely does (a random model of the same vocabulary, adaptive counts); chunked prefill feeds
// both engines; the statistics count the drafts; every KV page of both pools comes back.
TEST(Scheduler, DraftModelGivesTheSameTokens) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  exl3::test::TempDir other;
  runtime::test::write_model(other.path(), exl3::HfArch::kQwen3, exl3::test::test_seed());
  const auto run = [&](const std::filesystem::path& draft, runtime::SpeculativeOptions spec,
                       const char* what) {
    SchedulerOptions so{.max_seqs = 3, .max_queue = 8, .max_context = 0, .step_tokens = 16};
    so.speculative = spec;
    Fixture f(conf, so, 4096, draft);
    std::vector<GenerationRequest> reqs;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 4; ++i) {  // one more than max_seqs: one waits, then joins mid-run
      reqs.push_back(f.greedy(random_prompt(rng, 5 + rng() % 30), 10 + 7 * i));
      if (i % 2 == 0) reqs.back().stop_tokens.clear();
      auto sub = f.sched->submit(reqs.back());
      if (!sub.stream) {
        ADD_FAILURE() << what << ": " << sub.message;
        return SchedulerStats{};
      }
      streams.push_back(sub.stream);
    }
    int64_t total = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto d = drain(streams[i]);
      expect_equals_reference(f, reqs[i], d, std::string(what) + " request " + std::to_string(i));
      total += d.last.completion_tokens;
    }
    const auto s = f.sched->stats();
    EXPECT_EQ(s.completed, 4) << what;
    EXPECT_EQ(s.generation_tokens, total) << what;
    EXPECT_EQ(s.free_cache_tokens, s.cache_tokens) << what;
    EXPECT_EQ(s.draft_free_cache_tokens, s.draft_cache_tokens) << what;
    EXPECT_GT(s.draft_cache_tokens, 0) << what;
    EXPECT_GT(s.speculative_rounds, 0) << what;
    EXPECT_LE(s.accepted_tokens, s.drafted_tokens) << what;
    return s;
  };
  const auto same = run(st::tiny_model(conf), {3, false}, "same weights");
  EXPECT_GT(same.drafted_tokens, 0);
  EXPECT_EQ(same.accepted_tokens, same.drafted_tokens);
  run(other.path(), {4, true}, "random draft");
}

// serve --mtp: the tiny DeepSeek-V3 with an MTP layer (vocabulary 256; the conformance model's
// tokenizer only turns its ids into text) drafting for itself through its MTP head. Prompts longer
// than a step's token budget prefill in chunks, the head following the model chunk by chunk;
// every request's greedy tokens equal generate() alone; both KV pools come back whole.
TEST(Scheduler, MtpHeadGivesTheSameTokens) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  const auto dir = exl3::test::model_data_dir() / "deepseek_v3_mtp";
  const auto ckpt = exl3::Checkpoint::open(dir);
  const auto tok = Tokenizer::load(st::tiny_model(conf));
  auto engine = runtime::load_engine(ckpt);
  auto head = runtime::load_mtp_draft(*engine, ckpt, {});
  const auto reference = runtime::load_engine(ckpt);  // the scheduler's thread runs `engine`
  SchedulerOptions so{.max_seqs = 3, .max_queue = 8, .max_context = 0, .step_tokens = 8};
  so.draft = head.get();
  so.speculative = {3, false};
  Scheduler sched(*engine, tok, so);
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest g;
    for (size_t n = 0; n < 4 + rng() % 20; ++n)
      g.prompt.push_back(static_cast<int32_t>(rng() % 256));
    g.max_tokens = 8 + 5 * i;
    reqs.push_back(g);
    auto sub = sched.submit(g);
    ASSERT_TRUE(sub.stream) << sub.message;
    streams.push_back(sub.stream);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto d = drain(streams[i]);
    runtime::GenerateOptions go;
    go.max_new_tokens = reqs[i].max_tokens;
    const auto plain = runtime::generate(*reference, reqs[i].prompt, go);
    EXPECT_EQ(d.tokens, plain.tokens) << "request " << i << ": " << d.last.error;
  }
  const auto s = sched.stats();
  EXPECT_EQ(s.completed, 4);
  EXPECT_GT(s.drafted_tokens, 0);
  EXPECT_EQ(s.free_cache_tokens, s.cache_tokens);
  EXPECT_EQ(s.draft_free_cache_tokens, s.draft_cache_tokens);
}

// Prefix caching: a request whose prompt starts with an earlier one's system prompt prefills only
// the rest (two 32-token pages of the 70-token system prompt are reused), with the same greedy
// tokens as generate() alone; the same with a draft model (both engines reuse the same count).
TEST(Scheduler, PrefixCacheReusesASharedSystemPrompt) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  const auto system = random_prompt(rng, 70);
  for (const bool with_draft : {false, true}) {
    SchedulerOptions so{.max_seqs = 2, .max_queue = 4, .max_context = 0, .step_tokens = 32};
    so.speculative = {2, false};
    Fixture f(conf, so, 4096, with_draft ? st::tiny_model(conf) : std::filesystem::path(),
              /*prefix_cache=*/true);
    const char* what = with_draft ? "with a draft" : "plain";
    int64_t hits = 0;
    for (int i = 0; i < 3; ++i) {
      auto prompt = system;
      const auto tail = random_prompt(rng, 3 + 5 * i);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      auto g = f.greedy(prompt, 12);
      auto sub = f.sched->submit(g);
      ASSERT_TRUE(sub.stream) << sub.message;
      expect_equals_reference(f, g, drain(sub.stream), std::string(what) + " " + std::to_string(i));
      const auto st = f.sched->stats();
      EXPECT_EQ(st.prefix_hit_tokens - hits, i == 0 ? 0 : 64) << what << " request " << i;
      hits = st.prefix_hit_tokens;
    }
    const auto st = f.sched->stats();
    EXPECT_EQ(st.free_cache_tokens, st.cache_tokens) << what;  // cached pages count as free
  }
}

// Prefix caching on a model with gated DeltaNet layers (the Qwen3-Next reference checkpoint, the
// conformance tokenizer for text): prefill chunks end on page boundaries, where the engine keeps
// the recurrent state, and a second request sharing the 30-token system prompt adopts it up to
// the last state kept inside it (16 tokens: chunks of 20 are cut to 16, and the first prompt's
// last full page, 32, holds two tokens of its own tail), with the same greedy tokens as
// generate() alone.
TEST(Scheduler, PrefixCacheOnAHybridModelReusesKeptStates) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  const auto model = exl3::test::model_data_dir() / "qwen3_next";
  runtime::EngineOptions eo;
  eo.page_size = 8;
  eo.cache_tokens = 1024;
  eo.prefix_cache = true;
  auto engine = runtime::load_engine(model, eo);
  Scheduler sched(*engine, Tokenizer::load(st::tiny_model(conf)),
                  {.max_seqs = 2, .max_queue = 4, .max_context = 0, .step_tokens = 20});
  auto rng = exl3::test::make_rng();
  const auto system = random_prompt(rng, 30, 256);
  int64_t hits = 0;
  for (int i = 0; i < 2; ++i) {
    auto prompt = system;
    const auto tail = random_prompt(rng, 5 + 3 * static_cast<size_t>(i), 256);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    GenerationRequest g;
    g.prompt = prompt;
    g.max_tokens = 6;
    auto sub = sched.submit(g);
    ASSERT_TRUE(sub.stream) << sub.message;
    const auto d = drain(sub.stream);
    EXPECT_EQ(d.tokens, st::reference_generate(model, g.prompt, g.max_tokens, {}).tokens)
        << "request " << i;
    const auto stats = sched.stats();
    EXPECT_EQ(stats.prefix_hit_tokens - hits, i == 0 ? 0 : 16) << "request " << i;
    hits = stats.prefix_hit_tokens;
  }
}

TEST(Scheduler, ChunkedPrefillGivesTheSameTokens) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  // 3 tokens per step: a 40-token prompt takes 14 steps while another request decodes.
  Fixture f(conf, {.max_seqs = 2, .max_queue = 4, .max_context = 0, .step_tokens = 3});
  const auto a = f.greedy(random_prompt(rng, 40), 12), b = f.greedy(random_prompt(rng, 7), 20);
  auto sa = f.sched->submit(a).stream, sb = f.sched->submit(b).stream;
  ASSERT_TRUE(sa && sb);
  const auto da = drain(sa), db = drain(sb);
  expect_equals_reference(f, a, da, "long prompt");
  expect_equals_reference(f, b, db, "short prompt");
}

TEST(Scheduler, SmallKvPoolMakesRequestsWaitNotFail) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  // 128 cache tokens (4 pages of 32); with full reservation each request reserves 96: one runs at
  // a time (preemption_test.cpp covers the default).
  Fixture f(
      conf,
      {.max_seqs = 4, .max_queue = 4, .max_context = 0, .step_tokens = 64, .preemption = false},
      128);
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) {
    reqs.push_back(f.greedy(random_prompt(rng, 10), 60));
    reqs.back().stop_tokens.clear();  // run all 60 tokens
    auto sub = f.sched->submit(reqs.back());
    ASSERT_TRUE(sub.stream) << sub.message;
    streams.push_back(sub.stream);
  }
  EXPECT_LE(f.sched->stats().running, 1);
  for (size_t i = 0; i < streams.size(); ++i) {
    const auto d = drain(streams[i]);
    EXPECT_EQ(d.last.reason, FinishReason::kLength) << d.last.error;
    expect_equals_reference(f, reqs[i], d, "request " + std::to_string(i));
  }
  // A request that could never fit is refused up front instead of waiting forever.
  auto big = f.sched->submit(f.greedy(random_prompt(rng, 100), 60));
  ASSERT_TRUE(big.refusal);
  EXPECT_EQ(*big.refusal, Scheduler::Refusal::kTooLong);
  EXPECT_THAT(big.message, HasSubstr("context of 128 tokens"));
}

// Cancelling a request mid-run frees its KV pages (both pools with a draft model).
TEST(Scheduler, CancelFreesTheSequence) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  for (const bool with_draft : {false, true}) {
    SchedulerOptions so{.max_seqs = 2, .max_queue = 4, .max_context = 0, .step_tokens = 64};
    so.speculative = {2, false};
    Fixture f(conf, so, 4096, with_draft ? st::tiny_model(conf) : std::filesystem::path());
    auto g = f.greedy(random_prompt(rng, 8), 3000);
    g.stop_tokens.clear();
    auto s = f.sched->submit(g).stream;
    ASSERT_TRUE(s);
    int64_t seen = 0;
    while (seen < 6) {
      const auto u = s->wait(std::chrono::milliseconds(100));
      ASSERT_FALSE(u.finished);
      seen += static_cast<int64_t>(u.tokens.size());
    }
    EXPECT_LT(f.sched->stats().free_cache_tokens, f.sched->stats().cache_tokens);
    if (with_draft) {
      EXPECT_LT(f.sched->stats().draft_free_cache_tokens, f.sched->stats().draft_cache_tokens);
    }
    s->cancel();
    const auto d = drain(s);
    EXPECT_EQ(d.last.reason, FinishReason::kCancelled);
    EXPECT_LT(d.last.completion_tokens, 3000);
    const auto back = [&] {
      const auto st = f.sched->stats();
      return st.free_cache_tokens == st.cache_tokens &&
             st.draft_free_cache_tokens == st.draft_cache_tokens;
    };
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!back() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(back()) << (with_draft ? "with a draft" : "plain");
    EXPECT_EQ(f.sched->stats().cancelled, 1);
  }
}

// Shutting down cancels the running and the queued requests alike, and counts every one of them:
// completed + cancelled + failed is what was accepted.
TEST(Scheduler, ShutdownCountsQueuedRequestsAsCancelled) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  Fixture f(conf, {.max_seqs = 1, .max_queue = 4, .max_context = 0, .step_tokens = 64});
  const auto queued = static_cast<int>(1 + rng() % 4);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i <= queued; ++i) {
    auto g = f.greedy(random_prompt(rng, 8), 3000);
    g.stop_tokens.clear();
    streams.push_back(f.sched->submit(g).stream);
    ASSERT_TRUE(streams.back());
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (f.sched->stats().running != 1 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(f.sched->stats().running, 1);
  EXPECT_EQ(f.sched->stats().queued, queued);
  f.sched->shutdown();
  for (const auto& s : streams) EXPECT_EQ(drain(s).last.reason, FinishReason::kCancelled);
  const auto st = f.sched->stats();
  EXPECT_EQ(st.cancelled, queued + 1);
  EXPECT_EQ(st.completed + st.failed, 0);
}

TEST(Scheduler, StopStringEndsTheTextBeforeIt) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  Fixture f(conf);
  // Find a greedy continuation with enough text, then stop on a piece from its middle.
  for (int attempt = 0; attempt < 20; ++attempt) {
    auto g = f.greedy(random_prompt(rng, 6), 32);
    g.stop_tokens.clear();
    const auto ref = st::reference_generate(f.model, g.prompt, g.max_tokens, {});
    const std::string text = f.tok.decode(ref.tokens, true);
    if (text.size() < 12) continue;
    const std::string stop = text.substr(text.size() / 2, 3);
    g.stop_strings = {stop};
    const auto d = drain(f.sched->submit(g).stream);
    EXPECT_EQ(d.last.reason, FinishReason::kStop);
    EXPECT_EQ(d.text, text.substr(0, text.find(stop)))
        << "stop '" << stop << "' in '" << text << "'";
    EXPECT_LE(d.last.completion_tokens, 32);
    return;
  }
  GTEST_SKIP() << "no greedy continuation with 12+ bytes of text found";
}

// A call grammar (strict tools under "auto"): the text is the model's own until its tokens write
// the trigger, then what follows is a whole call of the grammar (here Hermes' shape with a small
// schema), and then the text is free again until max_tokens. The trigger is a piece of the
// greedy reply, so the unconstrained part is known in advance.
TEST(Scheduler, CallGrammarStartsAtTheTriggerAndEndsWithTheCall) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  Fixture f(conf);
  exl3::JsonGrammar::ToolCallShape shape;
  shape.prefix = "\n";
  shape.suffix = "\n</tool_call>";
  const auto grammar = exl3::JsonGrammar::tool_call(
      {{"f", nlohmann::ordered_json::parse(R"({"type": "object", "properties": {"n": {"enum":
          [1, 2]}, "b": {"type": "boolean"}}, "required": ["n", "b"]})")}},
      shape);
  int tested = 0;
  for (int attempt = 0; attempt < 20 && tested < 2; ++attempt) {
    auto g = f.greedy(random_prompt(rng, 6), 120);
    g.stop_tokens.clear();
    const auto ref = st::reference_generate(f.model, g.prompt, 8, {});
    // The trigger: the last 3 bytes of the first few tokens' text (so it ends where a token
    // ends), occurring there first. The scheduler looks for it in the tokens' bytes and this test
    // in the streamed text, so only a prefix whose text is its bytes will do (decoding may tidy
    // them: the tokenizer's clean-up turns " ." into ".").
    std::string trigger, before;
    for (size_t k = 1; k <= ref.tokens.size() && trigger.empty(); ++k) {
      const std::string p = f.tok.decode(std::span(ref.tokens).first(k), true);
      std::string bytes;
      for (size_t i = 0; i < k; ++i) bytes += f.tok.token_bytes(ref.tokens[i]).value_or("\x01");
      if (bytes != p) continue;
      if (p.size() < 3 || p.find("\xef\xbf\xbd") != std::string::npos) continue;
      if (p.find(p.substr(p.size() - 3)) != p.size() - 3) continue;
      trigger = p.substr(p.size() - 3);
      before = p.substr(0, p.size() - 3);
    }
    if (trigger.empty()) continue;
    g.call_trigger = trigger;
    g.call_grammar = grammar;
    const auto d = drain(f.sched->submit(g).stream);
    EXPECT_EQ(d.last.reason, FinishReason::kLength);
    const size_t at = d.text.find(trigger);
    ASSERT_NE(at, std::string::npos) << d.text;
    EXPECT_EQ(d.text.substr(0, at), before) << "free before it";
    exl3::JsonMatcher m(grammar);
    size_t end = at + trigger.size();
    while (end < d.text.size() && !m.finished()) {
      ASSERT_TRUE(m.feed(d.text.substr(end, 1)))
          << "not the call at byte " << end << ": " << d.text;
      ++end;
    }
    ASSERT_TRUE(m.finished()) << d.text;
    const std::string call = d.text.substr(at + trigger.size(), end - at - trigger.size());
    // Between the "\n" the grammar opens with and "\n</tool_call>" (13 bytes) it closes with.
    const auto j = nlohmann::json::parse(call.substr(1, call.size() - 14));
    EXPECT_EQ(j["name"], "f") << call;
    EXPECT_THAT(j["arguments"]["n"].get<int>(), ::testing::AnyOf(1, 2)) << call;
    EXPECT_TRUE(j["arguments"]["b"].is_boolean()) << call;
    // Free again after the call: generation went on to max_tokens.
    EXPECT_EQ(d.last.completion_tokens, 120);
    ++tested;
  }
  EXPECT_EQ(tested, 2);
  // Without a trigger, or beside a grammar, it is refused.
  auto g = f.greedy({5, 6}, 4);
  g.call_grammar = grammar;
  EXPECT_EQ(f.sched->submit(g).refusal, Scheduler::Refusal::kInvalid);
}

TEST(Scheduler, RefusesBadRequests) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  Fixture f(conf, {.max_seqs = 1, .max_queue = 1, .max_context = 64, .step_tokens = 16});
  auto refusal = [&](GenerationRequest g) {
    auto s = f.sched->submit(std::move(g));
    EXPECT_FALSE(s.stream);
    return s.refusal ? std::make_pair(*s.refusal, s.message)
                     : std::make_pair(Scheduler::Refusal::kInvalid, std::string("accepted"));
  };
  EXPECT_THAT(refusal(f.greedy({}, 4)).second, HasSubstr("empty"));
  EXPECT_THAT(refusal(f.greedy({5, 512}, 4)).second, HasSubstr("outside the vocabulary 0..511"));
  EXPECT_THAT(refusal(f.greedy({5}, 0)).second, HasSubstr("max_tokens 0"));
  auto hot = f.greedy({5}, 4);
  hot.sampling.temperature = -1.0f;
  EXPECT_THAT(refusal(hot).second, HasSubstr("temperature"));
  auto empty_stop = f.greedy({5}, 4);
  empty_stop.stop_strings = {""};
  EXPECT_THAT(refusal(empty_stop).second, HasSubstr("stop string is empty"));
  const auto too_long = refusal(f.greedy(std::vector<int32_t>(60, 5), 5));
  EXPECT_EQ(too_long.first, Scheduler::Refusal::kTooLong);
  EXPECT_THAT(
      too_long.second,
      HasSubstr("60 tokens and max_tokens is 5: together they exceed this server's context of 64"));
  f.sched->shutdown();
  EXPECT_EQ(refusal(f.greedy({5}, 4)).first, Scheduler::Refusal::kShuttingDown);
}

TEST(Scheduler, RefusesBadOptions) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  runtime::EngineOptions eo;
  eo.page_size = 32;
  eo.cache_tokens = 256;
  auto engine = runtime::load_engine(st::tiny_model(conf), eo);
  const auto tok = Tokenizer::load(st::tiny_model(conf));
  auto make = [&](const SchedulerOptions& o) { Scheduler s(*engine, tok, o); };
  EXPECT_THROW(make(SchedulerOptions{.max_seqs = 0}), exl3::Error);
  EXPECT_THROW(make(SchedulerOptions{.max_seqs = 1, .max_queue = 0}), exl3::Error);
  EXPECT_THROW(
      make(SchedulerOptions{.max_seqs = 1, .max_queue = 1, .max_context = 0, .step_tokens = 0}),
      exl3::Error);
  try {
    make(SchedulerOptions{.max_seqs = 1, .max_queue = 1, .max_context = 1000, .step_tokens = 8});
    ADD_FAILURE() << "max_context over the cache accepted";
  } catch (const exl3::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--cache-tokens"));
  }
  // A draft: another vocabulary, or a pool smaller than max_context.
  exl3::test::TempDir small_vocab;
  exl3::SyntheticHfSpec sv;
  sv.arch = exl3::HfArch::kQwen3;
  sv.vocab_size = 300;
  exl3::write_synthetic_hf_model(small_vocab.path(), sv);
  auto wrong_vocab = runtime::load_engine(small_vocab.path(), eo);
  SchedulerOptions with_draft{.max_seqs = 1, .max_queue = 1, .max_context = 0, .step_tokens = 8};
  with_draft.draft = wrong_vocab.get();
  EXPECT_THAT(exl3::runtime::test::error_of([&] { make(with_draft); }),
              HasSubstr("the draft model's vocabulary has 300 tokens"));
  runtime::EngineOptions small = eo;
  small.cache_tokens = 64;
  auto small_draft = runtime::load_engine(st::tiny_model(conf), small);
  with_draft.draft = small_draft.get();
  with_draft.max_context = 200;
  EXPECT_THAT(exl3::runtime::test::error_of([&] { make(with_draft); }),
              HasSubstr("exceeds what the draft model holds (64 tokens"));
  // Without max_context, the draft's pool caps the server's context.
  with_draft.max_context = 0;
  EXPECT_EQ(Scheduler(*engine, tok, with_draft).max_context(), 64);
}

TEST(Scheduler, MaxTokensNearTwoToThe63IsTooLongNotAWrap) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  Fixture f(conf);
  for (const int64_t m : {INT64_MAX, INT64_MAX - 1, INT64_MAX - 2, int64_t{1} << 62}) {
    auto sub = f.sched->submit(f.greedy({5, 6, 7}, m));
    ASSERT_TRUE(sub.refusal) << m;
    EXPECT_EQ(*sub.refusal, Scheduler::Refusal::kTooLong) << m;
    EXPECT_THAT(sub.message, HasSubstr("at most")) << m;
  }
  EXPECT_EQ(f.sched->stats().steps, 0);
}

TEST(Scheduler, FreeRunSlotsCountAsRoomForABurst) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  SchedulerOptions so;
  so.max_seqs = 8;
  so.max_queue = 1;
  Fixture f(conf, so, 8192);
  std::vector<std::shared_ptr<RequestStream>> streams;
  // Nine long requests submitted back to back, faster than the worker admits them: eight run
  // slots and one queue place hold them all; only the tenth is refused.
  for (int i = 0; i < 9; ++i) {
    auto g = f.greedy({5, static_cast<int32_t>(6 + i)}, 500);
    g.stop_tokens.clear();
    auto sub = f.sched->submit(std::move(g));
    ASSERT_FALSE(sub.refusal) << "request " << i << ": " << sub.message;
    streams.push_back(sub.stream);
  }
  auto extra = f.sched->submit(f.greedy({5, 6}, 500));
  ASSERT_TRUE(extra.refusal);
  EXPECT_EQ(*extra.refusal, Scheduler::Refusal::kQueueFull);
  for (auto& s : streams) s->cancel();
  for (auto& s : streams) drain(s);
}
