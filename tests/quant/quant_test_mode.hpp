// Test sizing for the quantizer suite: the encoder is compute heavy, so sanitizer builds (and
// EXL3_TEST_FAST=1) run fewer tiles and shapes with correspondingly looser statistical bounds.
#pragma once

#include <cstdlib>
#include <string_view>

#if defined(__SANITIZE_ADDRESS__)
#define EXL3_QUANT_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EXL3_QUANT_TEST_SANITIZED 1
#endif
#endif

namespace exl3::test {

inline bool quant_fast_mode() {
#if defined(EXL3_QUANT_TEST_SANITIZED)
  return true;
#else
  const char* env = std::getenv("EXL3_TEST_FAST");
  return env != nullptr && *env != '\0' && std::string_view(env) != "0";
#endif
}

}  // namespace exl3::test
