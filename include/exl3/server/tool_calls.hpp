// Tool calls in a model's reply: the formats model families write them in, found in streamed
// text and turned into OpenAI tool calls (a function name and its arguments as JSON text).
//
//   hermes   Hermes / Qwen2.5 / Qwen3: <tool_call>\n{"name": ..., "arguments":
//   {...}}\n</tool_call>,
//            any number of them, with text before, between or after
//   llama3   Llama-3.1 / 3.2: the whole reply is {"name": ..., "parameters": {...}} (several
//            joined by ';' too), optionally after the <|python_tag|> token
//   mistral  Mistral: [TOOL_CALLS] then a JSON list [{"name": ..., "arguments": {...}}, ...]
//
// The reply arrives in pieces (one per token). Text that cannot belong to a call is released at
// once as content; text that could be the start of a call's marker is held back until it is
// known; a call is buffered until complete and released whole. A call whose JSON is malformed
// (or lacks a name or an object of arguments) is released as content, verbatim, so nothing the
// model wrote is lost.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace exl3::server {

enum class ToolParser { kNone, kHermes, kLlama3, kMistral };

// "none", "hermes", "llama3", "mistral".
std::string_view tool_parser_name(ToolParser p);
// A --tool-parser value: nullopt for "auto", else the parser; throws exl3::Error naming the
// choices for anything else.
std::optional<ToolParser> parse_tool_parser_option(std::string_view name);
// The format a chat template teaches its model, read from the markers the template writes
// (kNone when it shows none of them).
ToolParser detect_tool_parser(std::string_view template_source);
// The text that opens a call ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]"; empty for none).
// Mistral's and Llama's are special tokens that decoding drops unless told to keep them.
std::string_view tool_call_marker(ToolParser p);

// A fresh id for a call the model made: "call_" and 24 letters or digits; for Mistral, 9 letters
// or digits, the only ids its chat templates take back in the next turn.
std::string new_tool_call_id(ToolParser p, std::mt19937_64& rng);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as compact JSON text
  bool operator==(const ParsedToolCall&) const = default;
};

class ToolCallExtractor {
 public:
  // `max_calls`: the calls the reply may hold ("parallel_tool_calls": false gives 1); once they
  // are released, the rest of the reply (text and further calls) is dropped.
  explicit ToolCallExtractor(ToolParser parser, size_t max_calls = SIZE_MAX);

  struct Output {
    std::string content;                // text to send now
    std::vector<ParsedToolCall> calls;  // calls completed by this piece, in order
  };
  // Adds the next piece of the reply.
  Output push(std::string_view piece);
  // The reply ended: releases what is held (an unfinished call is parsed as far as it goes).
  Output finish();
  // Calls released so far.
  size_t calls() const { return calls_; }

 private:
  enum class State { kText, kCall, kLlamaStart, kPlain, kDone };
  void scan(Output& out, bool at_end);
  void text(Output& out, std::string_view s);
  void call_done(Output& out, std::string_view raw, std::string_view body);

  ToolParser parser_;
  size_t max_calls_;
  State state_;
  std::string held_;           // text not released yet
  std::string pending_space_;  // white space after a call, dropped unless more text follows
  bool after_call_ = false;
  size_t calls_ = 0;
};

}  // namespace exl3::server
