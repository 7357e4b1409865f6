// `exl3 serve`: the OpenAI-compatible HTTP server (src/server) over one loaded model.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include "commands.hpp"
#include "draft_options.hpp"
#include "env_options.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/server/http_server.hpp"
#include "exl3/text/chat_template.hpp"
#include "exl3/text/stop_tokens.hpp"
#include "exl3/text/tokenizer.hpp"
#include "kv_cache_option.hpp"
#include "tp_option.hpp"

namespace exl3::cli {

Runner add_serve(CLI::App& app, Common&) {
  struct Opts {
    std::string model, host = "127.0.0.1", device = "cpu", model_name, chat_format;
    std::string tool_parser = "auto", preemption = "on";
    int port = 8000, max_seqs = 8, max_queue = 32, tp = 1, max_connections = 512;
    std::string kv_cache = "auto";
    double read_timeout = 30, write_timeout = 30, drain_timeout = 30;
    std::string api_key;
    DraftOptions draft;
    size_t max_body_mib = 8;
    int64_t cache_tokens = 16384, max_context = 0, step_tokens = 256, page_size = 32;
    bool quiet = false, prefix_cache = true;
    bool prefix_cache_given = false;  // --prefix-cache on the command line, not the default
    int64_t recurrent_snapshots = runtime::EngineOptions{}.recurrent_snapshots;
  };
  auto o = std::make_shared<Opts>();
  app.add_option(
         "MODEL", o->model,
         "Model folder: config.json, EXL3 *.safetensors, tokenizer.json (+ tokenizer_config.json)")
      ->required();
  app.add_option("--host", o->host,
                 "Address to listen on (0.0.0.0: every interface; there is no authentication)")
      ->capture_default_str();
  app.add_option("--port", o->port, "TCP port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--device", o->device, "Compute device: cpu (the fp32 reference runtime) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  add_tp_option(app, o->tp);
  add_kv_cache_option(app, o->kv_cache);
  app.add_option("--max-seqs", o->max_seqs, "Requests generating at once (continuous batching)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-queue", o->max_queue, "Requests waiting beyond those; more get HTTP 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--cache-tokens", o->cache_tokens,
                 "KV cache size in tokens, shared by all running requests (see --preemption)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-context", o->max_context,
                 "Most prompt + completion tokens per request (0: the model's "
                 "max_position_embeddings, capped by "
                 "--cache-tokens)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--step-tokens", o->step_tokens,
                 "Tokens per batched forward step: decodes first, then prompt chunks (smaller = "
                 "smoother streams "
                 "while long prompts arrive)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--preemption", o->preemption,
                 "on: admit requests on their prompt and grow their KV page by page; when the "
                 "cache runs short, the newest running requests go back to the head of the queue "
                 "and recompute their KV later (more requests run at once when replies are "
                 "shorter than max_tokens). off: each request reserves prompt + max_tokens when "
                 "admitted and is never preempted")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--page-size", o->page_size, "KV cache page size in tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
      "--model-name", o->model_name,
      "Model id clients send as \"model\" and /v1/models lists (default: the folder name)");
  app.add_option("--chat-format", o->chat_format,
                 "Native chat format for /v1/chat/completions instead of the model's own "
                 "chat_template")
      ->check(CLI::IsMember({"chatml", "llama3", "plain"}));
  app.add_option("--tool-parser", o->tool_parser,
                 "How tool calls are read out of chat replies: hermes (<tool_call>), llama3 "
                 "(a JSON reply), mistral ([TOOL_CALLS]), none (tools refused), or auto (from "
                 "the chat template's markers)")
      ->check(CLI::IsMember({"auto", "hermes", "llama3", "mistral", "none"}))
      ->capture_default_str();
  app.add_option("--max-connections", o->max_connections,
                 "Open HTTP connections at most; one more is answered 503 at once and closed")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--read-timeout", o->read_timeout,
                 "Seconds a client has to send a whole request (headers and body), counted from "
                 "when the server "
                 "starts waiting for it; idle keep-alive connections close after it too")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  app.add_option("--write-timeout", o->write_timeout,
                 "Seconds each write to a client may take; a client that stops reading is "
                 "disconnected (a stream "
                 "it was reading is cancelled)")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  app.add_option("--max-body-mib", o->max_body_mib,
                 "Largest request body in MiB, chunked uploads included (413 past it)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--api-key", o->api_key,
                 "Require 'Authorization: Bearer KEY' on every /v1/ request (401 otherwise; "
                 "/health stays open). "
                 "Default: $EXL3_API_KEY when set, else no key")
      ->envname("EXL3_API_KEY");
  app.add_option("--drain-timeout", o->drain_timeout,
                 "On SIGTERM, seconds to let queued and running requests finish (new ones get 503) "
                 "before the "
                 "rest are cancelled; 0 stops at once. SIGINT (Ctrl-C) or a second signal always "
                 "stops at once")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  add_draft_options(app, o->draft,
                    "Loaded on the same device, with its own KV cache of --cache-tokens.");
  app.add_flag("--prefix-cache,!--no-prefix-cache", o->prefix_cache,
               "Keep the KV pages of finished prompts (by a hash of their tokens) and let a new "
               "request whose prompt starts the same way reuse them instead of prefilling them "
               "again (a shared system prompt); cached pages are reclaimed when the pool is full. "
               "On by default (off with --device cuda --tp N > 1, which cannot share pages yet)")
      ->each([o](const std::string&) { o->prefix_cache_given = true; });
  app.add_option("--recurrent-snapshots", o->recurrent_snapshots,
                 "Models with gated DeltaNet layers (Qwen3-Next, Qwen3.5, Kimi-Linear), with the "
                 "prefix cache: how many recurrent states to keep where prompts end a page (a "
                 "new request reuses cached pages only up to such a state). Each is one "
                 "sequence's whole state (78 MB for Qwen3-Next-80B); the least recently used "
                 "is replaced first")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_flag("--quiet,-q", o->quiet, "Do not log each request to stderr");
  app.footer(
      "Serves the OpenAI API over HTTP: POST /v1/completions, POST /v1/chat/completions "
      "(\"stream\": true\n"
      "for server-sent events), GET /v1/models, GET /health. Concurrent requests are batched\n"
      "continuously: every step decodes one token of each running request and prefills prompt "
      "chunks\n"
      "of new ones. Requests beyond --max-seqs wait in a queue of --max-queue; beyond that the "
      "server\n"
      "answers 503. When the KV cache runs short, the newest running requests are preempted:\n"
      "they wait at the head of the queue and recompute their KV when readmitted, their streams\n"
      "going on where they stopped (--preemption off reserves prompt + max_tokens instead).\n"
      "SIGTERM drains (running requests finish, new ones get 503, see "
      "--drain-timeout);\n"
      "Ctrl-C (SIGINT) stops at once, cancelling what runs.\n"
      "With --draft, running requests advance by rounds of speculative decoding (a draft model\n"
      "proposes up to --draft-tokens tokens, the model checks them all in one pass); /health and\n"
      "/metrics report the drafted and accepted tokens.\n\n"
      "Examples:\n"
      "  exl3 serve ./Qwen3-8B-exl3 --port 8000\n"
      "  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\\n"
      "       -d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 16, \"temperature\": "
      "0}'\n"
      "  curl -N http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
      "       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"stream\": true}'\n"
      "  exl3 serve ./m --port 0 --max-seqs 16 --cache-tokens 65536 --model-name my-model\n"
      "  exl3 serve ./Qwen3-32B-exl3 --device cuda --draft ./Qwen3-0.6B-exl3 --draft-tokens 4\n\n"
      "Guide: docs/serve.md.");
  return [o] {
    // SIGINT/SIGTERM are taken by a watcher thread (sigwait), so they are blocked here, before any
    // other thread exists, and every thread started later inherits the mask.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    const std::filesystem::path dir(o->model);
    const auto tok = Tokenizer::load(dir);
    runtime::EngineOptions eo;
    eo.load_progress = runtime::make_load_progress_printer(stderr, ::isatty(2) != 0);
    eo.device = runtime::parse_device(o->device);
    eo.page_size = o->page_size;
    eo.cache_tokens = o->cache_tokens;
    eo.tp = o->tp;
    eo.kv_format = kv_cache_format(o->kv_cache);
    if (o->prefix_cache && o->tp > 1 && eo.device == runtime::Device::kCuda) {
      if (o->prefix_cache_given) {
        fail(
            "--prefix-cache is not available with --device cuda --tp {} yet (its ranks keep "
            "their own caches); hint: drop --prefix-cache, or serve on one GPU",
            o->tp);
      }
      o->prefix_cache = false;  // the default gives way where it cannot work; said at start
      fmt::print(stderr,
                 "exl3 serve: prefix cache off (not available with --device cuda --tp {})\n",
                 o->tp);
    }
    const Checkpoint ckpt = Checkpoint::open(dir);
    eo.prefix_cache = o->prefix_cache;
    eo.recurrent_snapshots = o->recurrent_snapshots;
    // Gated DeltaNet models keep a state slot per running sequence (preempted ones are dropped).
    eo.recurrent_slots = std::max(o->max_seqs, 1);
    engine_options_from_env(eo);
    auto engine = runtime::load_engine(ckpt, eo);
    const auto draft = load_draft(o->draft, *engine, ckpt, eo);

    server::ServerOptions so;
    so.model_name = o->model_name;
    if (so.model_name.empty())
      so.model_name = std::filesystem::absolute(dir).lexically_normal().filename().string();
    if (so.model_name.empty())
      so.model_name =
          std::filesystem::absolute(dir).lexically_normal().parent_path().filename().string();
    if (!o->chat_format.empty()) so.chat_format = parse_chat_format(o->chat_format);
    so.tool_parser = server::parse_tool_parser_option(o->tool_parser);
    so.stop_tokens = model_stop_tokens(dir, engine->spec().eos_token_ids, tok);
    so.scheduler.max_seqs = o->max_seqs;
    so.scheduler.max_queue = o->max_queue;
    so.scheduler.max_context = o->max_context;
    so.scheduler.step_tokens = o->step_tokens;
    so.scheduler.preemption = o->preemption == "on";
    so.scheduler.draft = draft.get();
    so.scheduler.speculative = o->draft.speculative();
    so.http.max_connections = o->max_connections;
    so.api_key = o->api_key;
    so.http.max_body_bytes = o->max_body_mib << 20;
    so.http.read_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(o->read_timeout * 1000.0));
    so.http.write_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(o->write_timeout * 1000.0));
    if (!o->quiet) {
      so.log = [](const std::string& line) {
        char ts[32];
        const std::time_t now = std::time(nullptr);
        std::strftime(ts, sizeof ts, "%H:%M:%S", std::localtime(&now));
        fmt::print(stderr, "{} {}\n", ts, line);
      };
    }
    server::HttpServer server(*engine, tok, so);
    const int port = server.bind(o->host, o->port);
    const auto st = server.stats();
    const std::string url =
        fmt::format("http://{}:{}",
                    o->host.find(':') != std::string::npos ? "[" + o->host + "]" : o->host, port);
    fmt::print("exl3 serve: {} ({}, {} layers) on {} as '{}'\n", dir.string(),
               runtime::architecture_name(engine->spec().architecture), engine->spec().num_layers(),
               o->device, so.model_name);
    const auto kv = engine->kv_cache_info();
    fmt::print(
        "  max-seqs {}, max-queue {}, context {} tokens per request, KV cache {} tokens "
        "({}, {} bytes per token; preemption {}, prefix cache {}), chat format: {}\n  tools: {}\n",
        o->max_seqs, o->max_queue, st.max_context, st.cache_tokens, cpu::kv_format_name(kv.format),
        kv.bytes_per_token, o->preemption, o->prefix_cache ? "on" : "off", server.chat_status(),
        server.tool_status());
    if (draft) {
      fmt::print("  draft: {} (up to {} tokens per round, {}), KV cache {} tokens\n",
                 o->draft.source(), o->draft.speculative().draft_tokens,
                 o->draft.fixed ? "fixed" : "adaptive", st.draft_cache_tokens);
    }
    fmt::print(
        "  limits: {} connections, {} MiB per body, {} s to send a request, {} s per write\n",
        o->max_connections, o->max_body_mib, o->read_timeout, o->write_timeout);
    fmt::print("listening on {}  (Ctrl-C stops)\n", url);
    fmt::print(
        "try: curl {}/v1/completions -H 'Content-Type: application/json' -d '{{\"model\": \"{}\", "
        "\"prompt\": \"Hello\", \"max_tokens\": 16}}'\n",
        url, so.model_name);
    std::fflush(stdout);

    std::atomic<bool> done{false};
    std::thread watcher([&] {
      // SIGTERM drains (a deploy's rolling restart), SIGINT stops; a signal during the drain, or
      // its deadline, stops at once.
      const timespec tick{0, 100'000'000};
      std::optional<std::chrono::steady_clock::time_point> drain_until;
      while (!done) {
        const int sig = sigtimedwait(&signals, nullptr, &tick);
        const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
        if (sig == SIGTERM && !drain_until && o->drain_timeout > 0) {
          fmt::print(stderr,
                     "exl3 serve: SIGTERM received, draining: new requests get 503, running ones "
                     "have up to {} s\n",
                     o->drain_timeout);
          server.begin_drain();
          drain_until = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(o->drain_timeout * 1000.0));
          continue;
        }
        if (sig == SIGINT || sig == SIGTERM) {
          fmt::print(stderr, "exl3 serve: {} received, stopping\n", name);
          server.stop();
          return;
        }
        if (drain_until && (server.idle() || std::chrono::steady_clock::now() >= *drain_until)) {
          fmt::print(
              stderr, "exl3 serve: {}, stopping\n",
              server.idle() ? "drained" : "drain timeout reached, cancelling what still runs");
          server.stop();
          return;
        }
      }
    });
    server.run();
    done = true;
    watcher.join();
    const auto end = server.stats();
    fmt::print("exl3 serve: stopped ({} completed, {} cancelled, {} failed)\n", end.completed,
               end.cancelled, end.failed);
    return 0;
  };
}

}  // namespace exl3::cli
