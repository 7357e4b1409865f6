// The HTTP front of `exl3 serve` (see http_server.hpp).
#include "exl3/server/http_server.hpp"

#include <httplib.h>

#include <chrono>
#include <csignal>
#include <ctime>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "exl3/error.hpp"
#include "exl3/server/openai.hpp"

namespace exl3::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);  // how often waiting handlers look up
constexpr auto kHeartbeat = std::chrono::seconds(2);   // SSE comment while nothing else is sent

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(e.to_json()), "application/json");
}

ApiError api_error(int status, std::string message, std::string type, std::string code = {}, std::string param = {}) {
  return {status, std::move(message), std::move(type), std::move(param), std::move(code)};
}

std::string status_type(int status) {
  return status >= 500 ? "server_error" : status == 404 ? "not_found_error" : "invalid_request_error";
}

}  // namespace

struct HttpServer::Impl {
  Impl(runtime::Engine& e, Tokenizer t, ServerOptions o)
      : engine(e), tok(std::move(t)), opts(std::move(o)), sched(engine, tok, opts.scheduler),
        created(static_cast<int64_t>(std::time(nullptr))) {
    try {
      chat = ChatTemplate::for_tokenizer(tok, opts.chat_format);
      if (!chat->end_of_turn().empty()) chat_end = tok.token_to_id(chat->end_of_turn());
    } catch (const Error& err) {
      chat_error = err.what();
    }
  }

  runtime::Engine& engine;
  Tokenizer tok;
  ServerOptions opts;
  Scheduler sched;
  std::optional<ChatTemplate> chat;
  std::optional<int32_t> chat_end;
  std::string chat_error;
  httplib::Server http;
  int64_t created;
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> stopping{false}, in_run{false};

  void routes();
  void generate(const httplib::Request& req, httplib::Response& res, Endpoint ep);
  std::optional<ApiError> build(const CompletionRequest& r, GenerationRequest& g);
  void answer_whole(httplib::Response& res, const ResponseMeta& meta, const std::shared_ptr<RequestStream>& s);
  void answer_stream(httplib::Response& res, const ResponseMeta& meta, const std::shared_ptr<RequestStream>& s,
                     bool include_usage);
  json model_object() const {
    return {{"id", opts.model_name},
            {"object", "model"},
            {"created", created},
            {"owned_by", "exl3"},
            {"max_model_len", sched.max_context()}};
  }
};

