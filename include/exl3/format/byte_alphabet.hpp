// GPT-2's byte-to-unicode alphabet, which byte-level BPE vocabularies (tokenizer.json with the
// ByteLevel pre-tokenizer) are written in: the printable bytes 33..126, 161..172 and 174..255 are
// their own code point, the other 68 map to 256, 257, ... in byte order. Shared by the tokenizer
// (text layer) and the synthetic tokenizer.json writer (format layer).
#pragma once

#include <cstdint>
#include <string>

namespace exl3 {

// The code point byte `b` is written as.
uint32_t byte_level_codepoint(uint8_t b);
// UTF-8 of a code point.
std::string utf8_of_codepoint(uint32_t cp);

}  // namespace exl3
