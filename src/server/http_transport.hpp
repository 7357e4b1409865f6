// The HTTP/1.1 transport under `exl3 serve`: Boost.Beast over an Asio thread pool.
//
// Why not a thread per connection: a client that trickles its headers (or just holds a socket
// open) must not take a thread that /health or a completion needs. Here every connection is an
// asynchronous state machine; threads only run handlers, never wait on a socket. The limits a
// deployer can rely on (docs/serve.md, "Limits"):
//   - read_timeout: a whole request (headers and body) must arrive within it, counted from the
//     moment the server starts waiting for it (a new connection, or the end of the previous
//     response on a keep-alive one). Past it the connection is closed.
//   - max_header_bytes / max_body_bytes: counted on the bytes actually read, so a chunked upload
//     is held to the same limit as one with a Content-Length (431 / 413, then close).
//   - max_connections: open connections; one more is accepted, answered 503 at once and closed,
//     so a burst never waits in the kernel's accept queue for a reset.
//   - write_timeout: each write (a response, one streamed chunk) must complete within it, or the
//     connection closes (and a streamed request is cancelled).
// Pipelined requests on one connection are answered in order.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "exl3/server/http_limits.hpp"

namespace exl3::server::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // The request's id: the client's X-Request-Id when it is 1..128 characters of [A-Za-z0-9._:-],
  // else one the transport makes up. Every response carries it back as X-Request-Id, and the
  // access log names it, so a client's report can be matched to the server's log line.
  std::string id;
  // The first header of that name (case-insensitive), or "".
  std::string header(std::string_view name) const;
};

// Whether `id` is usable as a request id as given (see Request::id).
bool valid_request_id(std::string_view id);

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // beyond Content-Type/Length
};

// A reply that another thread produces over time (a completion). The transport polls it on the
// connection's strand after each notification and on a periodic tick.
class LateReply {
 public:
  virtual ~LateReply() = default;
  // `notify` may be called from any thread, any number of times, also from inside subscribe().
  virtual void subscribe(std::function<void()> notify) = 0;
  // A streamed reply's head (status and headers; its body is sent in chunks as poll() yields
  // them). nullopt: the reply is sent whole, once poll() returns it.
  virtual std::optional<Response> stream_head() = 0;
  struct Update {
    std::string chunk;              // streamed replies: bytes to send now (may be empty)
    std::optional<Response> whole;  // whole replies: set once, when done
    bool done = false;              // nothing follows
  };
  // Never blocks.
  virtual Update poll() = 0;
  // The connection ended before done (client gone, write timeout, server stopping).
  virtual void abandon() = 0;
};

using Reply = std::variant<Response, std::shared_ptr<LateReply>>;
using Handler = std::function<Reply(const Request&)>;
// Bodies of the errors the transport answers itself (400, 413, 431, 503).
using ErrorBody = std::function<Response(int status, std::string message)>;
// One line per answered request: method, path, status, milliseconds.
using AccessLog = std::function<void(const Request&, int status, double ms)>;

using Limits = HttpLimits;

class Transport {
 public:
  // Throws exl3::Error for limits out of range, or when the process cannot hold max_connections
  // sockets (its open-file limit, which it raises to the hard limit first).
  Transport(Limits limits, Handler handler, ErrorBody error_body, AccessLog log);
  ~Transport();  // stop()
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Binds host:port (0 = any free port) with the system's largest accept backlog; returns the
  // port. Throws exl3::Error naming the address.
  int bind(const std::string& host, int port);
  // Serves until stop(); the calling thread is one of the handler threads.
  void run();
  // Stops accepting, gives replies in flight up to `grace` to finish, then closes every
  // connection and makes run() return. Thread-safe, idempotent; before run() it makes run()
  // return at once.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(1000));
  int open_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace exl3::server::http