HttpServer::HttpServer(runtime::Engine& engine, Tokenizer tokenizer, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, std::move(tokenizer), std::move(opts))) {
  // Writes to a disconnected client must fail with EPIPE (which cancels its request), not raise
  // SIGPIPE, whose default action ends the process.
  std::signal(SIGPIPE, SIG_IGN);
  impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind(const std::string& host, int port) {
  if (port < 0 || port > 65535) fail("--port {} is not a TCP port (0..65535; 0 = any free port)", port);
  const int bound = port == 0 ? impl_->http.bind_to_any_port(host) : (impl_->http.bind_to_port(host, port) ? port : -1);
  if (bound < 0) {
    fail("cannot listen on {}:{} (the port is in use, or {} is not an address of this machine); hint: pick another "
         "--port, or --port 0 for any free one",
         host, port, host);
  }
  return bound;
}

void HttpServer::run() {
  impl_->in_run = true;
  if (!impl_->stopping) impl_->http.listen_after_bind();
  impl_->in_run = false;
}

void HttpServer::stop() {
  impl_->stopping = true;
  impl_->sched.shutdown();  // waiting handlers see their requests finish (cancelled) and return
  // run() may be between its check and httplib's accept loop; stop() would be lost then.
  for (int i = 0; i < 2000 && impl_->in_run && !impl_->http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->http.stop();
}

SchedulerStats HttpServer::stats() const { return impl_->sched.stats(); }

std::string HttpServer::chat_status() const {
  return impl_->chat ? std::string(chat_format_name(impl_->chat->format())) : "none (" + impl_->chat_error + ")";
}

void HttpServer::Impl::routes() {
  const auto& so = opts.scheduler;
  // Every streaming request holds a thread for its whole life: enough threads that all running
  // and queued requests plus a few quick ones (health, refusals) are served at once.
  const size_t threads = static_cast<size_t>(so.max_seqs + so.max_queue + 8);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(opts.max_body_bytes);

  http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
    generate(q, r, Endpoint::kCompletions);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) {
    generate(q, r, Endpoint::kChat);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
    r.set_content(dump({{"object", "list"}, {"data", json::array({model_object()})}}), "application/json");
  });
  http.Get("/v1/models/(.+)", [this](const httplib::Request& q, httplib::Response& r) {
    if (q.matches[1] != opts.model_name) {
      return send_error(r, api_error(404, fmt::format("the model '{}' does not exist; this server serves '{}'",
                                                      q.matches[1].str(), opts.model_name),
                                     "not_found_error", "model_not_found"));
    }
    r.set_content(dump(model_object()), "application/json");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
    const auto s = sched.stats();
    r.set_content(dump({{"status", stopping ? "stopping" : "ok"},
                        {"model", opts.model_name},
                        {"device", std::string(runtime::device_name(engine.device()))},
                        {"running", s.running},
                        {"queued", s.queued},
                        {"max_seqs", opts.scheduler.max_seqs},
                        {"max_queue", opts.scheduler.max_queue},
                        {"max_context", s.max_context},
                        {"cache_tokens", s.cache_tokens},
                        {"free_cache_tokens", s.free_cache_tokens},
                        {"completed", s.completed},
                        {"cancelled", s.cancelled},
                        {"failed", s.failed},
                        {"steps", s.steps}}),
                  "application/json");
  });
  // The right path with the wrong method is 405 (httplib would say 404).
  auto wrong_method = [](const char* allow) {
    return [allow](const httplib::Request& q, httplib::Response& r) {
      r.set_header("Allow", allow);
      send_error(r, api_error(405, fmt::format("{} {} is not allowed; use {}", q.method, q.path, allow),
                              "invalid_request_error", "method_not_allowed"));
    };
  };
  for (const char* p : {"/v1/completions", "/v1/chat/completions"}) {
    http.Get(p, wrong_method("POST"));
    http.Put(p, wrong_method("POST"));
    http.Delete(p, wrong_method("POST"));
  }
  for (const char* p : {"/v1/models", "/health"}) {
    http.Post(p, wrong_method("GET"));
    http.Put(p, wrong_method("GET"));
    http.Delete(p, wrong_method("GET"));
  }
  // Statuses httplib sets itself (404 unknown path, 413 body too large, 400 unparsable HTTP)
  // get an OpenAI error object too.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    if (r.status == 404) {
      msg = fmt::format("no route for {} {}; this server offers POST /v1/completions, POST /v1/chat/completions, "
                        "GET /v1/models and GET /health",
                        q.method, q.path);
    } else if (r.status == 413) {
      msg = fmt::format("the request body is larger than this server's limit of {} bytes", opts.max_body_bytes);
    } else {
      msg = fmt::format("the request could not be handled (HTTP {})", r.status);
    }
    send_error(r, api_error(r.status, msg, status_type(r.status)));
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(r, api_error(500, fmt::format("internal error: {}", what), "server_error"));
  });
  if (opts.log) {
    http.set_logger([this](const httplib::Request& q, const httplib::Response& r) {
      opts.log(fmt::format("{} {} {}", q.method, q.path, r.status));
    });
  }
}

