// The real server on 127.0.0.1 (a free port) over the conformance model, driven over loopback
// with httplib::Client (timeouts on every call): greedy completions equal generate(), concurrent
// streams each equal their solo result, bad requests get OpenAI error objects with the right
// 4xx, oversized prompts 400, a full queue 503, and a client that disconnects mid-stream does
// not hurt the server and has its sequence dropped.
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server_test_util.hpp"
#include "test_support.hpp"

using namespace exl3;
using namespace exl3::server;
using namespace exl3::server::test;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

ServerOptions server_options(int max_seqs = 4, int max_queue = 8) {
  return small_server_options(max_seqs, max_queue);
}

// POSTs JSON; returns (status, parsed body or null).
std::pair<int, json> server_post(const LiveServer& s, const std::string& path,
                                 const std::string& body) {
  auto r = s.client()->Post(path.c_str(), body, "application/json");
  if (!r) return {-1, nullptr};
  return {r->status, json::parse(r->body, nullptr, false)};
}

// The expected text and usage of a greedy request, from runtime::generate.
struct Expect {
  std::string text;
  int64_t completion_tokens;
  std::string finish_reason;
};
Expect expected(const LiveServer& s, const std::filesystem::path& model,
                const std::vector<int32_t>& prompt, int64_t max_tokens,
                std::vector<int32_t> stops) {
  const auto ref = reference_generate(model, prompt, max_tokens, stops);
  return {s.tokenizer().decode(ref.tokens, true),
          static_cast<int64_t>(ref.tokens.size()) + (ref.stopped ? 1 : 0),
          ref.stopped ? "stop" : "length"};
}

// A streamed request read to its end: the concatenated text and the events.
struct Streamed {
  int status = -1;
  std::string text;
  std::vector<json> chunks;
  bool done = false;
  std::string error;
};
Streamed stream(const LiveServer& s, const std::string& path, json body) {
  body["stream"] = true;
  Streamed out;
  auto r = s.client()->Post(path.c_str(), httplib::Headers{}, body.dump(), "application/json");
  if (!r) {
    out.error = httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  for (const auto& d : sse_data(r->body)) {
    if (d == "[DONE]") {
      out.done = true;
      continue;
    }
    auto j = json::parse(d);
    for (const auto& c : j["choices"]) {
      if (c.contains("text")) out.text += c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].contains("content"))
        out.text += c["delta"]["content"].get<std::string>();
    }
    out.chunks.push_back(std::move(j));
  }
  return out;
}

}  // namespace

TEST(HttpServer, HealthAndModels) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), server_options());
  const auto h = s.health();
  ASSERT_FALSE(h.is_null());
  EXPECT_EQ(h["status"], "ok");
  EXPECT_EQ(h["model"], "tiny");
  EXPECT_EQ(h["running"], 0);
  EXPECT_EQ(h["free_cache_tokens"], h["cache_tokens"]);
  EXPECT_EQ(h["prefix_cache_hit_tokens"], 0);
  EXPECT_EQ(h["max_context"], 4096);  // the model's max_position_embeddings (= the cache here)

  auto c = s.client();
  auto r = c->Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const auto m = json::parse(r->body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["object"], "model");
  r = c->Get("/v1/models/tiny");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = c->Get("/v1/models/other");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_not_found");
}

