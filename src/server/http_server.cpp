// The HTTP front of `exl3 serve` (see http_server.hpp): routes, OpenAI request handling, and the
// replies that follow a request's generation (whole, or as server-sent events).
#include "exl3/server/http_server.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <ctime>
#include <random>

#include <fmt/format.h>

#include "exl3/error.hpp"
#include "exl3/server/openai.hpp"
#include "http_transport.hpp"
#include "metrics.hpp"

namespace exl3::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kHeartbeat = std::chrono::seconds(2);  // SSE comment while nothing else is sent

std::string status_type(int status) {
  return status >= 500   ? "server_error"
         : status == 404 ? "not_found_error"
                         : "invalid_request_error";
}

ApiError api_error(int status, std::string message, std::string type, std::string code = {},
                   std::string param = {}) {
  return {status, std::move(message), std::move(type), std::move(param), std::move(code)};
}

http::Response error_response(const ApiError& e) {
  http::Response r;
  r.status = e.status;
  r.body = dump(e.to_json());
  return r;
}

http::Response json_response(const json& j) {
  http::Response r;
  r.body = dump(j);
  return r;
}

// What both reply forms share: the request's stream from the scheduler, which notifies the
// transport, and is cancelled when the connection ends first; and the reading of tool calls out
// of the text (ToolParser::kNone: the text is all content).
class CompletionReply : public http::LateReply {
 public:
  CompletionReply(ResponseMeta meta, std::shared_ptr<RequestStream> s, ToolParser tools,
                  size_t max_calls)
      : meta_(std::move(meta)),
        stream_(std::move(s)),
        tools_(tools),
        extractor_(tools, max_calls) {}
  void subscribe(std::function<void()> notify) override {
    stream_->set_listener(std::move(notify));
  }
  void abandon() override { stream_->cancel(); }

 protected:
  // The content and the new calls (with fresh ids) in `text`, or in what is held at the end.
  std::pair<std::string, std::vector<ToolCall>> extract(std::string_view text, bool at_end) {
    auto out = extractor_.push(text);
    if (at_end) {
      auto rest = extractor_.finish();
      out.content += rest.content;
      for (auto& c : rest.calls) out.calls.push_back(std::move(c));
    }
    std::vector<ToolCall> calls;
    for (auto& c : out.calls) {
      calls.push_back({new_tool_call_id(tools_, rng_), std::move(c.name), std::move(c.arguments)});
    }
    return {std::move(out.content), std::move(calls)};
  }
  // OpenAI's finish reason: a reply that ends normally after calling tools says so.
  std::string_view finish_name(FinishReason r) const {
    return r == FinishReason::kStop && extractor_.calls() > 0 ? "tool_calls"
                                                              : finish_reason_name(r);
  }

  ResponseMeta meta_;
  std::shared_ptr<RequestStream> stream_;

 private:
  ToolParser tools_;
  ToolCallExtractor extractor_;
  std::mt19937_64 rng_{std::random_device{}()};
};

// A completion answered in one piece once its generation ends.
class WholeReply final : public CompletionReply {
 public:
  using CompletionReply::CompletionReply;
  std::optional<http::Response> stream_head() override { return std::nullopt; }
  Update poll() override {
    Update out;
    auto u = stream_->wait(std::chrono::milliseconds(0));
    text_ += u.text;
    if (!u.finished) return out;
    out.done = true;
    if (u.reason == FinishReason::kError) {
      out.whole = error_response(
          api_error(500, fmt::format("generation failed: {}", u.error), "server_error"));
    } else if (u.reason == FinishReason::kCancelled) {
      out.whole = error_response(api_error(503, u.error, "server_error", "server_shutting_down"));
    } else {
      auto [content, calls] = extract(text_, /*at_end=*/true);
      out.whole = json_response(completion_response(meta_, content, finish_name(u.reason),
                                                    u.prompt_tokens, u.completion_tokens, calls));
    }
    return out;
  }

 private:
  std::string text_;
};

