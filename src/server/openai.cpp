// OpenAI request parsing and response shapes (see openai.hpp).
#include "exl3/server/openai.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "chat_request.hpp"
#include "exl3/error.hpp"

namespace exl3::server {

using nlohmann::json;

namespace {

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  return fmt::format("a{} {}", v.is_array() || v.is_object() ? "n" : "", v.type_name());
}

// The reader of one body: each accessor validates one field and records the first error.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}
  std::optional<ApiError> error;

  const json* get(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  void fail_type(const char* key, const char* want, const json& got) {
    if (!error)
      error = bad_param(key, fmt::format("'{}' must be {}, got {}", key, want, type_name(got)));
  }
  void fail_value(const char* key, std::string msg) {
    if (!error) error = bad_param(key, fmt::format("'{}' {}", key, msg));
  }
  std::optional<bool> boolean(const char* key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return fail_type(key, "true or false", *v), std::nullopt;
    return v->get<bool>();
  }
  std::optional<double> number(const char* key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) return fail_type(key, "a number", *v), std::nullopt;
    const double d = v->get<double>();
    // Every sampling number is a float: a larger one would silently become infinity.
    if (!std::isfinite(d) || std::abs(d) > static_cast<double>(std::numeric_limits<float>::max())) {
      return fail_value(key,
                        fmt::format("must be a finite number within +-{:g}, got {:g}",
                                    static_cast<double>(std::numeric_limits<float>::max()), d)),
             std::nullopt;
    }
    return d;
  }
  std::optional<int64_t> integer(const char* key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) return fail_type(key, "an integer", *v), std::nullopt;
    return v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
               ? INT64_MAX
               : v->get<int64_t>();
  }
  // A field this server does not implement: refused unless it has its neutral value.
  void unsupported_unless(const char* key, const json& neutral, const char* what) {
    const json* v = get(key);
    if (!v || *v == neutral) return;
    if ((v->is_array() || v->is_object()) && v->empty()) return;
    fail_value(key, fmt::format("is not supported by this server ({}); leave it out", what));
  }

 private:
  const json& j_;
};

std::optional<std::vector<int32_t>> token_list(const json& v) {
  std::vector<int32_t> ids;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      return std::nullopt;
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return ids;
}

void parse_prompt(Fields& f, CompletionRequest& r) {
  const json* p = f.get("prompt");
  if (!p) return f.fail_value("prompt", "is required (a string or a list of token ids)");
  const json* one = p;
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    if (p->size() != 1) {
      return f.fail_value(
          "prompt",
          fmt::format("holds {} prompts; this server takes one prompt per request", p->size()));
    }
    one = &p->front();
  }
  if (one->is_string()) {
    r.prompt_text = one->get<std::string>();
    if (r.prompt_text.empty()) f.fail_value("prompt", "is empty");
    return;
  }
  if (one->is_array()) {
    if (one->empty()) return f.fail_value("prompt", "is an empty token list");
    auto ids = token_list(*one);
    if (!ids)
      return f.fail_value("prompt", "must be a string or a list of non-negative integer token ids");
    r.prompt_ids = std::move(*ids);
    r.prompt_is_ids = true;
    return;
  }
  f.fail_type("prompt", "a string or a list of token ids", *one);
}

// response_format: text, json_object, or json_schema (compiled here, so a schema outside the
// subset is the request's 400). `body` is parsed again with key order kept: properties are
// generated in the schema's order.
void parse_response_format(Fields& f, const json& rf, std::string_view body, CompletionRequest& r) {
  if (!rf.is_object()) return f.fail_type("response_format", "an object", rf);
  const auto type = rf.find("type");
  if (type == rf.end() || !type->is_string()) {
    return f.fail_value("response_format",
                        "needs a 'type': \"text\", \"json_object\" or \"json_schema\"");
  }
  const auto t = type->get<std::string>();
  if (t == "text") return;
  if (t == "json_object") {
    r.response_grammar = JsonGrammar::any_object();
    return;
  }
  if (t != "json_schema") {
    return f.fail_value("response_format",
                        fmt::format("has the type \"{}\"; use \"text\", \"json_object\" or "
                                    "\"json_schema\"",
                                    t));
  }
  const auto ordered = nlohmann::ordered_json::parse(body);
  const auto& js = ordered["response_format"];
  const auto spec = js.find("json_schema");
  if (spec == js.end() || !spec->is_object() || !spec->contains("schema")) {
    return f.fail_value("response_format",
                        "of type \"json_schema\" needs a 'json_schema' object holding the "
                        "'schema' (and a 'name')");
  }
  if (const auto n = spec->find("name"); n != spec->end() && !n->is_null() && !n->is_string())
    return f.fail_value("response_format", "has a json_schema name that is not a string");
  if (const auto s = spec->find("strict"); s != spec->end() && !s->is_null() && !s->is_boolean())
    return f.fail_value("response_format", "has a json_schema strict that is not true or false");
  try {
    r.response_grammar = JsonGrammar::from_schema((*spec)["schema"], "'response_format' schema");
  } catch (const Error& e) {
    if (!f.error) f.error = bad_param("response_format", e.what());
  }
}