TEST(HttpServer, GreedyCompletionEqualsGenerate) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  const auto model = tiny_model(conf);
  LiveServer s(model, server_options());
  const auto prompt = random_prompt(rng, 12);
  const auto want = expected(s, model, prompt, 24, s.options().stop_tokens);
  const auto [status, j] = server_post(
      s, "/v1/completions",
      json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}}.dump());
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_THAT(j["id"].get<std::string>(), ::testing::StartsWith("cmpl-"));
  EXPECT_EQ(j["choices"][0]["text"], want.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], want.finish_reason);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 12);
  EXPECT_EQ(j["usage"]["completion_tokens"], want.completion_tokens);
  EXPECT_EQ(j["usage"]["total_tokens"], 12 + want.completion_tokens);

  // A text prompt goes through the tokenizer (BOS etc. as generate's CLI would add them).
  const std::string text = "Once upon a time";
  const auto ids = s.tokenizer().encode(text, true);
  const auto want2 = expected(s, model, ids, 10, s.options().stop_tokens);
  const auto [status2, j2] = server_post(
      s, "/v1/completions", json{{"prompt", text}, {"max_tokens", 10}, {"temperature", 0}}.dump());
  ASSERT_EQ(status2, 200) << j2.dump();
  EXPECT_EQ(j2["choices"][0]["text"], want2.text);
  EXPECT_EQ(j2["usage"]["prompt_tokens"], static_cast<int64_t>(ids.size()));
}

// serve --draft: the same greedy completion, and /health and /metrics count the drafts (the
// model drafting for itself: every draft kept).
TEST(HttpServer, DraftModelReportsAcceptance) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  const auto model = tiny_model(conf);
  auto o = server_options();
  o.scheduler.speculative = {3, false};
  LiveServer s(model, o, 4096, model);
  const auto prompt = random_prompt(rng, 9);
  const auto want = expected(s, model, prompt, 20, s.options().stop_tokens);
  const auto [status, j] = server_post(
      s, "/v1/completions",
      json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}}.dump());
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], want.text);
  EXPECT_EQ(j["usage"]["completion_tokens"], want.completion_tokens);
  const auto h = s.health();
  ASSERT_TRUE(h.contains("speculative")) << h.dump();
  const auto& sp = h["speculative"];
  EXPECT_EQ(sp["draft_tokens"], 3);
  EXPECT_EQ(sp["adaptive"], false);
  EXPECT_GT(sp["drafted_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(sp["accepted_tokens"], sp["drafted_tokens"]);
  EXPECT_EQ(sp["acceptance_rate"].get<double>(), 1.0);
  EXPECT_GT(sp["tokens_per_round"].get<double>(), 1.0);
  EXPECT_EQ(sp["draft_free_cache_tokens"], sp["draft_cache_tokens"]);
  auto m = s.client()->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_THAT(m->body, ::testing::HasSubstr("exl3_speculative_accepted_tokens_total " +
                                            sp["accepted_tokens"].dump()));
  EXPECT_THAT(m->body, ::testing::HasSubstr("exl3_speculative_drafted_tokens_total"));
  // Without a draft, neither appears.
  LiveServer plain(model, server_options());
  EXPECT_FALSE(plain.health().contains("speculative"));
  auto pm = plain.client()->Get("/metrics");
  ASSERT_TRUE(pm);
  EXPECT_THAT(pm->body, ::testing::Not(::testing::HasSubstr("exl3_speculative")));
}

TEST(HttpServer, ConcurrentStreamsEachEqualTheirSoloResult) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto rng = exl3::test::make_rng();
  const auto model = tiny_model(conf);
  LiveServer s(model, server_options(4, 8));
  constexpr int kN = 6;  // more than max_seqs: two of them queue first
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Expect> want;
  for (int i = 0; i < kN; ++i) {
    prompts.push_back(random_prompt(rng, 4 + rng() % 24));
    // Half ignore EOS, so the streams surely overlap for 20 tokens (the batching check below).
    want.push_back(expected(s, model, prompts.back(), 20,
                            i % 2 == 0 ? std::vector<int32_t>{} : s.options().stop_tokens));
  }
  std::vector<Streamed> got(kN);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      got[static_cast<size_t>(i)] = stream(s, "/v1/completions",
                                           json{{"prompt", prompts[static_cast<size_t>(i)]},
                                                {"max_tokens", 20},
                                                {"temperature", 0},
                                                {"ignore_eos", i % 2 == 0},
                                                {"stream_options", {{"include_usage", true}}}});
    });
  }
  for (auto& t : threads) t.join();
  int64_t tokens = 0;
  for (int i = 0; i < kN; ++i) {
    const auto& g = got[static_cast<size_t>(i)];
    ASSERT_EQ(g.status, 200) << "stream " << i << ": " << g.error;
    EXPECT_TRUE(g.done) << "stream " << i << " has no [DONE]";
    EXPECT_EQ(g.text, want[static_cast<size_t>(i)].text) << "stream " << i;
    ASSERT_GE(g.chunks.size(), 2u);
    const auto& fin = g.chunks[g.chunks.size() - 2];
    EXPECT_EQ(fin["choices"][0]["finish_reason"], want[static_cast<size_t>(i)].finish_reason)
        << "stream " << i;
    const auto& usage = g.chunks.back();
    EXPECT_TRUE(usage["choices"].empty());
    EXPECT_EQ(usage["usage"]["completion_tokens"], want[static_cast<size_t>(i)].completion_tokens)
        << "stream " << i;
    EXPECT_EQ(usage["usage"]["prompt_tokens"],
              static_cast<int64_t>(prompts[static_cast<size_t>(i)].size()));
    tokens += usage["usage"]["completion_tokens"].get<int64_t>();
    for (const auto& c : g.chunks) EXPECT_EQ(c["object"], "text_completion");
  }
  const auto h = s.health();
  EXPECT_EQ(h["completed"], kN);
  EXPECT_EQ(h["free_cache_tokens"], h["cache_tokens"]);
  EXPECT_LT(h["steps"].get<int64_t>(), tokens) << "the streams were not batched together";
}