// A completion streamed as server-sent events; a client that goes away cancels it.
class EventStreamReply final : public CompletionReply {
 public:
  EventStreamReply(ResponseMeta meta, std::shared_ptr<RequestStream> s, ToolParser tools,
                   size_t max_calls, bool include_usage)
      : CompletionReply(std::move(meta), std::move(s), tools, max_calls),
        include_usage_(include_usage) {}
  std::optional<http::Response> stream_head() override {
    http::Response head;
    head.content_type = "text/event-stream";
    head.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
    return head;
  }
  Update poll() override {
    Update out;
    const auto u = stream_->wait(std::chrono::milliseconds(0));
    std::string& s = out.chunk;
    if (meta_.endpoint == Endpoint::kChat && !role_sent_) {
      s += sse_event(stream_chunk(meta_, "", std::nullopt, /*role_delta=*/true));
      role_sent_ = true;
    }
    const bool ok_end =
        u.finished && u.reason != FinishReason::kError && u.reason != FinishReason::kCancelled;
    if (!u.text.empty() || ok_end) {
      auto [content, calls] = extract(u.text, ok_end);
      if (!content.empty()) s += sse_event(stream_chunk(meta_, content, std::nullopt));
      for (const auto& c : calls) s += sse_event(tool_call_chunk(meta_, calls_sent_++, c));
    }
    if (u.finished) {
      if (!ok_end) {
        // A cancelled stream still being written to was stopped by the server (a client that
        // left cannot read this): the same code as the whole reply's 503, so clients can retry.
        const bool failed = u.reason == FinishReason::kError;
        s += sse_event(api_error(failed ? 500 : 503, u.error, "server_error",
                                 failed ? "" : "server_shutting_down")
                           .to_json());
      } else {
        s += sse_event(stream_chunk(meta_, "", finish_name(u.reason)));
        if (include_usage_)
          s += sse_event(usage_chunk(meta_, u.prompt_tokens, u.completion_tokens));
      }
      s += "data: [DONE]\n\n";
      out.done = true;
    } else if (s.empty() && Clock::now() - last_write_ > kHeartbeat) {
      // An SSE comment: clients ignore it, and a write is how a vanished client shows itself
      // while its request is still queued.
      s = ": keep-alive\n\n";
    }
    if (!s.empty()) last_write_ = Clock::now();
    return out;
  }

 private:
  bool include_usage_ = false;
  bool role_sent_ = false;
  size_t calls_sent_ = 0;  // the next tool call's index
  Clock::time_point last_write_ = Clock::now();
};

}  // namespace

struct HttpServer::Impl {
  Impl(runtime::Engine& e, Tokenizer t, ServerOptions o)
      : engine(e),
        tok(std::move(t)),
        opts(std::move(o)),
        sched(engine, tok, opts.scheduler),
        created(static_cast<int64_t>(std::time(nullptr))),
        transport(
            opts.http, [this](const http::Request& q) { return handle(q); },
            [](int status, std::string msg) {
              return error_response(api_error(status, std::move(msg), status_type(status)));
            },
            access_log(opts)) {
    try {
      chat = ChatTemplate::for_tokenizer(tok, opts.chat_format);
      if (!chat->end_of_turn().empty()) chat_end = tok.token_to_id(chat->end_of_turn());
    } catch (const Error& err) {
      chat_error = err.what();
    }
    setup_tools();
  }

  // Whether the chat prompt can show tools, and how replies are read back. Fails closed: a
  // template that never mentions `tools` would drop them silently, and a reply whose call format
  // is unknown would come back as text the client takes for an answer.
  void setup_tools() {
    const bool jinja = chat && !chat->format();
    const std::string& src = tok.chat_template();
    template_shows_tools = jinja && src.find("tools") != std::string::npos;
    template_shows_tool_turns = jinja && src.find("tool") != std::string::npos;
    tool_parser = opts.tool_parser.value_or(jinja ? detect_tool_parser(src) : ToolParser::kNone);
    if (!chat) {
      tool_error = "chat completions are unavailable";
    } else if (!template_shows_tools) {
      tool_error =
          jinja ? "the model's chat template does not show tools to the model"
                : fmt::format("the chat format {} cannot show tools to the model", chat->kind());
    } else if (tool_parser == ToolParser::kNone) {
      tool_error = opts.tool_parser
                       ? std::string("tool calling is off (--tool-parser none)")
                       : std::string(
                             "the model's tool-call format is not recognized in its chat "
                             "template; start the server with --tool-parser hermes|llama3|mistral");
    }
    const std::string_view marker = tool_call_marker(tool_parser);
    if (!marker.empty()) {
      const auto id = tok.token_to_id(marker);
      keep_special_for_tools = id && tok.is_special(*id);
    }
  }

