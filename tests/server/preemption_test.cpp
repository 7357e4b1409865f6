// Preemption in the continuous-batching scheduler, on the conformance model with KV caches far
// too small for every request's prompt + max_tokens at once: requests are admitted on their
// prompt, grow page by page, and the newest go back to the queue (their pages freed) when the
// pool runs short. Every request still completes with exactly the tokens it gives alone, greedy
// and seeded sampling, with a draft model and with an MTP head; a preempted request can be
// cancelled while it waits; the counters add up and reach /health and /metrics; with preemption
// off nothing is preempted.
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../runtime/runtime_test_util.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/runtime/mtp.hpp"
#include "exl3/runtime/speculative.hpp"
#include "exl3/server/scheduler.hpp"
#include "exl3/text/json_schema.hpp"
#include "exl3/text/stop_tokens.hpp"
#include "server_test_util.hpp"
#include "test_support.hpp"

using namespace exl3::server;
namespace st = exl3::server::test;
namespace runtime = exl3::runtime;
using exl3::Tokenizer;
using nlohmann::json;

namespace {

using st::Done;
using st::drain;
using st::expect_drained_pools;
using st::overflowing_requests;
using st::random_prompt;

// The conformance model behind a scheduler whose pool has `cache` tokens in pages of `page`
// (a draft model, when given, gets the same pool).
struct SmallPool {
  SmallPool(const std::filesystem::path& conf, SchedulerOptions so, int64_t page, int64_t cache,
            const std::filesystem::path& draft = {})
      : model(st::tiny_model(conf)), tok(Tokenizer::load(model)) {
    eo.page_size = page;
    eo.cache_tokens = cache;
    engine = runtime::load_engine(model, eo);
    if (!draft.empty()) {
      draft_engine = runtime::load_engine(draft, eo);
      so.draft = draft_engine.get();
    }
    stops = exl3::model_stop_tokens(model, engine->spec().eos_token_ids, tok);
    sched = std::make_unique<Scheduler>(*engine, tok, so);
  }
  std::vector<std::shared_ptr<RequestStream>> submit_all(const std::vector<GenerationRequest>& rs) {
    std::vector<std::shared_ptr<RequestStream>> out;
    for (const auto& r : rs) {
      auto sub = sched->submit(r);
      EXPECT_TRUE(sub.stream) << sub.message;
      out.push_back(sub.stream);
    }
    return out;
  }
  std::filesystem::path model;
  Tokenizer tok;
  runtime::EngineOptions eo;
  std::unique_ptr<runtime::Engine> engine, draft_engine;
  std::vector<int32_t> stops;
  std::unique_ptr<Scheduler> sched;
};

// The options under which generate() gives what a request must stream when it runs alone.
runtime::GenerateOptions alone(const GenerationRequest& r) {
  runtime::GenerateOptions go;
  go.max_new_tokens = r.max_tokens;
  go.stop_tokens = r.stop_tokens;
  go.sampling = r.sampling;
  return go;
}

// The tokens a request must stream: generate()'s, plus the stop token it ended on.
std::vector<int32_t> expected_tokens(const runtime::GenerateResult& r) {
  auto t = r.tokens;
  if (r.stop_reason == "stop_token") t.push_back(r.stop_token);
  return t;
}

}  // namespace

