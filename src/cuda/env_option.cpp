// env_override (see env_option.hpp).
#include "cuda/env_option.hpp"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "exl3/error.hpp"

namespace exl3::cuda::detail {

void env_override(const char* name, int64_t& field) {
  const char* v = std::getenv(name);
  if (v == nullptr) return;
  const std::string s(v);
  if (s.find_first_not_of(" \t") == std::string::npos) return;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
  if (errno != 0 || end == s.c_str() || *end != '\0' || x <= 0) {
    fail("environment variable {}='{}' is not a positive integer (unset it or give e.g. {}=8)",
         name, s, name);
  }
  field = x;
}

}  // namespace exl3::cuda::detail