  static http::AccessLog access_log(const ServerOptions& o) {
    if (!o.log) return {};
    return [log = o.log](const http::Request& q, int status, double ms) {
      log(fmt::format("{} {} {} {:.0f} ms {}", q.method, q.path, status, ms, q.id));
    };
  }

  runtime::Engine& engine;
  Tokenizer tok;
  ServerOptions opts;
  Scheduler sched;
  std::optional<ChatTemplate> chat;
  std::optional<int32_t> chat_end;
  std::string chat_error;
  bool template_shows_tools = false;       // the Jinja template reads `tools`
  bool template_shows_tool_turns = false;  // ... and can show tool calls and results at all
  ToolParser tool_parser = ToolParser::kNone;
  bool keep_special_for_tools = false;  // the call marker is a special token: decode it
  std::string tool_error;               // why requests with tools are refused; empty: accepted
  int64_t created;
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> stopping{false}, draining{false};
  http::Transport transport;  // last: its handler threads use everything above

  http::Reply handle(const http::Request& q);
  http::Reply generate(const http::Request& q, Endpoint ep);
  bool authorized(const http::Request& q) const;
  // A forced tool_choice: the grammar of one call in the parser's format (a parameters schema
  // outside the subset is the request's 400, naming `tools`).
  std::optional<ApiError> force_tool_call(const CompletionRequest& r, GenerationRequest& g) const;
  // Strict tools the model may call or not ("auto"): the reply is free, and a call it starts
  // (its marker written) is generated under the tools' schemas (a strict tool's schema outside
  // the subset is the request's 400, naming `tools`).
  std::optional<ApiError> strict_call_grammar(const CompletionRequest& r,
                                              GenerationRequest& g) const;
  // The generation request for `r`, and the tool-call format its reply is read with.
  std::optional<ApiError> build(const CompletionRequest& r, GenerationRequest& g,
                                ToolParser& reply_tools);
  json model_object() const {
    return {{"id", opts.model_name},
            {"object", "model"},
            {"created", created},
            {"owned_by", "exl3"},
            {"max_model_len", sched.max_context()}};
  }
  json health() const {
    const auto s = sched.stats();
    json h = base_health(s);
    if (opts.scheduler.draft != nullptr) {
      const double rounds = static_cast<double>(std::max<int64_t>(s.speculative_rounds, 1));
      h["speculative"] = {
          {"draft_tokens", opts.scheduler.speculative.draft_tokens},
          {"adaptive", opts.scheduler.speculative.adaptive},
          {"rounds", s.speculative_rounds},
          {"drafted_tokens", s.drafted_tokens},
          {"accepted_tokens", s.accepted_tokens},
          {"acceptance_rate", s.drafted_tokens > 0 ? static_cast<double>(s.accepted_tokens) /
                                                         static_cast<double>(s.drafted_tokens)
                                                   : 0.0},
          {"tokens_per_round",
           s.speculative_rounds > 0
               ? static_cast<double>(s.accepted_tokens + s.speculative_rounds) / rounds
               : 0.0},
          {"draft_cache_tokens", s.draft_cache_tokens},
          {"draft_free_cache_tokens", s.draft_free_cache_tokens}};
    }
    return h;
  }
  json base_health(const SchedulerStats& s) const {
    return {{"status", stopping   ? "stopping"
                       : draining ? "draining"
                                  : "ok"},
            {"model", opts.model_name},
            {"device", std::string(runtime::device_name(engine.device()))},
            {"running", s.running},
            {"queued", s.queued},
            {"max_seqs", opts.scheduler.max_seqs},
            {"max_queue", opts.scheduler.max_queue},
            {"max_context", s.max_context},
            {"cache_tokens", s.cache_tokens},
            {"free_cache_tokens", s.free_cache_tokens},
            {"prompt_tokens", s.prompt_tokens},
            {"prefix_cache_hit_tokens", s.prefix_hit_tokens},
            {"completed", s.completed},
            {"cancelled", s.cancelled},
            {"failed", s.failed},
            {"preemptions", s.preemptions},
            {"steps", s.steps},
            {"connections", transport.open_connections()},
            {"max_connections", opts.http.max_connections}};
  }
};

HttpServer::HttpServer(runtime::Engine& engine, Tokenizer tokenizer, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, std::move(tokenizer), std::move(opts))) {
  // Writes to a disconnected client must fail with EPIPE (which cancels its request), not raise
  // SIGPIPE, whose default action ends the process.
  std::signal(SIGPIPE, SIG_IGN);
}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::bind(const std::string& host, int port) {
  return impl_->transport.bind(host, port);
}

