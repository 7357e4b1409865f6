// libFuzzer target: parse_safetensors_header on arbitrary bytes must either return a header whose
// every range lies inside the input, or throw exl3::Error; never crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto h = exl3::parse_safetensors_header(bytes, size, "fuzz");
    // The contract the rest of exl3 relies on: every tensor's bytes are inside the file.
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || h.data_begin + t.end > size) std::abort();
      if (t.numel() < 0) std::abort();
    }
  } catch (const exl3::Error&) {
  }
  return 0;
}
