// The OpenAI API surface of `exl3 serve`, without any HTTP: parsing and validating
// /v1/completions and /v1/chat/completions bodies, and building the response objects, error
// objects and server-sent-event chunks, shaped as OpenAI's (and vLLM's) servers shape them.
//
// Supported request fields: model, prompt (string, token-id list, or a one-element list of
// either), messages (roles system/user/assistant/tool; content a string or text parts; assistant
// tool_calls), tools and tool_choice ("none", "auto", "required" or a named function),
// max_tokens / max_completion_tokens,
// temperature, top_p, seed, stop (string or up to 4 strings), stream,
// stream_options.include_usage, response_format (text, json_object, json_schema: see
// exl3/text/json_schema.hpp for the schema subset), and vLLM's ignore_eos and
// chat_template_kwargs. Fields that would change the result but are not implemented (n > 1,
// best_of > 1, echo, logprobs, penalties, logit_bias, suffix, functions, a schema keyword outside
// the subset) are refused with 400 rather than silently ignored; fields
// without effect on the output (user, ...) are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/text/chat_template.hpp"
#include "exl3/text/json_schema.hpp"

namespace exl3::server {

// An OpenAI error object: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field; null when empty
  std::string code;   // e.g. "context_length_exceeded", "model_not_found"; null when empty
  nlohmann::json to_json() const;
};

enum class Endpoint : uint8_t { kCompletions, kChat };

// Whether the model may call the request's tools ("auto"), not ("none"), or must call one of them
// ("required") or the named one (kFunction): a forced call is generated under a grammar of the
// model family's call format.
enum class ToolChoice : uint8_t { kNone, kAuto, kRequired, kFunction };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // empty when the client sent none
  // /v1/completions: text, or token ids when prompt_is_ids.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  // /v1/chat/completions
  std::vector<ChatMessage> messages;
  // The same turns as the chat template receives them (key order kept): role, content (null for
  // an assistant turn that only calls tools), name, tool_calls (arguments as JSON objects, not
  // text) and tool_call_id.
  nlohmann::ordered_json template_messages = nlohmann::ordered_json::array();
  bool has_tool_traffic = false;  // some turn carries tool calls or is a tool result
  // The request's tools as sent (a list of {"type": "function", "function": {...}}); null when
  // none.
  nlohmann::ordered_json tools;
  ToolChoice tool_choice = ToolChoice::kNone;  // kAuto by default when there are tools
  std::string tool_choice_function;            // kFunction: the function's name
  // "parallel_tool_calls": false: the reply holds at most one call (what follows it is dropped,
  // and a forced call is exactly one).
  bool parallel_tool_calls = true;
  // Some tool sets "strict": true: its call's arguments must follow its parameters schema (a
  // forced call always does; under "auto" the server constrains a call once its marker appears).
  bool strict_tools = false;
  // vLLM's chat_template_kwargs: extra variables for the model's chat template (enable_thinking,
  // ...); an object, empty when the client sent none.
  nlohmann::json chat_template_kwargs = nlohmann::json::object();

  std::optional<int64_t> max_tokens;  // > 0 when set
  float temperature = 1.0f;           // OpenAI's default
  float top_p = 1.0f;
  int64_t top_k = 0;                // 0 = off (the request's -1 too)
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool ignore_eos = false;
  // response_format json_object / json_schema: the grammar the reply must follow; null for text.
  std::shared_ptr<const JsonGrammar> response_grammar;
};

// Parses a request body. Returns the request, or the 400 error naming the field at fault.
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   Endpoint endpoint);

// What every response object of one request shares.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

// A tool call of the reply, as OpenAI returns it.
struct ToolCall {
  std::string id;         // "call_..."
  std::string name;       // the function
  std::string arguments;  // a JSON object, as text
};

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// The complete (non-streamed) response: text_completion or chat.completion. With tool calls, the
// chat message carries them, and its content is null when the text is only white space.
nlohmann::json completion_response(const ResponseMeta& meta, const std::string& text,
                                   std::string_view finish_reason, int64_t prompt_tokens,
                                   int64_t completion_tokens,
                                   const std::vector<ToolCall>& tool_calls = {});
// A chat chunk whose delta is one whole tool call (index, id, type, function name and
// arguments).
nlohmann::json tool_call_chunk(const ResponseMeta& meta, size_t index, const ToolCall& call);
// One streamed chunk: new text (chat: delta.content; `role_delta` sends delta.role instead), and
// finish_reason when set.
nlohmann::json stream_chunk(const ResponseMeta& meta, const std::string& text,
                            std::optional<std::string_view> finish_reason, bool role_delta = false);
// The last chunk of stream_options.include_usage: no choices, usage.
nlohmann::json usage_chunk(const ResponseMeta& meta, int64_t prompt_tokens,
                           int64_t completion_tokens);
// "data: {json}\n\n" (invalid UTF-8 replaced, never thrown on).
std::string sse_event(const nlohmann::json& j);
// JSON text for an HTTP body (invalid UTF-8 replaced).
std::string dump(const nlohmann::json& j);

}  // namespace exl3::server
