// What one `exl3 serve` HTTP front lets a client hold: the limits its transport enforces
// (src/server/http_transport.hpp says how; docs/serve.md, "Limits", states them for deployers).
#pragma once

#include <chrono>
#include <cstddef>

namespace exl3::server {

struct HttpLimits {
  size_t max_body_bytes = size_t{8} << 20;     // counted on the bytes read (chunked too): 413
  size_t max_header_bytes = size_t{64} << 10;  // 431
  int max_connections = 512;  // open connections; one more gets 503 and is closed at once
  std::chrono::milliseconds read_timeout{30'000};   // to receive one whole request (else: closed)
  std::chrono::milliseconds write_timeout{30'000};  // for each write to the client
  std::chrono::milliseconds tick{500};  // how often a reply in progress is polled without news
  int threads = 4;  // threads running request handlers (never blocked on a socket)
};

}  // namespace exl3::server
