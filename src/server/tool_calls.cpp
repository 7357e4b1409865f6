// Tool calls in streamed model output (see tool_calls.hpp).
#include "exl3/server/tool_calls.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"

namespace exl3::server {

using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), is_space);
}

std::string_view trim_start(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

std::string_view trim(std::string_view s) {
  s = trim_start(s);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Where the JSON object or list that `s` starts with (after white space) ends: the offset just
// past its closing bracket, or nullopt while it is unfinished or when `s` starts otherwise. Only
// brackets outside strings count, so a call's end is found without parsing it again per token.
std::optional<size_t> json_structure_end(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  if (i == s.size() || (s[i] != '{' && s[i] != '[')) return std::nullopt;
  int depth = 0;
  bool in_string = false, escaped = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::nullopt;
}

// One call object: {"name": "...", "arguments": {...}} (Llama writes "parameters").
std::optional<ParsedToolCall> call_of(const ojson& j) {
  if (!j.is_object()) return std::nullopt;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
    return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || !args->is_object()) return std::nullopt;
  return ParsedToolCall{name->get<std::string>(),
                        args->dump(-1, ' ', false, ojson::error_handler_t::replace)};
}

ojson parse_json(std::string_view s) {
  return ojson::parse(s, nullptr, /*allow_exceptions=*/false);
}

std::optional<std::vector<ParsedToolCall>> parse_hermes(std::string_view body) {
  auto c = call_of(parse_json(trim(body)));
  if (!c) return std::nullopt;
  return std::vector<ParsedToolCall>{std::move(*c)};
}

std::optional<std::vector<ParsedToolCall>> parse_mistral(std::string_view body) {
  const ojson j = parse_json(trim(body));
  if (!j.is_array() || j.empty()) return std::nullopt;
  std::vector<ParsedToolCall> calls;
  for (const auto& x : j) {
    auto c = call_of(x);
    if (!c) return std::nullopt;
    calls.push_back(std::move(*c));
  }
  return calls;
}

// The whole reply: objects separated by ';' (Llama's way of several calls), nothing else.
std::optional<std::vector<ParsedToolCall>> parse_llama3(std::string_view body) {
  body = trim_start(body);
  if (body.starts_with(kPythonTag)) body.remove_prefix(kPythonTag.size());
  std::vector<ParsedToolCall> calls;
  while (true) {
    body = trim_start(body);
    const auto end = json_structure_end(body);
    if (!end) return std::nullopt;
    auto c = call_of(parse_json(body.substr(0, *end)));
    if (!c) return std::nullopt;
    calls.push_back(std::move(*c));
    body = trim_start(body.substr(*end));
    if (body.empty()) return calls;
    if (body.front() != ';') return std::nullopt;
    body.remove_prefix(1);
    if (trim_start(body).empty()) return calls;
  }
}

// The length of the longest end of `s` that is a proper beginning of `marker`.
size_t marker_prefix_at_end(std::string_view s, std::string_view marker) {
  for (size_t len = std::min(marker.size() - 1, s.size()); len > 0; --len) {
    if (s.substr(s.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

}  // namespace

std::string_view tool_parser_name(ToolParser p) {
  switch (p) {
    case ToolParser::kNone:
      return "none";
    case ToolParser::kHermes:
      return "hermes";
    case ToolParser::kLlama3:
      return "llama3";
    case ToolParser::kMistral:
      return "mistral";
  }
  return "?";
}

std::optional<ToolParser> parse_tool_parser_option(std::string_view name) {
  if (name == "auto") return std::nullopt;
  for (const auto p :
       {ToolParser::kNone, ToolParser::kHermes, ToolParser::kLlama3, ToolParser::kMistral}) {
    if (name == tool_parser_name(p)) return p;
  }
  fail("unknown tool parser '{}' (choose auto, hermes, llama3, mistral or none)", name);
}

ToolParser detect_tool_parser(std::string_view src) {
  // GLM-4.5 wraps calls in <tool_call> too, but writes arguments as <arg_key>/<arg_value> pairs,
  // not JSON: no parser here reads that.
  if (src.find("<arg_key>") != std::string_view::npos) return ToolParser::kNone;
  if (src.find(kHermesOpen) != std::string_view::npos) return ToolParser::kHermes;
  if (src.find(kMistralOpen) != std::string_view::npos) return ToolParser::kMistral;
  // Llama-3.1's templates teach {"name": ..., "parameters": ...}; some also write <|python_tag|>.
  if (src.find(kPythonTag) != std::string_view::npos ||
      (src.find("<|start_header_id|>") != std::string_view::npos &&
       src.find("\"parameters\"") != std::string_view::npos)) {
    return ToolParser::kLlama3;
  }
  return ToolParser::kNone;
}

std::string_view tool_call_marker(ToolParser p) {
  switch (p) {
    case ToolParser::kHermes:
      return kHermesOpen;
    case ToolParser::kLlama3:
      return kPythonTag;
    case ToolParser::kMistral:
      return kMistralOpen;
    case ToolParser::kNone:
      break;
  }
  return {};
}

std::string new_tool_call_id(ToolParser p, std::mt19937_64& rng) {
  static constexpr std::string_view kAlnum =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = p == ToolParser::kMistral ? "" : "call_";
  const size_t n = p == ToolParser::kMistral ? 9 : 24;
  std::uniform_int_distribution<size_t> pick(0, kAlnum.size() - 1);
  for (size_t i = 0; i < n; ++i) id += kAlnum[pick(rng)];
  return id;
}

ToolCallExtractor::ToolCallExtractor(ToolParser parser, size_t max_calls)
    : parser_(parser),
      max_calls_(max_calls),
      state_(parser == ToolParser::kNone     ? State::kPlain
             : parser == ToolParser::kLlama3 ? State::kLlamaStart
                                             : State::kText) {}

ToolCallExtractor::Output ToolCallExtractor::push(std::string_view piece) {
  held_ += piece;
  Output out;
  scan(out, false);
  return out;
}

ToolCallExtractor::Output ToolCallExtractor::finish() {
  Output out;
  scan(out, true);
  // White space after the last call is the model's separator, not an answer.
  pending_space_.clear();
  return out;
}

void ToolCallExtractor::text(Output& out, std::string_view s) {
  if (s.empty()) return;
  if (after_call_) {
    // Between or after calls, white space is only kept if more text follows it.
    if (all_space(s)) {
      pending_space_ += s;
      return;
    }
    out.content += pending_space_;
    pending_space_.clear();
    after_call_ = false;
  }
  out.content += s;
}

void ToolCallExtractor::call_done(Output& out, std::string_view raw, std::string_view body) {
  std::optional<std::vector<ParsedToolCall>> calls;
  if (parser_ == ToolParser::kHermes) calls = parse_hermes(body);
  if (parser_ == ToolParser::kMistral) calls = parse_mistral(body);
  if (parser_ == ToolParser::kLlama3) calls = parse_llama3(body);
  if (!calls) {
    text(out, raw);
    return;
  }
  pending_space_.clear();
  after_call_ = true;
  // Past the limit (several calls in one Mistral list or Llama reply), the first ones are kept.
  if (calls->size() > max_calls_ - calls_) calls->resize(max_calls_ - calls_);
  calls_ += calls->size();
  for (auto& c : *calls) out.calls.push_back(std::move(c));
  if (calls_ >= max_calls_) {
    state_ = State::kDone;
    held_.clear();
  }
}

void ToolCallExtractor::scan(Output& out, bool at_end) {
  const std::string_view marker = tool_call_marker(parser_);
  while (true) {
    switch (state_) {
      case State::kDone:
        held_.clear();
        return;
      case State::kPlain:
        text(out, held_);
        held_.clear();
        return;
      case State::kLlamaStart: {
        // Llama's call is the whole reply: decided by how the reply starts.
        const std::string_view t = trim_start(held_);
        if (t.empty() && !at_end) return;
        if (t.starts_with('{') || t.starts_with(kPythonTag)) {
          state_ = State::kCall;
        } else if (!t.empty() && kPythonTag.starts_with(t) && !at_end) {
          return;
        } else {
          state_ = State::kPlain;
        }
        continue;
      }
      case State::kText: {
        const size_t at = held_.find(marker);
        if (at == std::string::npos) {
          const size_t keep = at_end ? 0 : marker_prefix_at_end(held_, marker);
          text(out, std::string_view(held_).substr(0, held_.size() - keep));
          held_.erase(0, held_.size() - keep);
          return;
        }
        text(out, std::string_view(held_).substr(0, at));
        held_.erase(0, at);
        state_ = State::kCall;
        continue;
      }
      case State::kCall: {
        const std::string_view all = held_;
        if (parser_ == ToolParser::kLlama3) {
          if (!at_end) return;
          call_done(out, all, all);
          held_.clear();
          return;
        }
        const std::string_view body = all.substr(marker.size());
        std::optional<size_t> end;  // of the raw call text, marker included
        std::string_view inner;
        if (parser_ == ToolParser::kHermes) {
          const size_t close = body.find(kHermesClose);
          if (close != std::string_view::npos) {
            end = marker.size() + close + kHermesClose.size();
            inner = body.substr(0, close);
          }
        } else if (const auto e = json_structure_end(body)) {
          end = marker.size() + *e;
          inner = body.substr(0, *e);
        }
        if (!end) {
          if (!at_end) return;
          // An unclosed block at the end of the reply still counts when its JSON is whole: models
          // sometimes end their turn right after the object.
          const std::string raw(all), in(body);
          held_.clear();
          state_ = State::kText;
          call_done(out, raw, in);
          return;
        }
        const std::string raw(all.substr(0, *end));
        const std::string in(inner);
        held_.erase(0, *end);
        state_ = State::kText;
        call_done(out, raw, in);
        continue;
      }
    }
  }
}

}  // namespace exl3::server
