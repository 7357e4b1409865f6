// Operating the server: the API key, request ids in responses and logs, and the graceful drain
// (new requests refused while running ones finish), on the real server over loopback.
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/server/http_server.hpp"
#include "server_test_util.hpp"
#include "test_support.hpp"

using namespace exl3;
using namespace exl3::server;
using namespace exl3::server::test;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

ServerOptions ops_options() {
  ServerOptions o;
  o.model_name = "tiny";
  o.scheduler.max_seqs = 4;
  o.scheduler.max_queue = 8;
  return o;
}

constexpr const char* kBody = R"({"prompt": [5, 6], "max_tokens": 2})";

}  // namespace

TEST(HttpOps, ApiKeyGuardsV1AndLeavesHealthOpen) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto o = ops_options();
  o.api_key = "sekrit-123";
  LiveServer s(tiny_model(conf), o);
  auto c = s.client();
  auto r = c->Post("/v1/completions", kBody, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  for (const char* wrong :
       {"Bearer sekrit-12", "Bearer sekrit-1234", "sekrit-123", "Bearer SEKRIT-123", "Basic x"}) {
    r = c->Post("/v1/completions", httplib::Headers{{"Authorization", wrong}}, kBody,
                "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << wrong;
  }
  r = c->Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = c->Post("/v1/completions", httplib::Headers{{"Authorization", "Bearer sekrit-123"}}, kBody,
              "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(s.health()["status"], "ok");  // no key needed
}

TEST(HttpOps, EveryResponseCarriesTheRequestIdTheLogNames) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto o = ops_options();
  std::mutex mu;
  std::vector<std::string> lines;
  o.log = [&](const std::string& line) {
    std::lock_guard lk(mu);
    lines.push_back(line);
  };
  LiveServer s(tiny_model(conf), o);
  auto c = s.client();
  // A usable client id comes back as given; an unusable one is replaced.
  auto r = c->Post("/v1/completions", httplib::Headers{{"X-Request-Id", "trace-42.a:b_c"}}, kBody,
                   "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "trace-42.a:b_c");
  r = c->Get("/health", httplib::Headers{{"X-Request-Id", "has space"}});
  ASSERT_TRUE(r);
  const std::string made = r->get_header_value("X-Request-Id");
  EXPECT_THAT(made, ::testing::StartsWith("req-"));
  r = c->Get("/nowhere");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  const std::string other = r->get_header_value("X-Request-Id");
  EXPECT_THAT(other, ::testing::StartsWith("req-"));
  EXPECT_NE(other, made);
  // The access log line follows the response; give it a moment.
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard lk(mu);
      if (lines.size() >= 3) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard lk(mu);
  ASSERT_EQ(lines.size(), 3u);
  // Each request came on its own connection, so the lines may be in any order.
  auto line_with = [&](const std::string& id) {
    for (const auto& l : lines) {
      if (l.find(id) != std::string::npos) return l;
    }
    return std::string("<no line names ") + id + ">";
  };
  EXPECT_THAT(line_with("trace-42.a:b_c"), HasSubstr("POST /v1/completions 200"));
  EXPECT_THAT(line_with(made), HasSubstr("GET /health 200"));
  EXPECT_THAT(line_with(other), HasSubstr("GET /nowhere 404"));
}

TEST(HttpOps, DrainRefusesNewRequestsAndFinishesRunningOnes) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), ops_options());
  EXPECT_TRUE(s.server().idle());
  std::atomic<int> status{-1};
  std::string finish;
  std::thread long_request([&] {
    auto r = s.client(60)->Post("/v1/completions",
                                R"({"prompt": [5, 6, 7], "max_tokens": 1500, "ignore_eos": true})",
                                "application/json");
    if (r) {
      finish = json::parse(r->body)["choices"][0]["finish_reason"].get<std::string>();
      status = r->status;
    }
  });
  ASSERT_TRUE(s.wait_health([](const json& h) { return h["running"] == 1; }));
  s.server().begin_drain();
  EXPECT_FALSE(s.server().idle());
  EXPECT_EQ(s.health()["status"], "draining");
  auto r = s.client()->Post("/v1/completions", kBody, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "server_shutting_down");
  long_request.join();
  EXPECT_EQ(status, 200);
  EXPECT_EQ(finish, "length");
  EXPECT_TRUE(s.server().idle());
}

namespace {

// The value of one sample line `name{labels} value` (or `name value`) of a Prometheus body.
double sample(const std::string& body, const std::string& series) {
  const auto at = body.find("\n" + series + " ");
  if (at == std::string::npos) return -1.0;
  return std::stod(body.substr(at + series.size() + 2));
}

}  // namespace

TEST(HttpOps, MetricsCountRequestsTokensAndLatencies) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), ops_options());
  auto c = s.client();
  auto r =
      c->Post("/v1/completions", R"({"prompt": [5, 6, 7], "max_tokens": 5, "ignore_eos": true})",
              "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  r = c->Post("/v1/completions", R"({"prompt": [9, 10], "max_tokens": 3, "ignore_eos": true})",
              "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  ASSERT_TRUE(s.wait_health([](const json& h) { return h["completed"] == 2; }));
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_THAT(m->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  const std::string b = "\n" + m->body;
  EXPECT_EQ(sample(b, "exl3_requests_total{outcome=\"completed\"}"), 2.0);
  EXPECT_EQ(sample(b, "exl3_requests_running"), 0.0);
  EXPECT_EQ(sample(b, "exl3_prompt_tokens_total"), 5.0);
  EXPECT_EQ(sample(b, "exl3_generation_tokens_total"), 8.0);
  EXPECT_EQ(sample(b, "exl3_preemptions_total"), 0.0);  // a 4096-token cache holds both
  // One first token per request, the other tokens are gaps; +Inf equals the count.
  EXPECT_EQ(sample(b, "exl3_time_to_first_token_seconds_count"), 2.0);
  EXPECT_EQ(sample(b, "exl3_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 2.0);
  EXPECT_EQ(sample(b, "exl3_inter_token_latency_seconds_count"), 6.0);
  EXPECT_GT(sample(b, "exl3_inter_token_latency_seconds_sum"), 0.0);
  EXPECT_EQ(sample(b, "exl3_kv_cache_usage_ratio"), 0.0);
  EXPECT_GE(sample(b, "exl3_http_connections"), 1.0);
  EXPECT_THAT(b, HasSubstr("# TYPE exl3_time_to_first_token_seconds histogram"));
  // Buckets are cumulative: never decreasing.
  double last = 0.0;
  for (size_t at = b.find("exl3_inter_token_latency_seconds_bucket"); at != std::string::npos;
       at = b.find("exl3_inter_token_latency_seconds_bucket", at + 1)) {
    const double v = std::stod(b.substr(b.find(' ', at) + 1));
    EXPECT_GE(v, last);
    last = v;
  }
  EXPECT_EQ(last, 6.0);
}
