// `exl3 serve` through the binary: --help teaches, and a real process on a free port answers
// /health and a completion (a repeated prompt taken from the prefix cache, on by default), then
// drains on SIGTERM (the running request finishes, new ones get 503) and exits 0.
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"

extern char** environ;

using exl3::test::run_cli;
using nlohmann::json;
using ::testing::HasSubstr;

TEST(ServeCli, HelpTeaches) {
  EXPECT_THAT(run_cli("--help").out, HasSubstr("serve"));
  const auto h = run_cli("serve --help");
  EXPECT_EQ(h.code, 0);
  for (const char* s : {"MODEL", "--host", "--port", "--device", "--max-seqs", "--max-queue",
                        "--cache-tokens", "--model-name", "--chat-format", "Examples:", "curl",
                        "/v1/chat/completions", "503", "SIGTERM", "--draft", "--draft-tokens",
                        "--draft-fixed", "--prefix-cache", "--no-prefix-cache"}) {
    EXPECT_THAT(h.out, HasSubstr(s));
  }
  EXPECT_THAT(h.out, HasSubstr("--preemption off reserves prompt + max_tokens"));
}

TEST(ServeCli, BadModelFailsWithAMessage) {
  exl3::test::TempDir tmp;
  const auto r = run_cli("serve " + exl3::test::shell_quote(tmp.path()) + " --port 0");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("exl3: error:"));
  // --draft-tokens and --draft-fixed need --draft.
  EXPECT_NE(run_cli("serve " + exl3::test::shell_quote(tmp.path()) + " --draft-tokens 3").code, 0);
  EXPECT_NE(run_cli("serve " + exl3::test::shell_quote(tmp.path()) + " --draft-fixed").code, 0);
}

TEST(ServeCli, ServesAndStopsOnSigterm) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  const std::string model = (conf / "models" / "tiny-qwen3moe-exl3").string();
  const char* override_path = std::getenv("EXL3_CLI");
  const std::string bin =
      override_path != nullptr && *override_path != '\0' ? override_path : EXL3_CLI_PATH;
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  // The model as its own draft: speculative rounds behind the same API (/health reports them).
  std::string a0 = bin, a1 = "--threads", a2 = "2", a3 = "serve", a4 = model, a5 = "--port",
              a6 = "0", a7 = "--model-name", a8 = "tiny", a9 = "--quiet", a10 = "--draft",
              a11 = model;
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(),  a4.data(),  a5.data(), a6.data(),
                  a7.data(), a8.data(), a9.data(), a10.data(), a11.data(), nullptr};
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);

  // Read stdout until the URL line (bounded by a deadline via non-blocking polls).
  std::string text;
  int port = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (port < 0 && std::chrono::steady_clock::now() < deadline) {
    fd_set set;
    FD_ZERO(&set);
    FD_SET(out[0], &set);
    timeval tv{0, 100000};
    if (select(out[0] + 1, &set, nullptr, nullptr, &tv) > 0) {
      char buf[512];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
      const auto at = text.find("listening on http://127.0.0.1:");
      if (at != std::string::npos && text.find('\n', at) != std::string::npos) {
        port = std::atoi(text.c_str() + at + std::string("listening on http://127.0.0.1:").size());
      }
    }
  }
  auto finish = [&] {
    kill(pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 200; ++i) {
      if (waitpid(pid, &status, WNOHANG) == pid) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    ADD_FAILURE() << "exl3 serve did not stop within 10 s of SIGTERM";
    return status;
  };
  if (port <= 0) {
    finish();
    close(out[0]);
    FAIL() << "no URL printed; output: " << text;
  }
  EXPECT_THAT(text, HasSubstr("try: curl"));
  EXPECT_THAT(text, HasSubstr("prefix cache on"));
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(20, 0);
  EXPECT_THAT(text, HasSubstr("draft: " + model));
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(json::parse(h->body)["model"], "tiny");
  EXPECT_EQ(json::parse(h->body)["speculative"]["draft_tokens"], 4);
  auto r = c.Post("/v1/completions", R"({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  // The prefix cache is on by default: a second request with the same 70-token prompt takes its
  // first two full pages (32 tokens each) from the cache.
  json ids = json::array();
  for (int i = 0; i < 70; ++i) ids.push_back(5 + i);
  const std::string again = json{{"prompt", ids}, {"max_tokens", 1}}.dump();
  for (int i = 0; i < 2; ++i) {
    auto p = c.Post("/v1/completions", again, "application/json");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->status, 200) << p->body;
  }
  h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_GE(json::parse(h->body)["prefix_cache_hit_tokens"].get<int64_t>(), 64) << h->body;

  // SIGTERM drains: a request running at that moment still completes, a new one gets 503, and
  // the process exits once idle.
  int long_status = -1;
  std::string long_finish;
  std::thread long_request([&] {
    httplib::Client lc("127.0.0.1", port);
    lc.set_read_timeout(60, 0);
    auto lr = lc.Post(
        "/v1/completions",
        R"({"prompt": [5, 6, 7], "max_tokens": 2000, "ignore_eos": true, "temperature": 0})",
        "application/json");
    if (lr) {
      long_status = lr->status;
      long_finish = json::parse(lr->body, nullptr, false).value("choices", json::array()).dump();
    }
  });
  bool running = false;
  for (int i = 0; i < 400 && !running; ++i) {
    auto hh = c.Get("/health");
    running = hh && json::parse(hh->body)["running"] == 1;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(running);
  kill(pid, SIGTERM);
  // Until the signal is handled (the watcher looks every 100 ms) a probe may still be served.
  bool refused = false;
  int served = 0;
  for (int i = 0; i < 200 && !refused; ++i) {
    auto nr = c.Post("/v1/completions", R"({"prompt": [5], "max_tokens": 1})", "application/json");
    refused = nr && nr->status == 503 && nr->body.find("server_shutting_down") != std::string::npos;
    if (nr && nr->status == 200) ++served;
    if (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(refused) << "no 503 while draining";
  long_request.join();
  EXPECT_EQ(long_status, 200);
  EXPECT_THAT(long_finish, HasSubstr("length"));

  const int status = finish();  // already exiting; a second SIGTERM would only stop it sooner
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  char buf[512];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(out[0]);
  // The first completion, the two with the repeated prompt, the long one and any probes served.
  EXPECT_THAT(text, HasSubstr("exl3 serve: stopped (" + std::to_string(4 + served) + " completed"));
}
