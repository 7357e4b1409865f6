// GPT-2's byte-to-unicode alphabet (see byte_alphabet.hpp).
#include "exl3/format/byte_alphabet.hpp"

#include <array>

#include <utf8proc.h>

namespace exl3 {

uint32_t byte_level_codepoint(uint8_t b) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t c = 0; c < 256; ++c) {
      const bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174);
      t[c] = printable ? c : next++;
    }
    return t;
  }();
  return table[b];
}

std::string utf8_of_codepoint(uint32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  return {reinterpret_cast<const char*>(buf), static_cast<size_t>(n)};
}

}  // namespace exl3
