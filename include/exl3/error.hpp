// The one exception type exl3 throws for bad input and failed operations.
//
// Messages name the file, the tensor and what is wrong, and where possible end with a hint at the
// fix, e.g. "model.safetensors: tensor 'x.trellis': last dim 50 is not 16*K for K in 1..8".
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace exl3 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws exl3::Error with an fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace exl3