void HttpServer::run() {
  impl_->transport.run();
}

void HttpServer::stop() {
  impl_->stopping = true;
  // The scheduler first: every waiting reply learns its request ended (cancelled) and is answered
  // while the transport still runs; no notification can reach the transport after this.
  impl_->sched.shutdown();
  impl_->transport.stop();
}

void HttpServer::begin_drain() {
  impl_->draining = true;
}

bool HttpServer::idle() const {
  const auto s = impl_->sched.stats();
  return s.running == 0 && s.queued == 0;
}

SchedulerStats HttpServer::stats() const {
  return impl_->sched.stats();
}

std::string HttpServer::chat_status() const {
  return impl_->chat ? impl_->chat->description() : "none (" + impl_->chat_error + ")";
}

std::string HttpServer::tool_status() const {
  if (!impl_->tool_error.empty()) return "refused (" + impl_->tool_error + ")";
  return std::string(tool_parser_name(impl_->tool_parser)) + " tool calls";
}

http::Reply HttpServer::Impl::handle(const http::Request& q) {
  auto wrong_method = [&](const char* allow) {
    auto r = error_response(
        api_error(405, fmt::format("{} {} is not allowed; use {}", q.method, q.path, allow),
                  "invalid_request_error", "method_not_allowed"));
    r.headers.emplace_back("Allow", allow);
    return r;
  };
  const std::string& p = q.path;
  if (!opts.api_key.empty() && p.rfind("/v1/", 0) == 0 && !authorized(q)) {
    auto r = error_response(
        api_error(401,
                  "a valid API key is required: send the header 'Authorization: Bearer <key>' "
                  "with the key this server was started with (--api-key)",
                  "invalid_request_error", "invalid_api_key"));
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return r;
  }
  if (p == "/v1/completions" || p == "/v1/chat/completions") {
    if (q.method != "POST") return wrong_method("POST");
    return generate(q, p == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat);
  }
  const bool one_model = p.rfind("/v1/models/", 0) == 0 && p.size() > 11;
  if (p == "/v1/models" || p == "/health" || p == "/metrics" || one_model) {
    if (q.method != "GET") return wrong_method("GET");
    if (p == "/health") return json_response(health());
    if (p == "/metrics") {
      http::Response m;
      m.content_type = "text/plain; version=0.0.4; charset=utf-8";
      m.body = prometheus_metrics(
          {sched.stats(), transport.open_connections(), opts.http.max_connections, draining});
      return m;
    }
    if (!one_model)
      return json_response({{"object", "list"}, {"data", json::array({model_object()})}});
    const std::string id = p.substr(11);
    if (id != opts.model_name) {
      return error_response(
          api_error(404,
                    fmt::format("the model '{}' does not exist; this server serves '{}'", id,
                                opts.model_name),
                    "not_found_error", "model_not_found"));
    }
    return json_response(model_object());
  }
  return error_response(
      api_error(404,
                fmt::format("no route for {} {}; this server offers POST /v1/completions, POST "
                            "/v1/chat/completions, GET /v1/models, GET /health and GET /metrics",
                            q.method, q.path),
                "not_found_error"));
}

