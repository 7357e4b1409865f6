// libFuzzer target: Tokenizer::from_json on arbitrary tokenizer.json bytes, then encode/decode.
// Input layout: tokenizer.json, a NUL byte, then the text to encode (no NUL: the whole input is
// the JSON and the text is fixed). Loading must either succeed or throw exl3::Error; a loaded
// tokenizer must return only ids it can decode, and the streaming decoder must agree with decode.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "exl3/error.hpp"
#include "exl3/text/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view json = in.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos
                                    ? std::string_view("Hello, world! 123 <|im_start|>")
                                    : in.substr(nul + 1);
  try {
    const auto tok = exl3::Tokenizer::from_json(json, {}, "fuzz");
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(text, true);
    } catch (const exl3::Error&) {
      return 0;  // invalid UTF-8 text, or a regex that hit PCRE2's match limit
    }
    for (const int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size() || !tok.id_to_token(id)) std::abort();
    }
    const std::string decoded = tok.decode(ids);
    exl3::StreamDecoder stream(tok);
    std::string streamed;
    for (const int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    if (streamed != decoded) std::abort();
  } catch (const exl3::Error&) {
  }
  return 0;
}
