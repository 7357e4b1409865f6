// Boost.Beast transport of `exl3 serve` (see http_transport.hpp for the limits it enforces).
#include "http_transport.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <thread>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "exl3/error.hpp"

namespace exl3::server::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == name.size() && std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      return v;
    }
  }
  return {};
}

bool valid_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
           c == '-';
  });
}

struct Transport::Impl {
  Impl(Limits l, Handler h, ErrorBody e, AccessLog a)
      : limits(l),
        handler(std::move(h)),
        error_body(std::move(e)),
        log(std::move(a)),
        acceptor(ioc),
        retry(ioc) {}

  // Declared before the io_context: its destructor destroys the sessions still queued in it,
  // and they use these.
  Limits limits;
  Handler handler;
  ErrorBody error_body;
  AccessLog log;
  std::atomic<int> open{0};      // sessions
  std::atomic<int> refusing{0};  // connections being answered 503 over the cap
  std::atomic<int> busy{0};      // sessions with a late reply in flight
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_id{1};
  const uint64_t id_salt = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::steady_timer retry;  // backs off when accept fails (e.g. out of file descriptors)

  void accept();
  void refuse(tcp::socket sock);
};

namespace {

// One connection: read a request, answer it, repeat while keep-alive holds.
class Session : public std::enable_shared_from_this<Session> {
 public:
  // `refused`: a connection over the cap, counted apart from the open ones and given a short
  // write deadline (see refuse()).
  Session(tcp::socket&& sock, Transport::Impl& t, bool refused = false)
      : stream_(std::move(sock)),
        t_(t),
        tick_(stream_.get_executor()),
        refused_(refused),
        write_timeout_(refused ? std::chrono::milliseconds(1000) : t.limits.write_timeout) {
    ++(refused_ ? t_.refusing : t_.open);
  }
  ~Session() {
    if (late_) {
      late_->abandon();
      --t_.busy;
    }
    --(refused_ ? t_.refusing : t_.open);
  }

