// The chat-only parts of a /v1/chat/completions body: `messages` (text turns, assistant tool
// calls, tool results) and `tools` / `tool_choice`, read from the body parsed with its key order
// kept, since the chat template shows tool schemas and call arguments in the client's order.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "exl3/server/openai.hpp"

namespace exl3::server {

// A 400 naming the request field `param` (the OpenAI error body's `param`).
ApiError bad_param(std::string param, std::string message);

// Fills r.messages and r.template_messages from body["messages"]; the 400 naming `messages`
// otherwise.
std::optional<ApiError> parse_chat_messages(const nlohmann::ordered_json& body,
                                            CompletionRequest& r);
// Fills r.tools and r.tool_choice from body["tools"], body["tool_choice"] and
// body["parallel_tool_calls"]; the 400 naming the field otherwise.
std::optional<ApiError> parse_tools(const nlohmann::ordered_json& body, CompletionRequest& r);

}  // namespace exl3::server