std::optional<ApiError> HttpServer::Impl::build(const CompletionRequest& r, GenerationRequest& g,
                                                ToolParser& reply_tools) {
  if (!r.model.empty() && r.model != opts.model_name) {
    return api_error(
        404,
        fmt::format("the model '{}' does not exist; this server serves '{}' (GET /v1/models)",
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
      const bool calling = !r.tools.is_null() && r.tool_choice != ToolChoice::kNone;
      if (calling && !tool_error.empty()) {
        return api_error(400,
                         fmt::format("'tools' cannot be used with this server: {}; send "
                                     "\"tool_choice\": \"none\" or leave 'tools' out",
                                     tool_error),
                         "invalid_request_error", "", "tools");
      }
      if (r.has_tool_traffic && !template_shows_tool_turns) {
        return api_error(400,
                         fmt::format("'messages' hold tool calls or tool results, which {} "
                                     "cannot show to the model",
                                     chat->format() ? "the chat format " + std::string(chat->kind())
                                                    : std::string("the model's chat template")),
                         "invalid_request_error", "", "messages");
      }
      // With tool_choice "none" the tools are still shown when the template can (as vLLM does),
      // and the reply is all content.
      const auto& tools = template_shows_tools ? r.tools : nlohmann::ordered_json();
      const auto extra = nlohmann::ordered_json::parse(r.chat_template_kwargs.dump());
      g.prompt = tok.encode(chat->render(r.template_messages, true, tools, extra),
                            chat->encode_adds_special_tokens());
      if (calling) {
        reply_tools = tool_parser;
        g.keep_special_tokens = keep_special_for_tools;
      }
      if (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kFunction) {
        if (auto e = force_tool_call(r, g)) return e;
      } else if (calling && r.strict_tools) {
        if (auto e = strict_call_grammar(r, g)) return e;
      }
      if (chat_end) g.stop_tokens.push_back(*chat_end);
    } else if (r.prompt_is_ids) {
      g.prompt = r.prompt_ids;
    } else {
      g.prompt = tok.encode(r.prompt_text, true);
    }
  } catch (const Error& e) {
    return api_error(400, e.what(), "invalid_request_error", "",
                     r.endpoint == Endpoint::kChat ? "messages" : "prompt");
  }
  if (r.ignore_eos) g.stop_tokens.clear();
  const auto prompt_len = static_cast<int64_t>(g.prompt.size());
  const int64_t room = sched.max_context() - prompt_len;
  if (r.max_tokens) {
    g.max_tokens = *r.max_tokens;
  } else if (room < 1) {
    return api_error(
        400,
        fmt::format("the prompt has {} tokens; this server's context is {} tokens, which leaves "
                    "no room for a completion; hint: shorten the prompt",
                    prompt_len, sched.max_context()),
        "invalid_request_error", "context_length_exceeded",
        r.endpoint == Endpoint::kChat ? "messages" : "prompt");
  } else {
    // OpenAI's defaults: 16 tokens for completions, the rest of the context for chat.
    g.max_tokens = r.endpoint == Endpoint::kCompletions ? std::min<int64_t>(16, room) : room;
  }
  g.sampling.temperature = r.temperature;
  g.sampling.top_p = r.top_p;
  g.sampling.top_k = r.top_k;
  g.sampling.min_p = r.min_p;
  g.sampling.repetition_penalty = r.repetition_penalty;
  g.sampling.seed = r.seed ? *r.seed : std::random_device{}();
  g.stop_strings = r.stop;
  if (r.response_grammar) g.grammar = r.response_grammar;  // never beside a forced call
  return std::nullopt;
}

std::optional<ApiError> HttpServer::Impl::force_tool_call(const CompletionRequest& r,
                                                          GenerationRequest& g) const {
  // The call exactly as the family's parser reads it back: Hermes' block, Llama's bare object
  // (its arguments under "parameters"), Mistral's marker and list.
  JsonGrammar::ToolCallShape shape;
  if (tool_parser == ToolParser::kHermes) {
    shape.prefix = "<tool_call>\n";
    shape.suffix = "\n</tool_call>";
  } else if (tool_parser == ToolParser::kLlama3) {
    shape.arguments_key = "parameters";
  } else if (tool_parser == ToolParser::kMistral) {
    shape.prefix = std::string(tool_call_marker(tool_parser));
    shape.list = true;
    if (!r.parallel_tool_calls) shape.max_calls = 1;
  }
  std::vector<JsonGrammar::ToolFunction> fns;
  for (const auto& t : r.tools) {
    const auto& fn = t["function"];
    const auto name = fn["name"].get<std::string>();
    if (r.tool_choice == ToolChoice::kFunction && name != r.tool_choice_function) continue;
    const auto params = fn.find("parameters");
    fns.push_back({name, params == fn.end() ? nlohmann::ordered_json() : *params});
  }
  try {
    g.grammar = JsonGrammar::tool_call(fns, shape);
  } catch (const Error& e) {
    return api_error(400,
                     fmt::format("'tool_choice' forces a call, which is generated to match the "
                                 "function's parameters schema, and {}",
                                 e.what()),
                     "invalid_request_error", "", "tools");
  }
  return std::nullopt;
}

std::optional<ApiError> HttpServer::Impl::strict_call_grammar(const CompletionRequest& r,
                                                              GenerationRequest& g) const {
  // Every tool's call follows its schema (as a forced call's does); a tool that is not strict and
  // whose schema is outside the subset takes any object of arguments instead of failing.
  std::vector<JsonGrammar::ToolFunction> fns;
  for (const auto& t : r.tools) {
    const auto& fn = t["function"];
    const auto name = fn["name"].get<std::string>();
    const auto strict = fn.find("strict");
    const bool is_strict = strict != fn.end() && strict->get<bool>();
    const auto params = fn.find("parameters");
    nlohmann::ordered_json schema = params == fn.end() ? nlohmann::ordered_json() : *params;
    if (!schema.is_null()) {
      try {
        JsonGrammar::from_schema(schema, fmt::format("the function '{}' parameters", name));
      } catch (const Error& e) {
        if (is_strict) {
          return api_error(400,
                           fmt::format("'strict' holds a call to its schema, and {}", e.what()),
                           "invalid_request_error", "", "tools");
        }
        schema = nullptr;
      }
    }
    fns.push_back({name, std::move(schema)});
  }
  // What follows the marker, as the forced grammar writes it; Llama's call is the whole reply,
  // known only from its first bytes, so it has no marker to wait for.
  JsonGrammar::ToolCallShape shape;
  if (tool_parser == ToolParser::kHermes) {
    shape.prefix = "\n";
    shape.suffix = "\n</tool_call>";
  } else if (tool_parser == ToolParser::kMistral) {
    shape.list = true;
    if (!r.parallel_tool_calls) shape.max_calls = 1;
  } else {
    return api_error(400,
                     fmt::format("a tool with \"strict\": true under \"tool_choice\": \"auto\" "
                                 "needs a call format with a marker to start the constraint at; "
                                 "{} replies have none: send \"tool_choice\": \"required\" or a "
                                 "named function, or leave 'strict' out",
                                 tool_parser_name(tool_parser)),
                     "invalid_request_error", "", "tools");
  }
  g.call_trigger = std::string(tool_call_marker(tool_parser));
  g.call_grammar = JsonGrammar::tool_call(fns, shape);
  return std::nullopt;
}

bool HttpServer::Impl::authorized(const http::Request& q) const {
  const std::string got = q.header("Authorization");
  const std::string want = "Bearer " + opts.api_key;
  // Compared in time independent of where they differ, so the key cannot be guessed byte by byte.
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<unsigned char>(want[i] ^ (i < got.size() ? got[i] : 0));
  }
  return diff == 0;
}