// Greedy: every request equals generate() alone, preempted or not, and the text streamed is the
// text of those tokens (nothing sent twice). With preemption off, requests wait instead.
TEST(Preemption, GreedyRequestsEqualGenerateAlone) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  auto reference = runtime::load_engine(st::tiny_model(conf));
  const auto tok = Tokenizer::load(st::tiny_model(conf));
  for (const bool preemption : {true, false}) {
    const std::string what = preemption ? "preemption on" : "preemption off";
    SchedulerOptions so{.max_seqs = 6, .max_queue = 8, .max_context = 0, .step_tokens = 32};
    so.preemption = preemption;
    SmallPool s(conf, so, 8, 160);
    const auto reqs = overflowing_requests(rng, s.stops);
    const auto streams = s.submit_all(reqs);
    int64_t tokens = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Done d = drain(streams[i]);
      const auto ref = runtime::generate(*reference, reqs[i].prompt, alone(reqs[i]));
      EXPECT_EQ(d.tokens, expected_tokens(ref)) << what << " request " << i;
      EXPECT_EQ(d.text, tok.decode(ref.tokens, /*skip_special=*/true)) << what << " request " << i;
      EXPECT_EQ(d.last.completion_tokens, static_cast<int64_t>(d.tokens.size())) << what;
      EXPECT_EQ(d.last.prompt_tokens, static_cast<int64_t>(reqs[i].prompt.size())) << what;
      tokens += d.last.completion_tokens;
    }
    const auto st = s.sched->stats();
    EXPECT_EQ(st.completed, 6) << what;
    EXPECT_EQ(st.generation_tokens, tokens) << what;  // re-prefills sample nothing
    if (preemption) {
      EXPECT_GT(st.preemptions, 0) << what;
      EXPECT_GT(st.recomputed_tokens, 0) << what;
    } else {
      EXPECT_EQ(st.preemptions, 0) << what;
      EXPECT_EQ(st.recomputed_tokens, 0) << what;
    }
    expect_drained_pools(st, what);
  }
}

// Seeded sampling (temperature, top-k / top-p, a repetition penalty on some): a preempted request
// resumes its sampler's stream, so each equals generate() with the same seed.
TEST(Preemption, SeededSamplingKeepsItsStream) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  auto reference = runtime::load_engine(st::tiny_model(conf));
  SmallPool s(conf, {.max_seqs = 6, .max_queue = 8, .max_context = 0, .step_tokens = 32}, 8, 160);
  auto reqs = overflowing_requests(rng, s.stops);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto& sm = reqs[i].sampling;
    sm.temperature = 0.7f + 0.1f * static_cast<float>(i % 3);
    sm.top_k = i % 2 == 0 ? 40 : 0;
    sm.top_p = 0.95f;
    sm.seed = rng();
    if (i % 3 == 1) sm.repetition_penalty = 1.2f;
  }
  const auto streams = s.submit_all(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Done d = drain(streams[i]);
    EXPECT_EQ(d.tokens,
              expected_tokens(runtime::generate(*reference, reqs[i].prompt, alone(reqs[i]))))
        << "request " << i << " seed " << reqs[i].sampling.seed;
  }
  const auto st = s.sched->stats();
  EXPECT_EQ(st.completed, 6);
  EXPECT_GT(st.preemptions, 0);
  expect_drained_pools(st, "sampling");
}

// A draft model that rarely agrees (a random one of the same vocabulary, 3 drafts per round): a
// preempted sequence leaves both pools and keeps both samplers, so greedy requests equal
// generate() and seeded ones generate_speculative() with the same draft and seed.
TEST(Preemption, DraftModelKeepsBothPoolsAndSamplers) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  exl3::test::TempDir other;
  runtime::test::write_model(other.path(), exl3::HfArch::kQwen3, exl3::test::test_seed());
  SchedulerOptions so{.max_seqs = 6, .max_queue = 8, .max_context = 0, .step_tokens = 32};
  so.speculative = {3, false};
  SmallPool s(conf, so, 8, 160, other.path());
  auto reference = runtime::load_engine(st::tiny_model(conf));
  auto reference_draft = runtime::load_engine(other.path());
  auto reqs = overflowing_requests(rng, s.stops);
  for (size_t i = 0; i < reqs.size(); i += 2) {
    reqs[i].sampling.temperature = 0.8f;
    reqs[i].sampling.seed = rng();
  }
  const auto streams = s.submit_all(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Done d = drain(streams[i]);
    const auto go = alone(reqs[i]);
    const auto ref = reqs[i].sampling.temperature == 0.0f
                         ? runtime::generate(*reference, reqs[i].prompt, go)
                         : runtime::generate_speculative(*reference, *reference_draft,
                                                         reqs[i].prompt, go, so.speculative);
    EXPECT_EQ(d.tokens, expected_tokens(ref)) << "request " << i << ": " << d.last.error;
  }
  const auto st = s.sched->stats();
  EXPECT_EQ(st.completed, 6);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.speculative_rounds, 0);
  expect_drained_pools(st, "draft");
}