  void start() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&Session::read, shared_from_this()));
  }

  // Answers `r` at once without reading a request, then closes after the lingering drain
  // (closing with the request unread would reset the connection before the answer arrives).
  void refuse(Response r) {
    keep_alive_ = false;
    net::dispatch(stream_.get_executor(), [self = shared_from_this(), r = std::move(r)]() mutable {
      self->send(std::move(r), true);
    });
  }

 private:
  void read() {
    if (t_.stopping) return close();
    req_ = Request{};
    parser_.emplace();
    parser_->body_limit(t_.limits.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(t_.limits.max_header_bytes));
    // One deadline for the whole request: trickled headers or body cannot hold the connection.
    stream_.expires_after(t_.limits.read_timeout);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             beast::bind_front_handler(&Session::on_header, shared_from_this()));
  }

  void on_header(beast::error_code ec, size_t) {
    if (ec) return read_failed(ec);
    const auto& h = parser_->get();
    if (beast::iequals(h[bhttp::field::expect], "100-continue")) {
      // The client waits for this before sending its body (curl does for bodies over 1 KiB).
      auto cont = std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_,
                                                                       h.version());
      bhttp::async_write(stream_, *cont,
                         [self = shared_from_this(), cont](beast::error_code wec, size_t) {
                           if (wec) return self->close();
                           self->read_body();
                         });
      return;
    }
    read_body();
  }

  void read_body() {
    bhttp::async_read(stream_, buffer_, *parser_,
                      beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void read_failed(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == net::error::operation_aborted || t_.stopping)
      return close();
    // Bytes of a request arrived (the parser consumes a header only once it is whole, so the
    // buffer counts too).
    const bool partial = buffer_.size() > 0 || (parser_ && parser_->got_some());
    // Beast closes the socket when the deadline passes, so a trickling client just sees the
    // connection end (there is no socket left to answer 408 on).
    if (ec == beast::error::timeout) return close();
    if (ec == bhttp::error::body_limit) {
      return send_error(413, "the request body is larger than this server's limit of " +
                                 std::to_string(t_.limits.max_body_bytes) + " bytes");
    }
    if (ec == bhttp::error::header_limit) {
      return send_error(431, "the request headers are larger than this server's limit of " +
                                 std::to_string(t_.limits.max_header_bytes) + " bytes");
    }
    if (partial && ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category()) {
      return send_error(400, "malformed HTTP request: " + ec.message());
    }
    close();  // the peer reset or closed mid-request: nobody to answer
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec) return read_failed(ec);
    stream_.expires_never();  // a completion may take long; writes set their own deadline
    auto msg = parser_->release();
    parser_.reset();
    keep_alive_ = msg.keep_alive();
    version_ = msg.version();
    req_ = Request{};
    req_.method = std::string(msg.method_string());
    const std::string_view target(msg.target().data(), msg.target().size());
    req_.path = std::string(target.substr(0, target.find('?')));
    req_.body = std::move(msg.body());
    for (const auto& f : msg)
      req_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    started_ = Clock::now();
    req_.id = req_.header("X-Request-Id");
    if (!valid_request_id(req_.id)) {
      char id[32];
      std::snprintf(id, sizeof id, "req-%016llx",
                    static_cast<unsigned long long>(
                        (t_.next_id.fetch_add(1) * 0x9E3779B97F4A7C15ull) ^ t_.id_salt));
      req_.id = id;
    }

    Reply reply;
    try {
      reply = t_.handler(req_);
    } catch (const std::exception& e) {
      reply = t_.error_body(500, std::string("internal error: ") + e.what());
    }
    if (auto* r = std::get_if<Response>(&reply)) return send(std::move(*r), false);
    late_ = std::move(std::get<std::shared_ptr<LateReply>>(reply));
    ++t_.busy;
    if (auto head = late_->stream_head()) {
      start_stream(std::move(*head));
    } else {
      subscribe();
    }
  }

  void subscribe() {
    late_->subscribe([weak = weak_from_this(), ex = stream_.get_executor()] {
      net::post(ex, [weak] {
        if (auto self = weak.lock()) self->pump();
      });
    });
    schedule_tick();
  }

  // The pending tick is what keeps the session alive while it waits for a late reply (no socket
  // operation is outstanding then), and it polls the reply in case a notification was missed.
  void schedule_tick() {
    tick_.expires_after(t_.limits.tick);
    tick_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->late_) return;
      self->pump();
      if (self->late_) self->schedule_tick();
    });
  }

  void start_stream(Response head) {
    auto res = std::make_shared<bhttp::response<bhttp::empty_body>>(
        static_cast<bhttp::status>(head.status), version_);
    res->set(bhttp::field::server, "exl3");
    res->set(bhttp::field::content_type, head.content_type);
    if (!req_.id.empty()) res->set("X-Request-Id", req_.id);
    for (const auto& [k, v] : head.headers) res->set(k, v);
    chunked_ = version_ >= 11;
    if (chunked_) {
      res->chunked(true);
      res->keep_alive(keep_alive_ && !t_.stopping);
    } else {
      res->keep_alive(false);  // HTTP/1.0: the body ends when the connection does
      keep_alive_ = false;
    }
    status_ = head.status;
    auto sr = std::make_shared<bhttp::response_serializer<bhttp::empty_body>>(*res);
    writing_ = true;
    stream_.expires_after(write_timeout_);
    bhttp::async_write_header(stream_, *sr,
                              [self = shared_from_this(), res, sr](beast::error_code ec, size_t) {
                                self->writing_ = false;
                                if (ec) return self->close();
                                self->subscribe();
                                self->pump();
                              });
  }

  // Pulls what the late reply has and writes it (one write in flight at a time).
  void pump() {
    if (!late_ || writing_) return;
    auto u = late_->poll();
    if (u.whole) {
      finish_late();
      return send(std::move(*u.whole), false);
    }
    if (u.chunk.empty() && !u.done) return;
    auto data = std::make_shared<std::string>(std::move(u.chunk));
    if (u.done) finish_late();
    std::vector<net::const_buffer> bufs;
    std::shared_ptr<std::string> frame;
    if (chunked_) {
      // Chunk framing: size in hex, the data, and after the last piece the zero-size chunk.
      frame = std::make_shared<std::string>();
      if (!data->empty()) {
        char hex[24];
        const int n = std::snprintf(hex, sizeof hex, "%zx\r\n", data->size());
        *frame = std::string(hex, static_cast<size_t>(n)) + *data + "\r\n";
      }
      if (u.done) *frame += "0\r\n\r\n";
    } else {
      frame = data;
    }
    writing_ = true;
    stream_.expires_after(write_timeout_);
    net::async_write(
        stream_, net::buffer(*frame),
        [self = shared_from_this(), frame, done = u.done](beast::error_code ec, size_t) {
          self->writing_ = false;
          if (ec) return self->close();
          if (done) return self->after_response(self->status_);
          self->pump();
        });
  }

  void finish_late() {
    if (!late_) return;
    late_.reset();
    tick_.cancel();
    --t_.busy;
  }

  void send_error(int status, std::string message) {
    keep_alive_ = false;
    if (req_.method.empty() && parser_) req_.method = std::string(parser_->get().method_string());
    send(t_.error_body(status, std::move(message)), true);
  }

  void send(Response r, bool close_after) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
        static_cast<bhttp::status>(r.status), version_ ? version_ : 11);
    res->set(bhttp::field::server, "exl3");
    res->set(bhttp::field::content_type, r.content_type);
    if (!req_.id.empty()) res->set("X-Request-Id", req_.id);
    for (const auto& [k, v] : r.headers) res->set(k, v);
    res->body() = std::move(r.body);
    res->keep_alive(keep_alive_ && !close_after && !t_.stopping);
    res->prepare_payload();
    status_ = r.status;
    writing_ = true;
    stream_.expires_after(write_timeout_);
    bhttp::async_write(stream_, *res,
                       [self = shared_from_this(), res, close_after](beast::error_code ec, size_t) {
                         self->writing_ = false;
                         if (ec) return self->close();
                         if (!res->keep_alive()) {
                           self->log_answer();
                           return close_after ? self->linger() : self->close();
                         }
                         self->after_response(res->result_int());
                       });
  }

  void after_response(int status) {
    status_ = status;
    log_answer();
    if (!keep_alive_ || t_.stopping) return close();
    read();  // the next request, maybe already in the buffer (pipelining)
  }

  void log_answer() {
    if (!t_.log || req_.method.empty()) return;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - started_).count();
    t_.log(req_, status_, ms);
    req_.method.clear();
  }

  // After an error answered before the request was read whole (413, 431, 400): stop sending,
  // then read and discard what the client still sends for a moment before closing. Closing with
  // unread bytes would reset the connection, and the reset can destroy the answer before the
  // client reads it.
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(1));
    drain(size_t{4} << 20);
  }
  void drain(size_t budget) {
    auto sink = std::make_shared<std::array<char, 16384>>();
    stream_.async_read_some(net::buffer(*sink), [self = shared_from_this(), sink, budget](
                                                    beast::error_code ec, size_t n) {
      if (ec || n >= budget) return self->close();
      self->drain(budget - n);
    });
  }

  void close() {
    finish_late_abandoned();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.close();
  }

  void finish_late_abandoned() {
    if (!late_) return;
    late_->abandon();
    finish_late();
  }

  beast::tcp_stream stream_;
  Transport::Impl& t_;
  net::steady_timer tick_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Request req_;
  Clock::time_point started_ = Clock::now();
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool chunked_ = true;
  bool writing_ = false;
  int status_ = 0;
  std::shared_ptr<LateReply> late_;
  const bool refused_;
  const std::chrono::milliseconds write_timeout_;
};

}  // namespace