TEST(HttpServer, ChatCompletionsWithAChatFormat) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  const auto model = tiny_model(conf);
  const json body = {
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}},
      {"max_tokens", 8},
      {"temperature", 0}};
  {
    // The conformance model has no chat_template: chat needs --chat-format, and says so.
    LiveServer s(model, server_options());
    const auto [status, j] = server_post(s, "/v1/chat/completions", body.dump());
    EXPECT_EQ(status, 400);
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("--chat-format"));
  }
  auto o = server_options();
  o.chat_format = ChatFormat::kPlain;
  LiveServer s(model, o);
  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}};
  const ChatTemplate plain(ChatFormat::kPlain);
  const auto prompt =
      s.tokenizer().encode(plain.render(msgs, true), plain.encode_adds_special_tokens());
  const auto want = expected(s, model, prompt, 8, s.options().stop_tokens);
  const auto [status, j] = server_post(s, "/v1/chat/completions", body.dump());
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], want.text);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int64_t>(prompt.size()));

  const auto st = stream(s, "/v1/chat/completions", body);
  ASSERT_EQ(st.status, 200) << st.error;
  EXPECT_TRUE(st.done);
  ASSERT_FALSE(st.chunks.empty());
  EXPECT_EQ(st.chunks.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(st.chunks.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(st.text, want.text);
}

TEST(HttpServer, ChatCompletionsWithTheModelsTemplate) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  // The conformance model, given a Jinja chat template that reads a chat_template_kwargs
  // variable and raises for a conversation it refuses.
  exl3::test::TempDir tmp;
  for (const auto& e : std::filesystem::directory_iterator(tiny_model(conf))) {
    std::filesystem::copy_file(e.path(), tmp / e.path().filename());
  }
  auto cfg = json::parse(exl3::test::read_file(tmp / "tokenizer_config.json"));
  cfg["chat_template"] =
      "{% if messages[-1].role != 'user' %}{{ raise_exception('the last turn must be a user "
      "turn') }}{% endif %}{{ bos_token }}{% for m in messages %}{{ m.role | upper }}: "
      "{{ m.content | trim }}\n{% endfor %}{% if enable_thinking is defined and not "
      "enable_thinking %}/no_think\n{% endif %}{% if add_generation_prompt %}ASSISTANT:{% endif %}";
  exl3::test::write_file(tmp / "tokenizer_config.json", cfg.dump());
  LiveServer s(tmp.path(), server_options());
  EXPECT_THAT(s.server().chat_status(), HasSubstr("the model's chat template"));
  auto prompt_tokens = [&](const json& body) {
    const auto [status, j] = server_post(s, "/v1/chat/completions", body.dump());
    EXPECT_EQ(status, 200) << j.dump();
    return j["usage"]["prompt_tokens"].get<int64_t>();
  };
  const json msgs = {{{"role", "user"}, {"content", "  Hi  "}}};
  const auto bos = s.tokenizer().bos_token().value();
  EXPECT_EQ(prompt_tokens({{"messages", msgs}, {"max_tokens", 1}}),
            static_cast<int64_t>(s.tokenizer().encode(bos + "USER: Hi\nASSISTANT:", false).size()));
  EXPECT_EQ(prompt_tokens({{"messages", msgs},
                           {"max_tokens", 1},
                           {"chat_template_kwargs", {{"enable_thinking", false}}}}),
            static_cast<int64_t>(
                s.tokenizer().encode(bos + "USER: Hi\n/no_think\nASSISTANT:", false).size()));
  // The template's refusal is the client's 400, with the template's words.
  const json wrong = {{"messages", {{{"role", "assistant"}, {"content", "x"}}}}, {"max_tokens", 1}};
  const auto [status, j] = server_post(s, "/v1/chat/completions", wrong.dump());
  EXPECT_EQ(status, 400);
  EXPECT_THAT(j["error"]["message"].get<std::string>(),
              HasSubstr("the last turn must be a user turn"));
  // A native format has no variables to set.
  auto o = server_options();
  o.chat_format = ChatFormat::kPlain;
  LiveServer plain(tmp.path(), o);
  const json kw = {{"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", false}}}};
  const auto [status2, j2] = server_post(plain, "/v1/chat/completions", kw.dump());
  EXPECT_EQ(status2, 400);
  EXPECT_THAT(j2["error"]["message"].get<std::string>(), HasSubstr("no template variables"));
}

