// libFuzzer target: JsonGrammar::from_schema on arbitrary schema text, then JsonMatcher on
// arbitrary output bytes. Input layout: schema JSON, a NUL byte, the output bytes (without a NUL,
// the whole input is the output, matched against "any object"). Compiling must either succeed or
// throw exl3::Error; matching must never crash or hang, a mask must agree with feeding each token
// alone, and every complete output must be valid JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/text/json_schema.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> vocab = {
      "{",    "}",    "[",     "]",   "\"",   ":",     ",",    " ",   "\n", "0",
      "1",    "-",    ".",     "e",   "true", "false", "null", "\\",  "u",  "d8",
      "\xc3", "\xa9", "\"a\"", "\":", "{\"",  "\"}",   "a",    "1.5", "],"};
  static const exl3::TokenTrie trie(vocab);
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  std::shared_ptr<const exl3::JsonGrammar> g = exl3::JsonGrammar::any_object();
  std::string_view out = in;
  if (nul != std::string_view::npos) {
    out = in.substr(nul + 1);
    const auto schema = nlohmann::ordered_json::parse(in.substr(0, nul), nullptr, false);
    if (schema.is_discarded()) return 0;
    try {
      g = exl3::JsonGrammar::from_schema(schema);
    } catch (const exl3::Error&) {
      return 0;
    }
  }
  exl3::JsonMatcher m(g);
  std::string text;
  std::vector<uint8_t> mask;
  for (size_t i = 0; i < out.size() && i < 256; ++i) {
    if (i % 16 == 0) {
      m.allowed_tokens(trie, mask);
      for (size_t id = 0; id < vocab.size(); ++id) {
        exl3::JsonMatcher copy = m;
        if (copy.feed(vocab[id]) != (mask[id] != 0)) std::abort();
      }
    }
    if (m.feed(out.substr(i, 1))) text += out[i];
  }
  if (m.complete() && !nlohmann::json::accept(text)) std::abort();
  return 0;
}
