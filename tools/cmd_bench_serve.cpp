// `exl3 bench serve`: the OpenAI server under load, end to end. The model is loaded, the real
// HTTP server (src/server) starts in this process on a loopback port, and client threads stream
// completions over plain sockets at each concurrency level, timing every streamed chunk as it
// arrives: time to first token, the gaps between chunks (inter-token latency, measured as
// serving benchmarks measure it, per streamed chunk), output tokens/s and requests/s, and the
// prefix-cache hits the server counted. With --prefix-cache both, the run is repeated on a
// second engine with the cache on.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "env_options.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/server/http_server.hpp"
#include "exl3/text/stop_tokens.hpp"
#include "exl3/text/tokenizer.hpp"
#include "kv_cache_option.hpp"
#include "tp_option.hpp"

#ifndef EXL3_GIT_REVISION
#define EXL3_GIT_REVISION ""
#endif

namespace exl3::cli {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double secs(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// What one streamed request measured.
struct StreamTiming {
  bool ok = false;
  std::string error;              // why it failed (HTTP status, an error event, a timeout)
  double ttft = 0.0;              // send to the first chunk with text, seconds
  std::vector<double> gaps;       // between consecutive chunks with text, seconds
  double total = 0.0;             // send to [DONE]
  int64_t completion_tokens = 0;  // the usage chunk's
  int64_t prompt_tokens = 0;
};

// Streams one completion over a fresh loopback connection and times its chunks.
StreamTiming stream_completion(int port, const std::string& body, double timeout_s) {
  StreamTiming t;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    t.error = "socket() failed";
    return t;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const auto t0 = Clock::now();
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nConnection: close\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  bool sent = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  for (size_t off = 0; sent && off < req.size();) {
    const ssize_t n = ::send(fd, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n <= 0)
      sent = false;
    else
      off += static_cast<size_t>(n);
  }
  if (!sent) {
    ::close(fd);
    t.error = "could not send the request";
    return t;
  }
  // The raw bytes, the body de-chunked so far, and how far each has been consumed.
  std::string raw, events;
  size_t raw_pos = 0, ev_pos = 0;
  bool head_done = false, chunked = false, done = false;
  std::optional<Clock::time_point> last;
  const auto deadline = t0 + std::chrono::duration<double>(timeout_s);
  char buf[16384];
  while (!done) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      t.error = "timed out";
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      t.error = "the server closed the connection before [DONE]";
      break;
    }
    const auto now = Clock::now();
    raw.append(buf, static_cast<size_t>(n));
    if (!head_done) {
      const auto he = raw.find("\r\n\r\n");
      if (he == std::string::npos) continue;
      const int status = raw.size() >= 12 ? std::atoi(raw.c_str() + 9) : 0;
      if (status != 200) {
        t.error = fmt::format("HTTP {}", status);
        break;
      }
      std::string head = raw.substr(0, he);
      std::transform(head.begin(), head.end(), head.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      chunked = head.find("transfer-encoding: chunked") != std::string::npos;
      head_done = true;
      raw_pos = he + 4;
    }
    if (chunked) {
      while (true) {
        const auto eol = raw.find("\r\n", raw_pos);
        if (eol == std::string::npos) break;
        const size_t len = std::strtoul(raw.c_str() + raw_pos, nullptr, 16);
        if (eol + 2 + len + 2 > raw.size()) break;
        events.append(raw, eol + 2, len);
        raw_pos = eol + 2 + len + 2;
        if (len == 0) break;
      }
    } else {
      events.append(raw, raw_pos, std::string::npos);
      raw_pos = raw.size();
    }
    for (auto end = events.find("\n\n", ev_pos); end != std::string::npos;
         end = events.find("\n\n", ev_pos)) {
      const std::string ev = events.substr(ev_pos, end - ev_pos);
      ev_pos = end + 2;
      if (ev.rfind("data: ", 0) != 0) continue;  // keep-alive comments
      const std::string data = ev.substr(6);
      if (data == "[DONE]") {
        done = true;
        break;
      }
      const auto j = json::parse(data, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        t.error = j["error"].value("message", "an error event");
        break;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        t.completion_tokens = j["usage"].value("completion_tokens", int64_t{0});
        t.prompt_tokens = j["usage"].value("prompt_tokens", int64_t{0});
      }
      if (!j.contains("choices") || j["choices"].empty()) continue;
      if (j["choices"][0].value("text", std::string()).empty()) continue;
      if (!last) {
        t.ttft = secs(now - t0);
      } else {
        t.gaps.push_back(secs(now - *last));
      }
      last = now;
    }
    if (!t.error.empty()) break;
  }
  ::close(fd);
  t.total = secs(Clock::now() - t0);
  t.ok = done && t.error.empty();
  return t;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double at = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(at));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

struct Level {
  int concurrency = 0;
  int requests = 0;
  int completed = 0;
  int64_t prompt_tokens = 0, output_tokens = 0, prefix_hit_tokens = 0;
  double wall = 0.0;
  std::vector<double> ttft, itl;
  json to_json() const {
    return {
        {"concurrency", concurrency},
        {"requests", requests},
        {"completed", completed},
        {"prompt_tokens", prompt_tokens},
        {"output_tokens", output_tokens},
        {"prefix_hit_tokens", prefix_hit_tokens},
        {"wall_seconds", wall},
        {"ttft_ms", {{"p50", 1e3 * percentile(ttft, 0.5)}, {"p99", 1e3 * percentile(ttft, 0.99)}}},
        {"itl_ms", {{"p50", 1e3 * percentile(itl, 0.5)}, {"p99", 1e3 * percentile(itl, 0.99)}}},
        {"output_tokens_per_second", static_cast<double>(output_tokens) / wall},
        {"requests_per_second", static_cast<double>(completed) / wall}};
  }
};

}  // namespace