TEST(HttpServer, BadRequestsGetOpenAiErrors) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), server_options());
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"prompt\": ", 400, "not valid JSON"},
      {"/v1/completions", "\"just a string\"", 400, "JSON object"},
      {"/v1/completions", R"({"prompt": 1})", 400, "'prompt' must be"},
      {"/v1/completions", R"({"prompt": "x", "n": 3})", 400, "'n' must be 1"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "'max_tokens'"},
      {"/v1/completions", R"({"prompt": "x", "temperature": -1})", 400, "'temperature'"},
      {"/v1/completions", R"({"prompt": "x", "top_p": 2})", 400, "'top_p'"},
      {"/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404, "'gpt-4' does not exist"},
      {"/v1/completions", R"({"prompt": [5, 100000]})", 400, "outside the vocabulary"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "'messages' must be a list"},
  };
  for (const auto& c : cases) {
    const auto [status, j] = server_post(s, c.path, c.body);
    EXPECT_EQ(status, c.status) << c.body;
    ASSERT_TRUE(j.is_object() && j.contains("error")) << c.body;
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(c.says)) << c.body;
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("param") &&
                j["error"].contains("code"));
  }
  auto cl = s.client();
  auto r = cl->Get("/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "method_not_allowed");
  r = cl->Post("/health", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = cl->Get("/v2/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_THAT(json::parse(r->body)["error"]["message"].get<std::string>(),
              HasSubstr("/v1/completions"));
  // A body over the 64 KiB limit.
  r = cl->Post("/v1/completions", json{{"prompt", std::string(100000, 'a')}}.dump(),
               "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_THAT(json::parse(r->body)["error"]["message"].get<std::string>(),
              HasSubstr("65536 bytes"));
  // Still serving after all of that.
  EXPECT_EQ(server_post(s, "/v1/completions", R"({"prompt": [5, 6], "max_tokens": 2})").first, 200);
  EXPECT_EQ(s.health()["failed"], 0);
}

TEST(HttpServer, OversizedPromptIs400) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto o = server_options();
  o.scheduler.max_context = 256;
  LiveServer s(tiny_model(conf), o);
  auto rng = exl3::test::make_rng();
  auto [status, j] =
      server_post(s, "/v1/completions", json{{"prompt", random_prompt(rng, 300)}}.dump());
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("256 tokens"));
  std::tie(status, j) = server_post(
      s, "/v1/completions", json{{"prompt", random_prompt(rng, 200)}, {"max_tokens", 100}}.dump());
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  // Without max_tokens, the default fits what is left of the context.
  std::tie(status, j) = server_post(
      s, "/v1/completions", json{{"prompt", random_prompt(rng, 250)}, {"ignore_eos", true}}.dump());
  EXPECT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(s.health()["failed"], 0);
}