std::optional<ApiError> HttpServer::Impl::build(const CompletionRequest& r, GenerationRequest& g) {
  if (!r.model.empty() && r.model != opts.model_name) {
    return api_error(404, fmt::format("the model '{}' does not exist; this server serves '{}' (GET /v1/models)",
                                      r.model, opts.model_name),
                     "not_found_error", "model_not_found", "model");
  }
  g.stop_tokens = opts.stop_tokens;
  try {
    if (r.endpoint == Endpoint::kChat) {
      if (!chat) {
        return api_error(400, fmt::format("chat completions are unavailable: {}", chat_error),
                         "invalid_request_error", "", "messages");
      }
      g.prompt = tok.encode(chat->render(r.messages, true), chat->encode_adds_special_tokens());
      if (chat_end) g.stop_tokens.push_back(*chat_end);
    } else if (r.prompt_is_ids) {
      g.prompt = r.prompt_ids;
    } else {
      g.prompt = tok.encode(r.prompt_text, true);
    }
  } catch (const Error& e) {
    return api_error(400, e.what(), "invalid_request_error", "", r.endpoint == Endpoint::kChat ? "messages" : "prompt");
  }
  if (r.ignore_eos) g.stop_tokens.clear();
  const auto prompt_len = static_cast<int64_t>(g.prompt.size());
  const int64_t room = sched.max_context() - prompt_len;
  if (r.max_tokens) {
    g.max_tokens = *r.max_tokens;
  } else if (room < 1) {
    return api_error(400, fmt::format("the prompt has {} tokens; this server's context is {} tokens, which leaves "
                                      "no room for a completion; hint: shorten the prompt",
                                      prompt_len, sched.max_context()),
                     "invalid_request_error", "context_length_exceeded", r.endpoint == Endpoint::kChat ? "messages" : "prompt");
  } else {
    // OpenAI's defaults: 16 tokens for completions, the rest of the context for chat.
    g.max_tokens = r.endpoint == Endpoint::kCompletions ? std::min<int64_t>(16, room) : room;
  }
  g.sampling.temperature = r.temperature;
  g.sampling.top_p = r.top_p;
  g.sampling.seed = r.seed ? *r.seed : std::random_device{}();
  g.stop_strings = r.stop;
  return std::nullopt;
}

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
  auto parsed = parse_completion_request(req.body, ep);
  if (const auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  const auto& r = std::get<CompletionRequest>(parsed);
  GenerationRequest g;
  if (auto e = build(r, g)) return send_error(res, *e);

  auto sub = sched.submit(std::move(g));
  if (sub.refusal) {
    switch (*sub.refusal) {
      case Scheduler::Refusal::kInvalid:
        return send_error(res, api_error(400, sub.message, "invalid_request_error", "", "prompt"));
      case Scheduler::Refusal::kTooLong:
        return send_error(res, api_error(400, sub.message, "invalid_request_error", "context_length_exceeded",
                                         r.max_tokens ? "max_tokens" : "prompt"));
      case Scheduler::Refusal::kQueueFull:
        res.set_header("Retry-After", "1");
        return send_error(res, api_error(503, sub.message, "server_error", "server_overloaded"));
      case Scheduler::Refusal::kShuttingDown:
        return send_error(res, api_error(503, sub.message, "server_error", "server_shutting_down"));
    }
  }
  ResponseMeta meta;
  meta.endpoint = ep;
  meta.id = fmt::format("{}-{:016x}", ep == Endpoint::kChat ? "chatcmpl" : "cmpl",
                        next_id.fetch_add(1) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(created));
  meta.created = static_cast<int64_t>(std::time(nullptr));
  meta.model = opts.model_name;
  if (r.stream) {
    answer_stream(res, meta, sub.stream, r.include_usage);
  } else {
    answer_whole(res, meta, sub.stream);
  }
}

void HttpServer::Impl::answer_whole(httplib::Response& res, const ResponseMeta& meta,
                                    const std::shared_ptr<RequestStream>& s) {
  std::string text;
  for (;;) {
    auto u = s->wait(kPoll);
    text += u.text;
    if (!u.finished) continue;
    if (u.reason == FinishReason::kError) {
      return send_error(res, api_error(500, fmt::format("generation failed: {}", u.error), "server_error"));
    }
    if (u.reason == FinishReason::kCancelled) {
      return send_error(res, api_error(503, u.error, "server_error", "server_shutting_down"));
    }
    res.set_content(dump(completion_response(meta, text, finish_reason_name(u.reason), u.prompt_tokens,
                                             u.completion_tokens)),
                    "application/json");
    return;
  }
}

void HttpServer::Impl::answer_stream(httplib::Response& res, const ResponseMeta& meta,
                                     const std::shared_ptr<RequestStream>& s, bool include_usage) {
  struct State {
    ResponseMeta meta;
    std::shared_ptr<RequestStream> stream;
    bool include_usage = false;
    bool role_sent = false;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<State>(State{meta, s, include_usage});
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        if (!sink.is_writable()) return false;
        const auto u = st->stream->wait(kPoll);
        std::string out;
        if (st->meta.endpoint == Endpoint::kChat && !st->role_sent) {
          out += sse_event(stream_chunk(st->meta, "", std::nullopt, /*role_delta=*/true));
          st->role_sent = true;
        }
        if (!u.text.empty()) out += sse_event(stream_chunk(st->meta, u.text, std::nullopt));
        if (u.finished) {
          if (u.reason == FinishReason::kError || u.reason == FinishReason::kCancelled) {
            const int status = u.reason == FinishReason::kError ? 500 : 503;
            out += sse_event(api_error(status, u.error, "server_error").to_json());
          } else {
            out += sse_event(stream_chunk(st->meta, "", finish_reason_name(u.reason)));
            if (st->include_usage) out += sse_event(usage_chunk(st->meta, u.prompt_tokens, u.completion_tokens));
          }
          out += "data: [DONE]\n\n";
        } else if (out.empty() && Clock::now() - st->last_write > kHeartbeat) {
          // An SSE comment: clients ignore it, and a write is how a vanished client shows itself
          // while its request is still queued.
          out = ": keep-alive\n\n";
        }
        if (!out.empty()) {
          if (!sink.write(out.data(), out.size())) return false;
          st->last_write = Clock::now();
        }
        if (u.finished) sink.done();
        return true;
      },
      // Runs when the response ends for any reason: after a disconnect this cancels the request
      // (after a normal end it is a no-op).
      [st](bool) { st->stream->cancel(); });
}

}  // namespace exl3::server