void Transport::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) {
    if (stopping || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors or a transient network error: try again shortly rather than spin.
      retry.expires_after(std::chrono::milliseconds(50));
      retry.async_wait([this](beast::error_code wec) {
        if (!wec) accept();
      });
      return;
    }
    if (open.load() >= limits.max_connections) {
      refuse(std::move(sock));
    } else {
      std::make_shared<Session>(std::move(sock), *this)->start();
    }
    accept();
  });
}

void Transport::Impl::refuse(tcp::socket sock) {
  // Past the cap and a margin of refusals in flight, a connection is closed without an answer.
  if (refusing.load() >= 64) {
    beast::error_code ec;
    sock.close(ec);
    return;
  }
  auto r = error_body(503, "the server has " + std::to_string(limits.max_connections) +
                               " open connections, its limit; retry later");
  r.headers.emplace_back("Retry-After", "1");
  std::make_shared<Session>(std::move(sock), *this, /*refused=*/true)->refuse(std::move(r));
}

Transport::Transport(Limits limits, Handler handler, ErrorBody error_body, AccessLog log) {
  if (limits.max_connections < 1)
    fail("server: max_connections {} must be at least 1", limits.max_connections);
  if (limits.threads < 1) fail("server: threads {} must be at least 1", limits.threads);
  if (limits.read_timeout.count() <= 0 || limits.write_timeout.count() <= 0) {
    fail("server: the read and write timeouts must be positive");
  }
  // Each connection is a descriptor; the model's files and the engine need some too.
  const rlim_t need = static_cast<rlim_t>(limits.max_connections) + 64 + 256;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : std::min(need, rl.rlim_max);
    setrlimit(RLIMIT_NOFILE, &raised);
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < need) {
      fail(
          "server: --max-connections {} needs {} file descriptors but this process may open {}; "
          "hint: lower "
          "--max-connections or raise the limit (ulimit -n)",
          limits.max_connections, static_cast<unsigned long long>(need),
          static_cast<unsigned long long>(rl.rlim_cur));
    }
  }
  impl_ = std::make_unique<Impl>(limits, std::move(handler), std::move(error_body), std::move(log));
}