namespace {

// A streaming request that reads until told to stop, then hangs up.
class HangingStream {
 public:
  HangingStream(const LiveServer& s, json body) : client_(s.client()) {
    body["stream"] = true;
    thread_ = std::thread([this, body] {
      // httplib 0.11's Client::Post has no content receiver; a hand-built Request does.
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body.dump();
      req.set_header("Content-Type", "application/json");
      req.content_receiver = [this](const char*, size_t, uint64_t, uint64_t) {
        ++chunks_;
        return !hang_up_.load();
      };
      client_->send(req);
    });
  }
  ~HangingStream() {
    hang_up();
    thread_.join();
  }
  void hang_up() { hang_up_ = true; }
  int chunks() const { return chunks_; }

 private:
  std::unique_ptr<httplib::Client> client_;
  std::atomic<bool> hang_up_{false};
  std::atomic<int> chunks_{0};
  std::thread thread_;
};

}  // namespace

TEST(HttpServer, FullQueueIs503) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), server_options(/*max_seqs=*/1, /*max_queue=*/1));
  const json endless = {{"prompt", {5, 6, 7}}, {"max_tokens", 4000}, {"ignore_eos", true}};
  HangingStream a(s, endless);
  ASSERT_TRUE(s.wait_health([](const json& h) { return h["running"] == 1; })) << s.health().dump();
  HangingStream b(s, endless);
  ASSERT_TRUE(s.wait_health([](const json& h) { return h["queued"] == 1; })) << s.health().dump();
  auto r = s.client()->Post("/v1/completions", R"({"prompt": [5], "max_tokens": 1})",
                            "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  const auto j = json::parse(r->body);
  EXPECT_EQ(j["error"]["type"], "server_error");
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("retry later"));
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  a.hang_up();
  b.hang_up();
  EXPECT_TRUE(s.wait_health([](const json& h) {
    return h["running"] == 0 && h["queued"] == 0 && h["free_cache_tokens"] == h["cache_tokens"];
  })) << s.health().dump();
  EXPECT_EQ(s.health()["cancelled"], 2);
}

TEST(HttpServer, DisconnectMidStreamDropsTheSequence) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  const auto model = tiny_model(conf);
  LiveServer s(model, server_options());
  {
    HangingStream h(s, {{"prompt", {9, 10, 11, 12}}, {"max_tokens", 4000}, {"ignore_eos", true}});
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (h.chunks() < 3 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_GE(h.chunks(), 3);
    EXPECT_LT(s.health()["free_cache_tokens"], s.health()["cache_tokens"]);
    h.hang_up();
  }
  EXPECT_TRUE(s.wait_health([](const json& h) {
    return h["running"] == 0 && h["free_cache_tokens"] == h["cache_tokens"];
  })) << s.health().dump();
  const auto h = s.health();
  EXPECT_EQ(h["cancelled"], 1);
  EXPECT_EQ(h["completed"], 0);  // it was dropped, not run to its 4000 tokens
  // The server carries on.
  const auto [status, j] =
      server_post(s, "/v1/completions", R"({"prompt": [5, 6], "max_tokens": 3, "temperature": 0})");
  EXPECT_EQ(status, 200) << j.dump();
}