Runner add_bench_serve(CLI::App& app, Common&) {
  struct Opts {
    std::string model, device = "cuda", prefix_cache = "both", json_path, kv_cache = "auto";
    std::vector<int> concurrency{1, 8, 64};
    int tp = 1, requests = 0;
    int64_t prompt_tokens = 512, max_tokens = 128, cache_tokens = 0, page_size = 32,
            step_tokens = 256;
    double shared_fraction = 0.75, timeout = 600.0;
    uint64_t seed = 0;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "EXL3 model folder (config.json, *.safetensors, tokenizer)")
      ->required();
  app.add_option("--device", o->device, "cuda or cpu")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  add_tp_option(app, o->tp);
  add_kv_cache_option(app, o->kv_cache);
  app.add_option("--concurrency", o->concurrency,
                 "Concurrency levels: streams in flight at once, each level run in turn")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--requests", o->requests,
                 "Requests per level (0: 4 x the level's concurrency, at least 8)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--prompt-tokens", o->prompt_tokens, "Prompt length of every request, in tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-tokens", o->max_tokens,
                 "Tokens generated per request (ignore_eos: every request generates them all)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--shared-fraction", o->shared_fraction,
                 "Share of each prompt that is a system prefix common to the level's requests "
                 "(what the prefix cache can reuse); the rest is random per request")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--prefix-cache", o->prefix_cache,
                 "Run with the server's prefix cache on, off, or both (two runs, each on a freshly "
                 "loaded engine)")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  app.add_option("--cache-tokens", o->cache_tokens,
                 "KV cache size in tokens (0: enough for the largest level's streams at once)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--page-size", o->page_size, "KV cache page size in tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--step-tokens", o->step_tokens,
                 "Tokens per batched forward step (the server's --step-tokens)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", o->seed, "Seed of the random prompt tokens")->capture_default_str();
  app.add_option("--timeout", o->timeout, "Seconds one request may take before the run fails")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--json", o->json_path,
                 "Also write the results as JSON to this file (model, options, per-level "
                 "figures, timestamp, git revision)");
  app.footer(
      "The server runs in this process on 127.0.0.1 (an ephemeral port) with --max-seqs and\n"
      "--max-queue set to the largest level, so no request is refused. Each level runs\n"
      "--requests streamed completions (token-id prompts, greedy, ignore_eos), the level's\n"
      "number of them in flight at once. Its prompts share a fresh random system prefix\n"
      "(--shared-fraction of --prompt-tokens), so a level never reuses another's cache. A\n"
      "warm-up request runs first.\n"
      "TTFT: request sent to the first streamed text. ITL: the gaps between streamed chunks with\n"
      "text. Output tok/s and requests/s: over the level's wall time. Prefix hits: prompt tokens\n"
      "the server took from its prefix cache instead of prefilling. Progress goes to stderr.\n\n"
      "Examples:\n"
      "  exl3 bench serve ./Qwen3-30B-A3B-exl3 --device cuda\n"
      "  exl3 bench serve ./m --concurrency 1,8,64 --prefix-cache both --json serve.json\n"
      "  exl3 bench serve ./m --device cpu --concurrency 1,2 --prompt-tokens 32 --max-tokens 8 "
      "--requests 4\n"
      "  exl3 bench serve ./m --shared-fraction 0.9 --prefix-cache on   # a long common system "
      "prompt\n\n"
      "Guide: docs/serve.md, \"exl3 bench serve\".");
  return [o] {
    int biggest = 0;
    for (const int c : o->concurrency) {
      if (c <= 0) fail("--concurrency {}: levels must be positive", c);
      biggest = std::max(biggest, c);
    }
    if (biggest == 0) fail("--concurrency: give at least one level, e.g. 1,8,64");
    const std::filesystem::path dir(o->model);
    const Checkpoint ckpt = Checkpoint::open(dir);
    const auto tok = Tokenizer::load(dir);
    const int64_t per_stream = o->prompt_tokens + o->max_tokens;
    // Ordinary (non-special) ids of the vocabulary, for random prompts: ids the tokenizer and
    // the model both have (a tokenizer may name more tokens than the model's embedding holds).
    const int64_t model_vocab = model::describe_model(ckpt).vocab_size;
    std::vector<int32_t> ordinary;
    for (int32_t id = 0; id < std::min<int64_t>(tok.vocab_size(), model_vocab); ++id) {
      if (!tok.is_special(id)) ordinary.push_back(id);
    }
    if (ordinary.empty()) {
      fail("the tokenizer of {} has no ordinary tokens below the model's vocabulary size {}",
           dir.string(), model_vocab);
    }
    // Refused before anything loads (with "both", the run with the cache off would come first).
    if (o->prefix_cache != "off" && o->tp > 1 && o->device == "cuda") {
      fail(
          "the prefix cache is not available with --device cuda --tp {} yet; hint: "
          "--prefix-cache off, or one GPU",
          o->tp);
    }
    const bool tty = ::isatty(2) != 0;
    std::vector<bool> modes;
    if (o->prefix_cache != "on") modes.push_back(false);
    if (o->prefix_cache != "off") modes.push_back(true);

    json runs = json::array();
    std::string arch;
    std::vector<std::pair<bool, std::vector<Level>>> results;
    for (const bool pc : modes) {
      runtime::EngineOptions eo;
      eo.load_progress = runtime::make_load_progress_printer(stderr, ::isatty(2) != 0);
      eo.device = runtime::parse_device(o->device);
      eo.tp = o->tp;
      eo.kv_format = kv_cache_format(o->kv_cache);
      eo.page_size = o->page_size;
      eo.prefix_cache = pc;
      // Gated DeltaNet models keep a state slot per running stream (as `exl3 serve` sizes it).
      eo.recurrent_slots = std::max(biggest, 1);
      // Every stream of the largest level at once, plus a page of slack each.
      eo.cache_tokens = o->cache_tokens > 0
                            ? o->cache_tokens
                            : static_cast<int64_t>(biggest) * (per_stream + 2 * o->page_size);
      engine_options_from_env(eo);
      fmt::print(stderr, "loading {} on {} (prefix cache {}) ...\n", dir.string(), o->device,
                 pc ? "on" : "off");
      auto engine = runtime::load_engine(ckpt, eo);
      arch = std::string(runtime::architecture_name(engine->spec().architecture));
      server::ServerOptions so;
      so.model_name = "bench";
      so.stop_tokens = model_stop_tokens(dir, engine->spec().eos_token_ids, tok);
      so.scheduler.max_seqs = biggest;
      so.scheduler.max_queue = biggest;
      so.scheduler.step_tokens = o->step_tokens;
      so.http.max_connections = std::max(64, 2 * biggest + 8);
      so.http.write_timeout = std::chrono::milliseconds(static_cast<int64_t>(o->timeout * 1e3));
      server::HttpServer server(*engine, tok, so);
      const int port = server.bind("127.0.0.1", 0);
      if (server.stats().max_context < per_stream) {
        fail("--prompt-tokens {} + --max-tokens {} exceed the server's context of {} tokens",
             o->prompt_tokens, o->max_tokens, server.stats().max_context);
      }
      std::thread serving([&] { server.run(); });
      std::mt19937_64 rng(o->seed);
      auto draw = [&](size_t n) {
        std::vector<int32_t> v(n);
        for (auto& t : v) t = ordinary[rng() % ordinary.size()];
        return v;
      };
      auto body = [&](const std::vector<int32_t>& prefix) {
        auto prompt = prefix;
        const auto rest = draw(static_cast<size_t>(o->prompt_tokens) - prefix.size());
        prompt.insert(prompt.end(), rest.begin(), rest.end());
        return json{{"prompt", prompt}, {"max_tokens", o->max_tokens},
                    {"temperature", 0}, {"ignore_eos", true},
                    {"stream", true},   {"stream_options", {{"include_usage", true}}}}
            .dump();
      };
      const auto shared_len = static_cast<size_t>(
          std::llround(o->shared_fraction * static_cast<double>(o->prompt_tokens)));
      std::vector<Level> levels;
      std::string failure;
      {
        // Warm-up: first-use costs (allocations, kernels' first launch) stay out of the figures.
        const auto w = stream_completion(port, body(draw(shared_len)), o->timeout);
        if (!w.ok) failure = "the warm-up request failed: " + w.error;
      }
      for (size_t li = 0; li < o->concurrency.size() && failure.empty(); ++li) {
        Level lv;
        lv.concurrency = o->concurrency[li];
        lv.requests = o->requests > 0 ? o->requests : std::max(8, 4 * lv.concurrency);
        std::vector<std::string> bodies;
        const auto prefix = draw(shared_len);
        for (int i = 0; i < lv.requests; ++i) bodies.push_back(body(prefix));
        const auto before = server.stats();
        std::atomic<int> next{0}, finished{0};
        std::mutex mu;
        std::vector<std::thread> clients;
        const auto start = Clock::now();
        for (int c = 0; c < std::min(lv.concurrency, lv.requests); ++c) {
          clients.emplace_back([&] {
            for (int i = next++; i < lv.requests; i = next++) {
              auto t = stream_completion(port, bodies[static_cast<size_t>(i)], o->timeout);
              std::lock_guard lk(mu);
              if (!t.ok) {
                if (failure.empty()) failure = t.error;
                continue;
              }
              ++lv.completed;
              lv.output_tokens += t.completion_tokens;
              lv.prompt_tokens += t.prompt_tokens;
              lv.ttft.push_back(t.ttft);
              lv.itl.insert(lv.itl.end(), t.gaps.begin(), t.gaps.end());
              ++finished;
              // A counter updated in place on a terminal; logs get one line per level.
              if (tty) {
                fmt::print(stderr, "\r  prefix cache {}, concurrency {}: {}/{} requests",
                           pc ? "on" : "off", lv.concurrency, finished.load(), lv.requests);
              }
            }
          });
        }
        for (auto& th : clients) th.join();
        lv.wall = secs(Clock::now() - start);
        fmt::print(stderr, "{}  prefix cache {}, concurrency {}: {}/{} requests in {:.1f} s\n",
                   tty ? "\r" : "", pc ? "on" : "off", lv.concurrency, lv.completed, lv.requests,
                   lv.wall);
        lv.prefix_hit_tokens = server.stats().prefix_hit_tokens - before.prefix_hit_tokens;
        levels.push_back(std::move(lv));
      }
      server.stop();
      serving.join();
      if (!failure.empty()) fail("bench serve: a request failed: {}", failure);
      results.emplace_back(pc, std::move(levels));
    }

    fmt::print(
        "model {} ({}), device {}{}, prompt {} tokens ({:.0f}% shared prefix), {} generated\n",
        dir.string(), arch, o->device, o->tp > 1 ? fmt::format(" --tp {}", o->tp) : "",
        o->prompt_tokens, 100.0 * o->shared_fraction, o->max_tokens);
    fmt::print("{:>6} {:>5} {:>5} {:>10} {:>10} {:>9} {:>9} {:>11} {:>8} {:>11}\n", "prefix",
               "conc", "reqs", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "out tok/s", "req/s",
               "prefix hits");
    for (const auto& [pc, levels] : results) {
      json lj = json::array();
      for (const auto& lv : levels) {
        const auto j = lv.to_json();
        fmt::print(
            "{:>6} {:>5} {:>5} {:>8.1f}ms {:>8.1f}ms {:>7.2f}ms {:>7.2f}ms {:>11.1f} {:>8.2f} "
            "{:>11}\n",
            pc ? "on" : "off", lv.concurrency, lv.completed, j["ttft_ms"]["p50"].get<double>(),
            j["ttft_ms"]["p99"].get<double>(), j["itl_ms"]["p50"].get<double>(),
            j["itl_ms"]["p99"].get<double>(), j["output_tokens_per_second"].get<double>(),
            j["requests_per_second"].get<double>(), lv.prefix_hit_tokens);
        lj.push_back(j);
      }
      runs.push_back({{"prefix_cache", pc}, {"levels", lj}});
    }
    if (!o->json_path.empty()) {
      char stamp[32];
      const std::time_t now = std::time(nullptr);
      std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
      json doc = {{"model", dir.string()},
                  {"architecture", arch},
                  {"device", o->device},
                  {"tp", o->tp},
                  {"options",
                   {{"concurrency", o->concurrency},
                    {"requests", o->requests},
                    {"prompt_tokens", o->prompt_tokens},
                    {"max_tokens", o->max_tokens},
                    {"shared_fraction", o->shared_fraction},
                    {"prefix_cache", o->prefix_cache},
                    {"kv_cache", o->kv_cache},
                    {"page_size", o->page_size},
                    {"step_tokens", o->step_tokens},
                    {"seed", o->seed}}},
                  {"timestamp", stamp},
                  {"git_revision", std::string(EXL3_GIT_REVISION)},
                  {"runs", runs}};
      std::ofstream f(o->json_path);
      f << doc.dump(2) << "\n";
      if (!f) fail("cannot write {}", o->json_path);
    }
    return 0;
  };
}

}  // namespace exl3::cli
