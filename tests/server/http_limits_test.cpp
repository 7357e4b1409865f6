// The server against hostile or careless clients, over raw loopback sockets (every wait bounded):
// a max_tokens near 2^63, clients that trickle or hold sockets, chunked bodies over the limit, a
// connection cap, a burst of connects, a negative Content-Length, pipelined requests, and
// sampling fields that must be honoured or refused.

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "raw_socket.hpp"
#include "server_test_util.hpp"
#include "test_support.hpp"

using namespace exl3;
using namespace exl3::server;
using namespace exl3::server::test;
using nlohmann::json;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

namespace {

ServerOptions limits_options() {
  return small_server_options(4, 8);
}

using Raw = RawSocket;

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return -1;
  return std::stoi(response.substr(9, 3));
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

std::string post_bytes(const std::string& body, const std::string& path = "/v1/completions") {
  return "POST " + path +
         " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::pair<int, json> limits_post(const LiveServer& s, const std::string& body) {
  auto r = s.client()->Post("/v1/completions", body, "application/json");
  if (!r) return {-1, nullptr};
  return {r->status, json::parse(r->body, nullptr, false)};
}

bool health_ok_within(const LiveServer& s, double seconds) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", s.port());
  const auto secs = static_cast<time_t>(seconds);
  c->set_connection_timeout(secs, 0);
  c->set_read_timeout(secs, 0);
  const auto t0 = Clock::now();
  auto r = c->Get("/health");
  return r && r->status == 200 && Clock::now() - t0 < std::chrono::duration<double>(seconds);
}

}  // namespace

TEST(HttpLimits, MaxTokensNearTwoToThe63Is400) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), limits_options());
  for (const char* v : {"9223372036854775807", "9223372036854775808", "18446744073709551615",
                        "9223372036854775000"}) {
    const auto t0 = Clock::now();
    const auto [status, j] =
        limits_post(s, std::string(R"({"prompt": [5, 6, 7], "max_tokens": )") + v + "}");
    EXPECT_EQ(status, 400) << v << ": " << j.dump();
    EXPECT_EQ(j["error"]["code"], "context_length_exceeded") << v;
    EXPECT_EQ(j["error"]["param"], "max_tokens") << v;
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5)) << v;
  }
  EXPECT_EQ(s.health()["running"], 0);
  EXPECT_EQ(s.health()["steps"], 0);  // nothing was generated
}

TEST(HttpLimits, TricklingClientsDoNotStarveOthers) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto o = limits_options();
  o.http.threads = 2;
  LiveServer s(tiny_model(conf), o);
  // Far more trickling clients than handler threads, each holding a request half-sent.
  std::vector<std::unique_ptr<Raw>> slow;
  for (int i = 0; i < 96; ++i) {
    slow.push_back(std::make_unique<Raw>(s.port()));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->send("POST /v1/completions HTTP/1.1\r\nHo"));
  }
  EXPECT_TRUE(health_ok_within(s, 2.0));
  const auto [status, j] = limits_post(s, R"({"prompt": [5, 6], "max_tokens": 2})");
  EXPECT_EQ(status, 200) << j.dump();
  EXPECT_GE(s.health()["connections"].get<int>(), 96);
}

TEST(HttpLimits, ARequestMustArriveWithinTheReadTimeout) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto o = limits_options();
  o.http.read_timeout = std::chrono::milliseconds(800);
  LiveServer s(tiny_model(conf), o);
  Raw trickle(s.port());
  ASSERT_TRUE(trickle.connected());
  // One header byte every 100 ms (each well inside any per-read timeout) is cut at the deadline.
  const std::string head =
      "GET /health HTTP/1.1\r\nHost: localhost\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
  const auto t0 = Clock::now();
  bool cut = false;
  for (char ch : head) {
    if (!trickle.send(std::string(1, ch))) {
      cut = true;
      break;
    }
    const auto got = trickle.read_until([](const std::string& g) { return !g.empty(); }, 0.1);
    if (!got.empty() || trickle.eof()) {
      cut = true;
      break;
    }
  }
  trickle.read_all(2.0);
  EXPECT_TRUE(cut);
  EXPECT_TRUE(trickle.eof());  // closed at the deadline, with no answer
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  // An idle connection (nothing sent) is closed quietly at the same deadline.
  Raw idle(s.port());
  idle.read_all(2.5);
  EXPECT_TRUE(idle.eof());
  EXPECT_TRUE(health_ok_within(s, 2.0));
}

