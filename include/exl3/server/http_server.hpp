// `exl3 serve`'s HTTP front: the OpenAI-compatible endpoints over a Scheduler, on an asynchronous
// HTTP/1.1 transport (Boost.Beast; src/server/http_transport.hpp) that bounds what a client can
// hold: request read and write deadlines, header and body limits on the bytes actually read,
// and a connection cap answered with an immediate 503.
//
//   POST /v1/completions       prompt (text or token ids) -> text_completion
//   POST /v1/chat/completions  messages -> chat prompt (the model's own Jinja chat template, or
//                              the ServerOptions::chat_format override) -> chat.completion
//   GET  /v1/models, /v1/models/{id}
//   GET  /health               {"status": "ok", running, queued, KV cache use, counters}
//
// "stream": true answers with server-sent events (`data: {chunk}\n\n` ..., `data: [DONE]\n\n`);
// a client that goes away mid-stream cancels its request (its KV pages return to the pool at the
// next scheduler step). Errors are OpenAI error objects: 400 (bad JSON, wrong field types or
// values, prompt + max_tokens over the context), 404 (unknown model or path), 405 (wrong method),
// 413 (body over http.max_body_bytes), 431 (headers over http.max_header_bytes), 503 (queue full,
// connection cap, shutting down), 500 (engine failure). Non-streamed requests run to completion
// even when the client disconnects (max_tokens bounds them).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exl3/runtime/engine.hpp"
#include "exl3/server/http_limits.hpp"
#include "exl3/server/scheduler.hpp"
#include "exl3/server/tool_calls.hpp"
#include "exl3/text/chat_template.hpp"
#include "exl3/text/tokenizer.hpp"

namespace exl3::server {

struct ServerOptions {
  std::string model_name = "exl3";  // the id /v1/models lists and requests must name (or omit)
  std::optional<ChatFormat> chat_format;  // a native format instead of the model's chat_template
  std::vector<int32_t> stop_tokens;       // the model's end-of-sequence ids (model_stop_tokens)
  // How tool calls are read out of replies; nullopt: detected from the chat template's markers.
  // kNone turns tool calling off (requests with tools are refused unless tool_choice is "none").
  std::optional<ToolParser> tool_parser;
  SchedulerOptions scheduler;
  HttpLimits http;  // connections, deadlines, byte limits, handler threads
  // Non-empty: every /v1/ request must carry `Authorization: Bearer <api_key>` (else 401);
  // /health stays open for load balancers.
  std::string api_key;
  // Called once per answered request ("POST /v1/completions 200 12 ms"); empty = silent.
  std::function<void(const std::string&)> log;
};

class HttpServer {
 public:
  // Starts the scheduler on `engine` (no live sequences; it must outlive the server). Ignores
  // SIGPIPE for the whole process: a write to a client that went away must fail, not kill us.
  // Throws exl3::Error for options out of range.
  HttpServer(runtime::Engine& engine, Tokenizer tokenizer, ServerOptions opts);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: any free port) and returns the port. Throws exl3::Error naming the
  // address when it cannot bind.
  int bind(const std::string& host, int port);
  // Serves on the bound socket until stop(); blocks the calling thread.
  void run();
  // Cancels every request (clients waiting get 503), stops accepting, gives those answers up to a
  // second to go out and makes run() return. Thread-safe, idempotent.
  void stop();
  // Graceful shutdown, first half: new completions are refused with 503 (code
  // server_shutting_down) and /health says "draining", while queued and running ones go on.
  // The caller stops once idle() or its deadline passes. Thread-safe.
  void begin_drain();
  // No request is queued or running.
  bool idle() const;

  SchedulerStats stats() const;
  // The chat format in use, or why /v1/chat/completions is unavailable.
  std::string chat_status() const;
  // The tool-call format replies are parsed with ("hermes", ...), or why tools are refused.
  std::string tool_status() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace exl3::server
