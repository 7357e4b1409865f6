// Test sizing for the heavy tests (the quantizer suite, the speculative sampling statistics):
// sanitizer builds (and EXL3_TEST_FAST=1) run fewer tiles, shapes or samples, with bounds that
// still hold (and still catch the errors they are there for) at those sizes.
#pragma once

#include <cstdlib>
#include <string_view>

#if defined(__SANITIZE_ADDRESS__)
#define EXL3_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EXL3_TEST_SANITIZED 1
#endif
#endif

namespace exl3::test {

inline bool fast_mode() {
#if defined(EXL3_TEST_SANITIZED)
  return true;
#else
  const char* env = std::getenv("EXL3_TEST_FAST");
  return env != nullptr && *env != '\0' && std::string_view(env) != "0";
#endif
}

// The quantizer suite's name for it.
inline bool quant_fast_mode() {
  return fast_mode();
}

}  // namespace exl3::test