TEST(HttpLimits, ChunkedBodyOverTheLimitIs413) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), limits_options());  // 64 KiB bodies
  Raw c(s.port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(
      c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Transfer-Encoding: chunked\r\n\r\n"));
  // 32 MiB in 16 KiB chunks: the server must stop reading long before the end.
  const std::string piece(16384, 'a');
  char hex[16];
  std::snprintf(hex, sizeof hex, "%zx\r\n", piece.size());
  size_t sent = 0;
  for (int i = 0; i < 2048; ++i) {
    if (!c.send(hex + piece + "\r\n")) break;
    sent += piece.size();
    if (!c.read_until([](const std::string& g) { return !g.empty(); }, 0.0).empty()) break;
  }
  const auto got = c.read_all(3.0);
  EXPECT_EQ(status_of(got), 413) << got.substr(0, 200);
  EXPECT_THAT(got, HasSubstr("65536 bytes"));
  EXPECT_LT(sent, size_t{32} << 20);
  EXPECT_TRUE(health_ok_within(s, 2.0));
}

TEST(HttpLimits, ConnectionsOverTheCapGetAnImmediate503) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  auto o = limits_options();
  o.http.max_connections = 8;
  LiveServer s(tiny_model(conf), o);
  std::vector<std::unique_ptr<Raw>> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(std::make_unique<Raw>(s.port()));
    ASSERT_TRUE(held.back()->connected());
  }
  // Give the server a moment to have accepted all eight.
  const auto end = Clock::now() + std::chrono::seconds(2);
  std::string got;
  while (Clock::now() < end) {
    Raw extra(s.port());
    ASSERT_TRUE(extra.connected());
    extra.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    got = extra.read_all(1.0);
    if (status_of(got) == 503) break;
  }
  EXPECT_EQ(status_of(got), 503) << got;
  EXPECT_THAT(got, HasSubstr("Retry-After: 1"));
  EXPECT_THAT(got, HasSubstr("8 open connections"));
  held.clear();
  EXPECT_TRUE(s.wait_health([](const json& h) { return h["connections"].get<int>() <= 1; }, 5.0));
}

TEST(HttpLimits, ABurstOfConnectsIsAnsweredNotReset) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), limits_options());
  constexpr int kClients = 128;
  std::atomic<int> answered{0}, failed{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int i = 0; i < kClients; ++i) {
    ts.emplace_back([&] {
      while (!go) std::this_thread::yield();
      Raw c(s.port());
      if (!c.connected() ||
          !c.send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) {
        ++failed;
        return;
      }
      const auto got = c.read_all(10.0);
      (status_of(got) == 200 ? answered : failed)++;
    });
  }
  go = true;
  for (auto& t : ts) t.join();
  EXPECT_EQ(answered, kClients);
  EXPECT_EQ(failed, 0);
}

TEST(HttpLimits, NegativeContentLengthIsAnImmediate400) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), limits_options());
  Raw c(s.port());
  ASSERT_TRUE(c.connected());
  const auto t0 = Clock::now();
  ASSERT_TRUE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"));
  const auto got = c.read_all(3.0);
  EXPECT_EQ(status_of(got), 400) << got;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1));
}

TEST(HttpLimits, PipelinedRequestsAreAllAnsweredInOrder) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), limits_options());
  Raw c(s.port());
  ASSERT_TRUE(c.connected());
  const std::string a = post_bytes(R"({"prompt": [5, 6], "max_tokens": 2, "temperature": 0})");
  const std::string b = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string last = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_TRUE(c.send(a + b + a + last));
  const auto got = c.read_all(10.0);
  EXPECT_EQ(count(got, "HTTP/1.1 200"), 4u) << got;
  const auto first = got.find("text_completion"), models = got.find("\"list\""),
             second = got.find("text_completion", first + 1), health = got.find("\"status\"");
  ASSERT_NE(first, std::string::npos);
  ASSERT_NE(models, std::string::npos);
  ASSERT_NE(second, std::string::npos);
  ASSERT_NE(health, std::string::npos);
  EXPECT_LT(first, models);
  EXPECT_LT(models, second);
  EXPECT_LT(second, health);
  EXPECT_TRUE(c.eof());  // Connection: close was honoured
}

TEST(HttpLimits, SamplingFieldsAreHonouredOrRefused) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), limits_options());
  // temperature far beyond a float: the error names the field and does not say "inf".
  auto [status, j] = limits_post(s, R"({"prompt": [5, 6], "max_tokens": 2, "temperature": 1e308})");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_THAT(j["error"]["message"].get<std::string>(), ::testing::Not(HasSubstr("inf")));
  for (const char* bad :
       {R"("top_k": -2)", R"("min_p": 1.5)", R"("repetition_penalty": 0)",
        R"("tool_choice": "required")", R"("tool_choice": "auto")", R"("min_tokens": 3)"}) {
    std::tie(status, j) =
        limits_post(s, std::string(R"({"prompt": [5, 6], "max_tokens": 2, )") + bad + "}");
    EXPECT_EQ(status, 400) << bad << ": " << j.dump();
  }
  // top_k 1 is greedy whatever the temperature; min_p 1 keeps only the most likely token too.
  std::tie(status, j) = limits_post(
      s, R"({"prompt": [9, 10, 11], "max_tokens": 6, "temperature": 0, "ignore_eos": true})");
  ASSERT_EQ(status, 200) << j.dump();
  const std::string greedy = j["choices"][0]["text"];
  for (const char* same : {R"("top_k": 1)", R"("min_p": 1.0)"}) {
    for (int seed = 1; seed <= 3; ++seed) {
      std::tie(status, j) = limits_post(
          s, std::string(R"({"prompt": [9, 10, 11], "max_tokens": 6, "temperature": 5, )") +
                 R"("ignore_eos": true, "seed": )" + std::to_string(seed) + ", " + same + "}");
      ASSERT_EQ(status, 200) << same << ": " << j.dump();
      EXPECT_EQ(j["choices"][0]["text"], greedy) << same << " seed " << seed;
    }
  }
  // A strong repetition penalty changes a greedy answer that repeats tokens of its prompt.
  std::tie(status, j) = limits_post(
      s, R"({"prompt": [9, 10, 11], "max_tokens": 6, "temperature": 0, "ignore_eos": true,
                                   "repetition_penalty": 1.0, "tool_choice": "none", "top_k": -1})");
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], greedy);
}