Transport::~Transport() {
  stop(std::chrono::milliseconds(0));
}

int Transport::bind(const std::string& host, int port) {
  if (port < 0 || port > 65535)
    fail("--port {} is not a TCP port (0..65535; 0 = any free port)", port);
  auto& a = impl_->acceptor;
  beast::error_code ec;
  tcp::resolver resolver(impl_->ioc);
  const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  std::string why = ec ? ec.message() : "no address";
  for (const auto& entry : found) {
    if (a.is_open()) a.close(ec);
    const auto ep = entry.endpoint();
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    // The system's largest backlog (net.core.somaxconn): a burst queues instead of being reset.
    if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
    if (!ec) return a.local_endpoint().port();
    why = ec.message();
  }
  if (a.is_open()) a.close(ec);
  fail(
      "cannot listen on {}:{} ({}); hint: pick another --port (0: any free one), or an address of "
      "this machine "
      "for --host",
      host, port, why);
}

void Transport::run() {
  auto& im = *impl_;
  if (!im.acceptor.is_open()) fail("server: run() before bind()");
  net::dispatch(im.ioc, [&im] { im.accept(); });
  std::vector<std::thread> extra;
  for (int i = 1; i < im.limits.threads; ++i) extra.emplace_back([&im] { im.ioc.run(); });
  im.ioc.run();
  for (auto& t : extra) t.join();
}

void Transport::stop(std::chrono::milliseconds grace) {
  auto& im = *impl_;
  if (im.stopping.exchange(true)) {
    im.ioc.stop();
    return;
  }
  net::post(im.ioc, [&im] {
    beast::error_code ec;
    im.acceptor.close(ec);
    im.retry.cancel();
  });
  const auto end = Clock::now() + grace;
  while (im.busy.load() > 0 && Clock::now() < end && !im.ioc.stopped()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  im.ioc.stop();
}

int Transport::open_connections() const {
  return impl_->open.load();
}

}  // namespace exl3::server::http