// serve --mtp: the tiny DeepSeek-V3 drafting through its own MTP head (its pool as small as the
// model's), whose sequences read the model's hidden states: after a preemption both are
// prefilled again and the greedy tokens still equal generate() alone.
TEST(Preemption, MtpHeadResumesAfterPreemption) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  const auto ckpt = exl3::Checkpoint::open(exl3::test::model_data_dir() / "deepseek_v3_mtp");
  const auto tok = Tokenizer::load(st::tiny_model(conf));  // turns ids into text only
  runtime::EngineOptions eo;
  eo.page_size = 8;
  eo.cache_tokens = 96;
  auto engine = runtime::load_engine(ckpt, eo);
  auto head = runtime::load_mtp_draft(*engine, ckpt, eo);
  const auto reference = runtime::load_engine(ckpt);
  SchedulerOptions so{.max_seqs = 4, .max_queue = 8, .max_context = 0, .step_tokens = 16};
  so.draft = head.get();
  so.speculative = {3, false};
  Scheduler sched(*engine, tok, so);
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest g;
    g.prompt = random_prompt(rng, 4 + rng() % 12, 256);
    g.max_tokens = 40 + static_cast<int64_t>(rng() % 10);
    reqs.push_back(g);
    auto sub = sched.submit(g);
    ASSERT_TRUE(sub.stream) << sub.message;
    streams.push_back(sub.stream);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Done d = drain(streams[i]);
    EXPECT_EQ(d.tokens, runtime::generate(*reference, reqs[i].prompt, alone(reqs[i])).tokens)
        << "request " << i << ": " << d.last.error;
  }
  const auto st = sched.stats();
  EXPECT_EQ(st.completed, 4);
  EXPECT_GT(st.preemptions, 0);
  expect_drained_pools(st, "mtp");
}

// Two long requests in a pool that holds one of them at its end: the newer is preempted and waits
// at the head of the queue until the older finishes (it cannot fit before). Cancelled while it
// waits (from the older one's listener, which runs on the worker: deterministic), it ends with the
// tokens it had streamed, a prefix of its greedy reply; the older one is unaffected, and every
// request is accounted for.
TEST(Preemption, CancelAPreemptedRequestWhileItWaits) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  SmallPool s(conf, {.max_seqs = 2, .max_queue = 4, .max_context = 0, .step_tokens = 32}, 4, 128);
  std::vector<GenerationRequest> reqs(2);
  for (auto& g : reqs) {
    g.prompt = random_prompt(rng, 6);
    g.max_tokens = 120;
  }
  const auto streams = s.submit_all(reqs);
  std::mutex mu;  // the listener may also run once on this thread, from set_listener
  std::optional<SchedulerStats> at_cancel;
  streams[0]->set_listener([&] {
    std::lock_guard lk(mu);
    if (at_cancel) return;
    auto now = s.sched->stats();
    if (now.preemptions == 0) return;
    at_cancel = now;
    streams[1]->cancel();
  });
  const Done older = drain(streams[0]);
  const Done cancelled = drain(streams[1]);
  ASSERT_TRUE(at_cancel) << "nothing was preempted";
  EXPECT_EQ(at_cancel->queued, 1);
  EXPECT_EQ(at_cancel->running, 1);
  EXPECT_EQ(cancelled.last.reason, FinishReason::kCancelled);
  EXPECT_EQ(cancelled.last.completion_tokens, static_cast<int64_t>(cancelled.tokens.size()));
  EXPECT_GT(cancelled.tokens.size(), 0u);  // it ran before it was preempted
  EXPECT_EQ(older.last.reason, FinishReason::kLength);
  auto reference = runtime::load_engine(st::tiny_model(conf));
  runtime::GenerateOptions go;
  go.max_new_tokens = 120;
  EXPECT_EQ(older.tokens, runtime::generate(*reference, reqs[0].prompt, go).tokens);
  const auto full = runtime::generate(*reference, reqs[1].prompt, go).tokens;
  ASSERT_LT(cancelled.tokens.size(), full.size());
  EXPECT_EQ(cancelled.tokens,
            std::vector<int32_t>(
                full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cancelled.tokens.size())));
  const auto st = s.sched->stats();
  EXPECT_EQ(st.completed + st.cancelled + st.failed, 2);
  EXPECT_EQ(st.cancelled, 1);
  EXPECT_EQ(st.preemptions, 1);  // the older one was never preempted
  expect_drained_pools(st, "cancel");
}

