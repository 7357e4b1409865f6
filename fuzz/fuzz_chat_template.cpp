// libFuzzer target: jinja::Template on arbitrary template bytes, rendered over a fixed chat.
// Input layout: the template source (the whole input). Parsing and rendering must either
// succeed or throw exl3::Error: no crash, no sanitizer report, no other exception type.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/text/jinja.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto context = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": " Be brief. "},
                 {"role": "user", "content": "Hi {{ x }} é"},
                 {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello",
                  "tool_calls": [{"type": "function",
                                  "function": {"name": "f", "arguments": {"a": [1, 2.5, null]}}}]},
                 {"role": "tool", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  try {
    const exl3::jinja::Template t(src, "fuzz");
    exl3::jinja::RenderOptions o;
    o.now = 0;
    (void)t.render(context, o);
  } catch (const exl3::Error&) {
  }
  return 0;
}