http::Reply HttpServer::Impl::generate(const http::Request& req, Endpoint ep) {
  if (draining || stopping) {
    return error_response(
        api_error(503,
                  "the server is shutting down and takes no new requests; retry on another "
                  "instance",
                  "server_error", "server_shutting_down"));
  }
  auto parsed = parse_completion_request(req.body, ep);
  if (const auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
  const auto& r = std::get<CompletionRequest>(parsed);
  GenerationRequest g;
  ToolParser reply_tools = ToolParser::kNone;
  if (auto e = build(r, g, reply_tools)) return error_response(*e);

  auto sub = sched.submit(std::move(g));
  if (sub.refusal) {
    switch (*sub.refusal) {
      case Scheduler::Refusal::kInvalid:
        return error_response(api_error(400, sub.message, "invalid_request_error", "", "prompt"));
      case Scheduler::Refusal::kTooLong:
        return error_response(api_error(400, sub.message, "invalid_request_error",
                                        "context_length_exceeded",
                                        r.max_tokens ? "max_tokens" : "prompt"));
      case Scheduler::Refusal::kQueueFull: {
        auto res = error_response(api_error(503, sub.message, "server_error", "server_overloaded"));
        res.headers.emplace_back("Retry-After", "1");
        return res;
      }
      case Scheduler::Refusal::kShuttingDown:
        return error_response(api_error(503, sub.message, "server_error", "server_shutting_down"));
    }
  }
  ResponseMeta meta;
  meta.endpoint = ep;
  meta.id =
      fmt::format("{}-{:016x}", ep == Endpoint::kChat ? "chatcmpl" : "cmpl",
                  next_id.fetch_add(1) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(created));
  meta.created = static_cast<int64_t>(std::time(nullptr));
  meta.model = opts.model_name;
  // "parallel_tool_calls": false: the first call is the reply's last word.
  const size_t max_calls = r.parallel_tool_calls ? SIZE_MAX : 1;
  if (r.stream) {
    return std::make_shared<EventStreamReply>(std::move(meta), sub.stream, reply_tools, max_calls,
                                              r.include_usage);
  }
  return std::make_shared<WholeReply>(std::move(meta), sub.stream, reply_tools, max_calls);
}

}  // namespace exl3::server