// Over HTTP: three concurrent completions in a 128-token cache (four pages of 32) each get their
// greedy text, and /health and /metrics count the same preemptions.
TEST(Preemption, CountedInHealthAndMetrics) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  ServerOptions opts;
  opts.scheduler.max_seqs = 3;
  st::LiveServer server(st::tiny_model(conf), opts, 128);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(random_prompt(rng, 3 + rng() % 5));
  std::vector<std::string> texts(3);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      const json body = {
          {"prompt", prompts[i]}, {"max_tokens", 100}, {"ignore_eos", true}, {"temperature", 0}};
      auto r = server.client(60)->Post("/v1/completions", body.dump(), "application/json");
      if (r && r->status == 200) texts[i] = json::parse(r->body)["choices"][0]["text"];
    });
  }
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < 3; ++i) {
    const auto ref = st::reference_generate(st::tiny_model(conf), prompts[i], 100, {});
    EXPECT_EQ(texts[i], server.tokenizer().decode(ref.tokens, /*skip_special=*/true))
        << "request " << i;
  }
  const auto h = server.health();
  ASSERT_FALSE(h.is_null());
  EXPECT_EQ(h["completed"], 3);
  const int64_t preemptions = h["preemptions"];
  EXPECT_GT(preemptions, 0);
  auto m = server.client()->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_THAT(m->body, ::testing::HasSubstr("\nexl3_preemptions_total " +
                                            std::to_string(preemptions) + "\n"));
  EXPECT_THAT(m->body,
              ::testing::HasSubstr("# TYPE exl3_preemption_recomputed_tokens_total counter"));
}

// Structured output under preemption: greedy requests constrained to a schema, in a pool too small
// for all of them, are preempted and recomputed; each keeps its matcher, so every reply is still
// one whole value the schema accepts, and equals the same request run alone.
TEST(Preemption, ConstrainedRequestsKeepTheirGrammar) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  const auto grammar = exl3::JsonGrammar::from_schema(nlohmann::ordered_json::parse(R"({
      "type": "object",
      "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"},
                     "maxItems": 3}},
      "required": ["id", "tags"]})"));
  const auto make = [&](size_t i) {
    GenerationRequest g;
    g.prompt = random_prompt(rng, 4 + i);
    g.max_tokens = 48;
    g.grammar = grammar;
    return g;
  };
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < 6; ++i) reqs.push_back(make(i));
  std::vector<std::string> alone;
  for (const auto& r : reqs) {  // each by itself in a pool that holds it whole
    SmallPool s(conf, {.max_seqs = 1, .max_queue = 1, .max_context = 0, .step_tokens = 32}, 8, 160);
    alone.push_back(drain(s.submit_all({r}).front()).text);
  }
  SmallPool s(conf, {.max_seqs = 6, .max_queue = 8, .max_context = 0, .step_tokens = 32}, 8, 64);
  const auto streams = s.submit_all(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Done d = drain(streams[i]);
    EXPECT_EQ(d.text, alone[i]) << "request " << i;
    if (d.last.reason == FinishReason::kStop) {
      exl3::JsonMatcher m(grammar);
      EXPECT_TRUE(m.feed(d.text)) << d.text;
      EXPECT_TRUE(m.complete()) << d.text;
    }
  }
  const auto st = s.sched->stats();
  EXPECT_EQ(st.completed, 6);
  EXPECT_GT(st.preemptions, 0);
  expect_drained_pools(st, "constrained");
}
