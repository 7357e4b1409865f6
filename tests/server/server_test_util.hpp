// Helpers for the server tests: a real HttpServer on 127.0.0.1 (any free port) over the
// conformance model, an httplib client with timeouts on every call, and a server-sent-event
// reader.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/server/http_server.hpp"
#include "exl3/server/scheduler.hpp"
#include "exl3/text/stop_tokens.hpp"
#include "exl3/text/tokenizer.hpp"

namespace exl3::server::test {

// Server options for the tests: a model named "tiny", `max_seqs` / `max_queue`, prefill chunks
// of 64 tokens and 64 KiB bodies.
inline ServerOptions small_server_options(int max_seqs = 4, int max_queue = 8) {
  ServerOptions o;
  o.model_name = "tiny";
  o.scheduler.max_seqs = max_seqs;
  o.scheduler.max_queue = max_queue;
  o.scheduler.step_tokens = 64;
  o.http.max_body_bytes = 64 * 1024;
  return o;
}

inline std::filesystem::path tiny_model(const std::filesystem::path& conformance) {
  return conformance / "models" / "tiny-qwen3moe-exl3";
}

// What a scheduler request streamed until it finished.
struct Done {
  std::string text;
  std::vector<int32_t> tokens;
  StreamUpdate last;
};

// Reads `s` until it finishes (a test failure after `seconds`).
inline Done drain(const std::shared_ptr<RequestStream>& s, double seconds = 60.0) {
  Done d;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    auto u = s->wait(std::chrono::milliseconds(50));
    d.text += u.text;
    d.tokens.insert(d.tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.finished) {
      d.last = u;
      return d;
    }
  }
  ADD_FAILURE() << "request did not finish in " << seconds << " s";
  return d;
}

// n ordinary ids of a `vocab`-token vocabulary whose first three are special (the conformance
// model's 512, by default).
inline std::vector<int32_t> random_prompt(std::mt19937_64& rng, size_t n, int vocab = 512) {
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % static_cast<uint64_t>(vocab - 3));
  return p;
}

// Six requests whose prompts and max_tokens (44..74 tokens each) together need 2-3x a 160-token
// pool: the first three ignore stop tokens, the rest stop at `stops` (none when empty), so at
// least three run at once until they cannot all grow (the preemption tests).
inline std::vector<GenerationRequest> overflowing_requests(std::mt19937_64& rng,
                                                           const std::vector<int32_t>& stops) {
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest g;
    g.prompt = random_prompt(rng, 4 + rng() % 16);
    g.max_tokens = 40 + static_cast<int64_t>(rng() % 16);
    if (i >= 3) g.stop_tokens = stops;
    rs.push_back(std::move(g));
  }
  return rs;
}

// A scheduler at rest: both KV pools (the draft's is 0 of 0 without one) wholly free, nothing
// running or queued.
inline void expect_drained_pools(const SchedulerStats& s, const std::string& what) {
  EXPECT_EQ(s.free_cache_tokens, s.cache_tokens) << what;
  EXPECT_EQ(s.draft_free_cache_tokens, s.draft_cache_tokens) << what;
  EXPECT_EQ(s.running, 0) << what;
  EXPECT_EQ(s.queued, 0) << what;
}

// The engine device of LiveServer: the CPU, or what EXL3_SERVER_TEST_DEVICE names (`cuda` runs
// the load and fault suite, whose checks hold on any engine, on the GPU: bench/device_env.sh).
inline runtime::Device server_test_device() {
  const char* d = std::getenv("EXL3_SERVER_TEST_DEVICE");
  return d != nullptr && *d != '\0' ? runtime::parse_device(d) : runtime::Device::kCpu;
}

// One server on its own engine, serving from a background thread until destroyed.
class LiveServer {
 public:
  // `draft`: a draft model folder for speculative decoding (its engine made here).
  LiveServer(const std::filesystem::path& model, ServerOptions opts, int64_t cache_tokens = 4096,
             const std::filesystem::path& draft = {})
      : tok_(Tokenizer::load(model)) {
    runtime::EngineOptions eo;
    eo.cache_tokens = cache_tokens;
    eo.device = server_test_device();
    engine_ = runtime::load_engine(model, eo);
    if (!draft.empty()) {
      draft_ = runtime::load_engine(draft, eo);
      opts.scheduler.draft = draft_.get();
    }
    if (opts.stop_tokens.empty())
      opts.stop_tokens = model_stop_tokens(model, engine_->spec().eos_token_ids, tok_);
    opts_ = opts;
    server_ = std::make_unique<HttpServer>(*engine_, tok_, opts);
    port_ = server_->bind("127.0.0.1", 0);
    thread_ = std::thread([this] { server_->run(); });
  }
  ~LiveServer() {
    server_->stop();
    thread_.join();
  }

  int port() const { return port_; }
  HttpServer& server() { return *server_; }
  const Tokenizer& tokenizer() const { return tok_; }
  const ServerOptions& options() const { return opts_; }

  std::unique_ptr<httplib::Client> client(int read_timeout_s = 20) const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_connection_timeout(2, 0);
    c->set_read_timeout(read_timeout_s, 0);
    c->set_write_timeout(5, 0);
    return c;
  }

  nlohmann::json health() const {
    auto r = client()->Get("/health");
    if (!r || r->status != 200) return {};
    return nlohmann::json::parse(r->body);
  }

  // Polls /health until pred holds (true) or `seconds` pass (false).
  bool wait_health(const std::function<bool(const nlohmann::json&)>& pred,
                   double seconds = 10.0) const {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      const auto h = health();
      if (!h.is_null() && pred(h)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  Tokenizer tok_;
  std::unique_ptr<runtime::Engine> engine_, draft_;
  ServerOptions opts_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::thread thread_;
};

// The `data:` payloads of a server-sent-event body, in order (comments skipped).
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(pos, end - pos);
    if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

// The reference: runtime::generate on a separate engine, what a greedy request must return.
struct Reference {
  std::vector<int32_t> tokens;
  bool stopped = false;  // ended at a stop token (it counts as a completion token)
};
inline Reference reference_generate(const std::filesystem::path& model,
                                    const std::vector<int32_t>& prompt, int64_t max_tokens,
                                    const std::vector<int32_t>& stops) {
  auto engine = runtime::load_engine(model);
  runtime::GenerateOptions go;
  go.max_new_tokens = max_tokens;
  go.stop_tokens = stops;
  const auto r = runtime::generate(*engine, prompt, go);
  return {r.tokens, r.stop_reason == "stop_token"};
}

}  // namespace exl3::server::test