// Nesting depth of a JSON value (a scalar is 0), counted only up to `limit` + 1.
int json_depth(const json& v, int limit) {
  if (limit < 0 || !v.is_structured()) return 0;
  int deepest = 0;
  for (const auto& x : v) deepest = std::max(deepest, json_depth(x, limit - 1));
  return deepest + 1;
}

}  // namespace

json ApiError::to_json() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   Endpoint endpoint) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    return bad_param("",
                     fmt::format("the request body is not valid JSON ({}); send a JSON object with "
                                 "Content-Type: application/json",
                                 e.what()));
  }
  if (!j.is_object())
    return bad_param("",
                     fmt::format("the request body must be a JSON object, got {}", type_name(j)));

  CompletionRequest r;
  r.endpoint = endpoint;
  Fields f(j);
  if (const json* m = f.get("model")) {
    if (m->is_string()) {
      r.model = m->get<std::string>();
    } else {
      f.fail_type("model", "a string", *m);
    }
  }
  if (endpoint == Endpoint::kCompletions) {
    parse_prompt(f, r);
    // Their neutral values (no tools, "none") were always accepted here, and still are.
    const json* tools = f.get("tools");
    if (tools && !(tools->is_array() && tools->empty()))
      f.fail_value("tools", "applies to /v1/chat/completions only");
    const json* choice = f.get("tool_choice");
    if (choice && *choice != "none")
      f.fail_value("tool_choice", "applies to /v1/chat/completions only");
  } else {
    // Parsed again with its key order kept: templates print tool schemas and arguments in it.
    const auto ordered = nlohmann::ordered_json::parse(body);
    if (auto e = parse_chat_messages(ordered, r)) return *e;
    if (auto e = parse_tools(ordered, r)) return *e;
  }
  const char* max_key = f.get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto v = f.integer(max_key)) {
    if (*v <= 0) f.fail_value(max_key, fmt::format("must be at least 1, got {}", *v));
    r.max_tokens = *v;
  }
  if (auto v = f.number("temperature")) {
    if (*v < 0.0) f.fail_value("temperature", fmt::format("must be >= 0 (0 = greedy), got {}", *v));
    r.temperature = static_cast<float>(*v);
  }
  if (auto v = f.number("top_p")) {
    if (!(*v > 0.0 && *v <= 1.0))
      f.fail_value("top_p", fmt::format("must be in (0, 1], got {}", *v));
    r.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k")) {
    // vLLM's convention: -1 (or 0) keeps every token.
    if (*v < -1)
      f.fail_value("top_k", fmt::format("must be -1 or 0 (off) or at least 1, got {}", *v));
    r.top_k = std::max<int64_t>(0, *v);
  }
  if (auto v = f.number("min_p")) {
    if (!(*v >= 0.0 && *v <= 1.0))
      f.fail_value("min_p", fmt::format("must be in [0, 1], got {:g}", *v));
    r.min_p = static_cast<float>(*v);
  }
  if (auto v = f.number("repetition_penalty")) {
    if (!(*v > 0.0))
      f.fail_value("repetition_penalty", fmt::format("must be > 0 (1 = off), got {:g}", *v));
    r.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = f.integer("seed")) r.seed = static_cast<uint64_t>(*v);
  if (auto v = f.integer("n")) {
    if (*v != 1) f.fail_value("n", fmt::format("must be 1 (one choice per request), got {}", *v));
  }
  if (auto v = f.boolean("stream")) r.stream = *v;
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) {
      f.fail_type("stream_options", "an object", *so);
    } else if (const auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) {
        f.fail_type("stream_options", "an object whose include_usage is true or false", *iu);
      } else {
        r.include_usage = iu->get<bool>();
      }
    }
  }
  if (const json* s = f.get("stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const auto& x : *s) {
        if (!x.is_string()) {
          f.fail_value("stop", "must be a string or a list of strings");
          break;
        }
        r.stop.push_back(x.get<std::string>());
      }
      if (r.stop.size() > 4)
        f.fail_value("stop", fmt::format("holds {} strings; at most 4 are allowed", r.stop.size()));
    } else {
      f.fail_type("stop", "a string or a list of strings", *s);
    }
    for (const auto& x : r.stop) {
      if (x.empty()) f.fail_value("stop", "contains an empty string");
    }
  }
  if (auto v = f.boolean("ignore_eos")) r.ignore_eos = *v;
  if (const json* k = f.get("chat_template_kwargs")) {
    if (!k->is_object()) {
      f.fail_type("chat_template_kwargs", "an object", *k);
    } else if (endpoint != Endpoint::kChat) {
      f.fail_value("chat_template_kwargs", "applies to /v1/chat/completions only");
    } else if (json_depth(*k, 16) > 16) {
      f.fail_value("chat_template_kwargs", "is nested more than 16 levels deep");
    } else {
      r.chat_template_kwargs = *k;
    }
  }
  f.unsupported_unless("best_of", 1, "one completion per request");
  f.unsupported_unless("echo", false, "the prompt is not echoed");
  f.unsupported_unless("logprobs", false, "no log-probabilities");
  f.unsupported_unless("top_logprobs", 0, "no log-probabilities");
  f.unsupported_unless("frequency_penalty", 0, "no penalties");
  f.unsupported_unless("presence_penalty", 0, "no penalties");
  f.unsupported_unless("logit_bias", json::object(), "no logit bias");
  f.unsupported_unless("suffix", "", "no insertion");
  f.unsupported_unless("functions", json::array(), "the older form of 'tools'; send 'tools'");
  f.unsupported_unless("function_call", "none",
                       "the older form of 'tool_choice'; send 'tool_choice'");
  f.unsupported_unless("min_tokens", 0, "no minimum length");
  f.unsupported_unless("typical_p", 1, "no typical sampling");
  f.unsupported_unless("use_beam_search", false, "no beam search");
  f.unsupported_unless("length_penalty", 1, "no beam search");
  if (const json* rf = f.get("response_format")) parse_response_format(f, *rf, body, r);
  // Constrained to the value, the reply could not hold a call: refused rather than tools that
  // silently can never be called.
  if (r.response_grammar && !r.tools.is_null() && r.tool_choice != ToolChoice::kNone) {
    f.fail_value("response_format",
                 "cannot be combined with tools the model may call; send \"tool_choice\": "
                 "\"none\" or leave out one of them");
  }
  if (f.error) return *f.error;
  return r;
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {

json tool_call_json(const ToolCall& c) {
  return {{"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

}  // namespace

json completion_response(const ResponseMeta& meta, const std::string& text,
                         std::string_view finish_reason, int64_t prompt_tokens,
                         int64_t completion_tokens, const std::vector<ToolCall>& tool_calls) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  const bool chat = meta.endpoint == Endpoint::kChat;
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    if (!tool_calls.empty()) {
      const bool blank = text.find_first_not_of(" \t\r\n") == std::string::npos;
      if (blank) choice["message"]["content"] = nullptr;
      json calls = json::array();
      for (const auto& c : tool_calls) calls.push_back(tool_call_json(c));
      choice["message"]["tool_calls"] = std::move(calls);
    }
  } else {
    choice["text"] = text;
  }
  return {{"id", meta.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array({choice})},
          {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

json stream_chunk(const ResponseMeta& meta, const std::string& text,
                  std::optional<std::string_view> finish_reason, bool role_delta) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  json choice = {{"index", 0},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)},
                 {"logprobs", nullptr}};
  if (chat) {
    json delta = json::object();
    if (role_delta) delta["role"] = "assistant";
    if (role_delta || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", meta.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array({choice})}};
}

json tool_call_chunk(const ResponseMeta& meta, size_t index, const ToolCall& call) {
  json tc = tool_call_json(call);
  tc["index"] = index;
  json choice = {{"index", 0},
                 {"finish_reason", nullptr},
                 {"logprobs", nullptr},
                 {"delta", {{"tool_calls", json::array({tc})}}}};
  return {{"id", meta.id},
          {"object", "chat.completion.chunk"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array({choice})}};
}

json usage_chunk(const ResponseMeta& meta, int64_t prompt_tokens, int64_t completion_tokens) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  return {{"id", meta.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array()},
          {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

}  // namespace exl3::server
