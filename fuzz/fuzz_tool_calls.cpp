// libFuzzer target: ToolCallExtractor on arbitrary replies. Input layout: one byte choosing the
// parser (low two bits: none, hermes, llama3, mistral) and the call limit (bit 2: one call at
// most, as "parallel_tool_calls": false asks), one byte seeding where the reply is cut into
// streamed pieces, then the reply's bytes. The extractor must never crash or hang; the pieces
// must give what the whole reply gives; every call has a name and arguments that are a JSON
// object; the calls released never exceed the limit and calls() counts them; with no parser
// the reply is all content, byte for byte.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/server/tool_calls.hpp"

namespace {

using exl3::server::ParsedToolCall;
using exl3::server::ToolCallExtractor;
using exl3::server::ToolParser;

struct Result {
  std::string content;
  std::vector<ParsedToolCall> calls;
  size_t counted = 0;
};

void add(Result& r, ToolCallExtractor::Output o) {
  r.content += o.content;
  for (auto& c : o.calls) r.calls.push_back(std::move(c));
}

Result run(ToolParser p, size_t max_calls, const std::vector<std::string_view>& pieces) {
  ToolCallExtractor x(p, max_calls);
  Result r;
  for (const auto piece : pieces) add(r, x.push(piece));
  add(r, x.finish());
  r.counted = x.calls();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2 || size > 4096) return 0;
  static constexpr ToolParser kParsers[] = {ToolParser::kNone, ToolParser::kHermes,
                                            ToolParser::kLlama3, ToolParser::kMistral};
  const ToolParser parser = kParsers[data[0] & 3];
  const size_t max_calls = (data[0] & 4) != 0 ? 1 : SIZE_MAX;
  const std::string_view reply(reinterpret_cast<const char*>(data + 2), size - 2);

  const Result whole = run(parser, max_calls, {reply});
  std::mt19937 rng(data[1]);
  std::vector<std::string_view> pieces;
  for (size_t at = 0; at < reply.size();) {
    const size_t n = std::min<size_t>(reply.size() - at, 1 + rng() % 8);
    pieces.push_back(reply.substr(at, n));
    at += n;
  }
  const Result cut = run(parser, max_calls, pieces);
  if (cut.content != whole.content || cut.calls != whole.calls) std::abort();
  if (whole.counted != whole.calls.size() || whole.calls.size() > max_calls) std::abort();
  for (const auto& c : whole.calls) {
    if (c.name.empty()) std::abort();
    const auto args = nlohmann::json::parse(c.arguments, nullptr, false);
    if (args.is_discarded() || !args.is_object()) std::abort();
  }
  if (parser == ToolParser::kNone && (whole.content != reply || !whole.calls.empty())) std::abort();
  return 0;
}
