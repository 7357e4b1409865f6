// A raw client socket on 127.0.0.1 for the server tests that need what an HTTP client library
// will not do: malformed or truncated requests, slow readers, idle connections, hang-ups. Every
// read is bounded by a deadline, so a server that never answers fails the test instead of hanging.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

namespace exl3::server::test {

class RawSocket {
 public:
  // `rcvbuf` > 0: a small receive buffer, so that a slow reader pushes back on the server.
  explicit RawSocket(int port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ >= 0 && rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawSocket() { close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  // False once the server has closed or reset the connection.
  bool send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads at most `max_bytes` more, waiting up to `seconds`; false at end of stream or timeout.
  bool read_some(double seconds, size_t max_bytes = 65536) {
    if (eof_) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(seconds * 1000)) <= 0) return false;
    std::string buf(std::min<size_t>(max_bytes, 65536), '\0');
    const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n <= 0) {
      eof_ = true;
      reset_ = n < 0;
      return false;
    }
    got_.append(buf.data(), static_cast<size_t>(n));
    return true;
  }
  // Reads until `done(received)` holds, the peer closes, or `seconds` pass.
  template <class Pred>
  const std::string& read_until(Pred done, double seconds) {
    using Clock = std::chrono::steady_clock;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (!done(got_) && !eof_ && Clock::now() < end) {
      read_some(std::max(0.001, std::chrono::duration<double>(end - Clock::now()).count()));
    }
    return got_;
  }
  const std::string& read_all(double seconds) {
    return read_until([](const std::string&) { return false; }, seconds);
  }
  const std::string& got() const { return got_; }
  bool eof() const { return eof_; }
  bool reset() const { return reset_; }  // the peer reset the connection (not a clean close)

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  bool reset_ = false;
  std::string got_;
};

}  // namespace exl3::server::test
