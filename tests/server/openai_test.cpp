// OpenAI request parsing: every field's wrong types and values give a 400 naming the field, the
// accepted forms parse to the right values, and the response shapes are OpenAI's.
#include <string>
#include <variant>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/server/openai.hpp"
#include "exl3/text/json_schema.hpp"

using namespace exl3::server;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

ApiError error_of(const std::string& body, Endpoint ep = Endpoint::kCompletions) {
  auto r = parse_completion_request(body, ep);
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  return std::get<ApiError>(r);
}

CompletionRequest ok_of(const std::string& body, Endpoint ep = Endpoint::kCompletions) {
  auto r = parse_completion_request(body, ep);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "refused: " << body << ": " << e->message;
    return {};
  }
  return std::get<CompletionRequest>(r);
}

}  // namespace

TEST(OpenAiParse, RefusesBadBodiesNamingTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {"{", "", "not valid JSON"},
      {"[1, 2]", "", "must be a JSON object"},
      {"{}", "prompt", "required"},
      {R"({"prompt": 5})", "prompt", "a string or a list of token ids"},
      {R"({"prompt": ""})", "prompt", "empty"},
      {R"({"prompt": []})", "prompt", "empty token list"},
      {R"({"prompt": [1, -2]})", "prompt", "non-negative"},
      {R"({"prompt": ["a", "b"]})", "prompt", "one prompt per request"},
      {R"({"prompt": "x", "model": 3})", "model", "a string"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "at least 1"},
      {R"({"prompt": "x", "max_tokens": -5})", "max_tokens", "at least 1"},
      {R"({"prompt": "x", "max_tokens": "5"})", "max_tokens", "an integer"},
      {R"({"prompt": "x", "max_tokens": 2.5})", "max_tokens", "an integer"},
      {R"({"prompt": "x", "temperature": -0.1})", "temperature", ">= 0"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature", "a number"},
      {R"({"prompt": "x", "top_p": 0})", "top_p", "(0, 1]"},
      {R"({"prompt": "x", "top_p": 1.5})", "top_p", "(0, 1]"},
      {R"({"prompt": "x", "n": 2})", "n", "must be 1"},
      {R"({"prompt": "x", "stream": "yes"})", "stream", "true or false"},
      {R"({"prompt": "x", "stop": [""]})", "stop", "empty string"},
      {R"({"prompt": "x", "stop": 7})", "stop", "a string or a list"},
      {R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "stop", "at most 4"},
      {R"({"prompt": "x", "seed": "1"})", "seed", "an integer"},
      {R"({"prompt": "x", "logprobs": 5})", "logprobs", "not supported"},
      {R"({"prompt": "x", "presence_penalty": 0.5})", "presence_penalty", "not supported"},
      {R"({"prompt": "x", "echo": true})", "echo", "not supported"},
      {R"({"prompt": "x", "stream_options": 1})", "stream_options", "an object"},
      {R"({"prompt": "x", "chat_template_kwargs": {"a": 1}})", "chat_template_kwargs",
       "chat/completions only"},
      {R"({"prompt": "x", "chat_template_kwargs": [1]})", "chat_template_kwargs", "an object"},
  };
  for (const auto& c : cases) {
    const auto e = error_of(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_THAT(e.message, HasSubstr(c.says)) << c.body;
    const auto j = e.to_json();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["message"], e.message);
  }
}

TEST(OpenAiParse, RefusesBadChatMessages) {
  for (const char* body :
       {R"({})", R"({"messages": []})", R"({"messages": {}})", R"({"messages": ["hi"]})",
        R"({"messages": [{"content": "hi"}]})",
        R"({"messages": [{"role": "robot", "content": "x"}]})",
        R"({"messages": [{"role": "user"}]})", R"({"messages": [{"role": "user", "content": 5}]})",
        R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"}) {
    const auto e = error_of(body, Endpoint::kChat);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, "messages") << body;
  }
}

TEST(OpenAiParse, AcceptsTheDocumentedForms) {
  auto r =
      ok_of(R"({"model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0, "top_p": 0.5,
                     "seed": 42, "stop": "\n", "stream": true, "stream_options": {"include_usage": true},
                     "n": 1, "user": "ignored", "logprobs": null, "frequency_penalty": 0})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "Hello");
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);

  r = ok_of(R"({"prompt": [[5, 6, 7]], "ignore_eos": true})");
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_EQ(r.temperature, 1.0f);  // OpenAI's default

  r = ok_of(R"({"messages": [{"role": "developer", "content": "Be brief."},
                             {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
                "max_completion_tokens": 3})",
            Endpoint::kChat);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(r.max_tokens, 3);
  EXPECT_TRUE(r.chat_template_kwargs.empty());

  r = ok_of(R"({"messages": [{"role": "user", "content": "Hi"}],
                "chat_template_kwargs": {"enable_thinking": false, "custom": [1, "x"]}})",
            Endpoint::kChat);
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(r.chat_template_kwargs["custom"][1], "x");

  // Deep nesting is refused before anything walks it recursively.
  const std::string deep = std::string(17, '[') + std::string(17, ']');
  const auto e = error_of(
      R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"a": )" + deep +
          "}}",
      Endpoint::kChat);
  EXPECT_EQ(e.param, "chat_template_kwargs");
  EXPECT_THAT(e.message, HasSubstr("nested more than 16 levels"));
}

TEST(OpenAiShapes, CompletionChunkAndUsage) {
  ResponseMeta meta{Endpoint::kChat, "chatcmpl-1", 123, "tiny"};
  const auto whole = completion_response(meta, "hi", "length", 4, 2);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["total_tokens"], 6);
  const auto first = stream_chunk(meta, "", std::nullopt, true);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const auto last = stream_chunk(meta, "", "stop");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  meta.endpoint = Endpoint::kCompletions;
  EXPECT_EQ(stream_chunk(meta, "x", std::nullopt)["choices"][0]["text"], "x");
  EXPECT_EQ(usage_chunk(meta, 1, 2)["choices"].size(), 0u);
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  // Invalid UTF-8 never throws on the way out.
  EXPECT_NO_THROW(dump(json(std::string("\xff"))));
}

namespace {

const char* kWeatherTool = R"({"type": "function", "function": {"name": "get_weather",
    "description": "Weather in a city", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}})";

std::string chat_with(const std::string& extra) {
  return R"({"messages": [{"role": "user", "content": "Hi"}], )" + extra + "}";
}

}  // namespace

TEST(OpenAiParse, RefusesBadToolsNamingTheField) {
  const std::string tools = std::string(R"("tools": [)") + kWeatherTool + "]";
  struct Case {
    std::string body;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {chat_with(R"("tools": {})"), "tools", "must be a list"},
      {chat_with(R"("tools": [1])"), "tools", "item 0 must be an object"},
      {chat_with(R"("tools": [{"type": "retrieval"}])"), "tools", "'type' must be \"function\""},
      {chat_with(R"("tools": [{"type": "function"}])"), "tools", "needs a 'function' object"},
      {chat_with(R"("tools": [{"type": "function", "function": {"name": "a b"}}])"), "tools",
       "function.name must be 1 to 64"},
      {chat_with(R"("tools": [{"type": "function", "function": {}}])"), "tools",
       "function.name must be 1 to 64"},
      {chat_with(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])"),
       "tools", "function.parameters must be a JSON schema object"},
      {chat_with(R"("tools": [{"type": "function", "function": {"name": "f", "description": 1}}])"),
       "tools", "function.description must be a string"},
      {chat_with(R"("tools": [{"type": "function", "function": {"name": "f", "strict": 1}}])"),
       "tools", "function.strict must be true or false"},
      {chat_with(std::string(R"("tools": [)") + kWeatherTool + "," + kWeatherTool + "]"), "tools",
       "'get_weather' is used twice"},
      {chat_with(R"("tool_choice": "required")"), "tool_choice", "no 'tools'"},
      {chat_with(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})"),
       "tool_choice", "'nope', which is not in 'tools'"},
      {chat_with(tools + R"(, "tool_choice": "sometimes")"), "tool_choice", "must be \"none\""},
      {chat_with(tools + R"(, "tool_choice": {"name": "get_weather"})"), "tool_choice",
       "must be \"none\""},
      {chat_with(R"("tool_choice": "auto")"), "tool_choice", "no 'tools'"},
      {chat_with(tools + R"(, "parallel_tool_calls": 1)"), "parallel_tool_calls", "true or false"},
      {chat_with(R"("functions": [{"name": "f"}])"), "functions", "send 'tools'"},
      {chat_with(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": )" +
                 std::string(40, '[') + std::string(40, ']') + "}}]"),
       "tools", "must be a JSON schema object"},
      {chat_with(
           R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": )" +
           std::string(40, '[') + std::string(40, ']') + "}}}]"),
       "tools", "nests more than 32 levels deep"},
      {chat_with(R"("function_call": "auto")"), "function_call", "send 'tool_choice'"},
  };
  for (const auto& c : cases) {
    const auto e = error_of(c.body, Endpoint::kChat);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_THAT(e.message, HasSubstr(c.says)) << c.body;
  }
  // Forced calls are accepted (the server generates them under a grammar).
  EXPECT_EQ(ok_of(chat_with(tools + R"(, "tool_choice": "required")"), Endpoint::kChat).tool_choice,
            ToolChoice::kRequired);
  const auto named = ok_of(
      chat_with(tools +
                R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"),
      Endpoint::kChat);
  EXPECT_EQ(named.tool_choice, ToolChoice::kFunction);
  EXPECT_EQ(named.tool_choice_function, "get_weather");
  auto e = error_of(R"({"prompt": "x", "tools": [1]})");
  EXPECT_EQ(e.param, "tools");
  EXPECT_THAT(e.message, HasSubstr("chat/completions only"));
  e = error_of(R"({"prompt": "x", "tool_choice": "auto"})");
  EXPECT_EQ(e.param, "tool_choice");
  EXPECT_THAT(e.message, HasSubstr("chat/completions only"));
  // The neutral values stay accepted on /v1/completions, as before tools existed.
  ok_of(R"({"prompt": "x", "tools": [], "tool_choice": "none"})");
}

TEST(OpenAiParse, RefusesBadToolTurns) {
  const auto turn = [](const std::string& msg) {
    return R"({"messages": [{"role": "user", "content": "Hi"}, )" + msg + "]}";
  };
  struct Case {
    std::string body;
    const char* says;
  };
  const Case cases[] = {
      {turn(R"({"role": "assistant", "tool_calls": {}})"), "tool_calls must be a list"},
      {turn(R"({"role": "assistant", "tool_calls": [1]})"), "item 0 must be an object"},
      {turn(R"({"role": "assistant", "tool_calls": [{"type": "x", "function": {"name": "f"}}]})"),
       "type must be \"function\""},
      {turn(R"({"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f"}}]})"),
       "id must be a string"},
      {turn(R"({"role": "assistant", "tool_calls": [{"id": "c"}]})"), "needs a 'function' object"},
      {turn(R"({"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]})"),
       "function.name must be a non-empty string"},
      {turn(
           R"({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]})"),
       "a JSON object written as a string"},
      {turn(
           R"({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]})"),
       "a JSON object written as a string"},
      {turn(
           R"({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]})"),
       "a string holding a JSON object"},
      {turn(R"({"role": "assistant", "tool_calls": []})"), "has no 'content'"},
      {turn(R"({"role": "tool", "content": "21 C"})"), "needs a string 'tool_call_id'"},
      {turn(
           R"({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": )" +
           std::string(40, '[') + std::string(40, ']') + "}}}]}"),
       "nest more than 32 levels deep"},
      {turn(R"({"role": "tool", "content": "21 C", "tool_call_id": 7})"),
       "needs a string 'tool_call_id'"},
      {turn(R"({"role": "user", "content": "x", "name": 1})"), "'name' must be a string"},
  };
  for (const auto& c : cases) {
    const auto e = error_of(c.body, Endpoint::kChat);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, "messages") << c.body;
    EXPECT_THAT(e.message, HasSubstr(c.says)) << c.body;
    EXPECT_THAT(e.message, HasSubstr("item 1")) << c.body;
  }
}

TEST(OpenAiParse, ToolsAndToolTurnsForTheTemplate) {
  // Tools go to the template as sent, key order kept; arguments text becomes an object, as
  // transformers expects; tool results keep their call id.
  const std::string body = std::string(R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"unit\": \"c\", \"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "-3 C"}]},
      {"role": "assistant", "content": "Cold.", "tool_calls": [{"function": {"name": "f", "arguments": {"z": 1, "a": 2}}}]}],
    "tools": [)") + kWeatherTool +
                           "]}";
  const auto r = ok_of(body, Endpoint::kChat);
  EXPECT_EQ(r.tool_choice, ToolChoice::kAuto);
  EXPECT_TRUE(r.has_tool_traffic);
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].dump(), nlohmann::ordered_json::parse(kWeatherTool).dump());
  const auto& m = r.template_messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_TRUE(m[1]["content"].is_null());
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"unit":"c","city":"Oslo"})");
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(m[2].dump(), R"({"role":"tool","content":"-3 C","tool_call_id":"call_1"})");
  EXPECT_EQ(m[3]["content"], "Cold.");
  EXPECT_EQ(m[3]["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":2})");
  EXPECT_EQ(r.messages[2].content, "-3 C");

  auto none = ok_of(chat_with(std::string(R"("tools": [)") + kWeatherTool +
                              R"(], "tool_choice": "none", "parallel_tool_calls": true)"),
                    Endpoint::kChat);
  EXPECT_EQ(none.tool_choice, ToolChoice::kNone);
  EXPECT_TRUE(none.parallel_tool_calls);
  EXPECT_FALSE(none.strict_tools);
  EXPECT_EQ(none.tools.size(), 1u) << "tools are still shown to the template";
  EXPECT_FALSE(none.has_tool_traffic);
  const auto plain = ok_of(chat_with(R"("tools": [], "tool_choice": "none")"), Endpoint::kChat);
  EXPECT_TRUE(plain.tools.is_null());
  EXPECT_EQ(plain.template_messages.dump(), R"([{"role":"user","content":"Hi"}])");
}

// "parallel_tool_calls": false and a tool's "strict": true are read (the server enforces them).
TEST(OpenAiParse, ParallelToolCallsAndStrict) {
  const std::string strict_tool =
      R"({"type": "function", "function": {"name": "f", "strict": true, "parameters":
         {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}})";
  const auto r = ok_of(chat_with(std::string(R"("tools": [)") + kWeatherTool + "," + strict_tool +
                                 R"(], "parallel_tool_calls": false)"),
                       Endpoint::kChat);
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_TRUE(r.strict_tools);
  const auto loose =
      ok_of(chat_with(std::string(R"("tools": [)") + kWeatherTool + "]"), Endpoint::kChat);
  EXPECT_TRUE(loose.parallel_tool_calls);
  EXPECT_FALSE(loose.strict_tools);
}

TEST(OpenAiShapes, ToolCalls) {
  const ResponseMeta meta{Endpoint::kChat, "chatcmpl-1", 123, "tiny"};
  const std::vector<ToolCall> calls = {{"call_a", "f", R"({"x":1})"}, {"call_b", "g", "{}"}};
  auto whole = completion_response(meta, "\n", "tool_calls", 4, 9, calls);
  const auto& msg = whole["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null()) << "white space around calls is no answer";
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][1], json({{"id", "call_b"},
                                        {"type", "function"},
                                        {"function", {{"name", "g"}, {"arguments", "{}"}}}}));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  whole = completion_response(meta, "I will look.", "tool_calls", 4, 9, calls);
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "I will look.");
  whole = completion_response(meta, "", "stop", 4, 9);
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "");
  EXPECT_FALSE(whole["choices"][0]["message"].contains("tool_calls"));
  const auto chunk = tool_call_chunk(meta, 1, calls[1]);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  const auto& tc = chunk["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(tc["index"], 1);
  EXPECT_EQ(tc["id"], "call_b");
  EXPECT_EQ(tc["function"]["name"], "g");
  EXPECT_EQ(tc["function"]["arguments"], "{}");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
}

TEST(OpenAiParse, ResponseFormat) {
  EXPECT_EQ(ok_of(R"({"prompt": "x"})").response_grammar, nullptr);
  EXPECT_EQ(ok_of(R"({"prompt": "x", "response_format": {"type": "text"}})").response_grammar,
            nullptr);
  EXPECT_NE(
      ok_of(R"({"prompt": "x", "response_format": {"type": "json_object"}})").response_grammar,
      nullptr);
  const auto r = ok_of(R"({"prompt": "x", "response_format": {"type": "json_schema",
      "json_schema": {"name": "p", "strict": false, "schema": {"type": "object", "properties":
      {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["b", "a"]}}}})");
  ASSERT_NE(r.response_grammar, nullptr);
  // Properties keep the schema's order (b before a), not the sorted order.
  exl3::JsonMatcher m(r.response_grammar);
  EXPECT_TRUE(m.feed(R"({"b":1,"a":"x"})"));
  EXPECT_TRUE(m.finished());
  struct Case {
    const char* format;
    const char* says;
  };
  const Case cases[] = {
      {R"("json")", "must be an object"},
      {R"({"type": "xml"})", "use \"text\", \"json_object\" or \"json_schema\""},
      {R"({"type": "json_schema"})", "needs a 'json_schema' object"},
      {R"({"type": "json_schema", "json_schema": {"name": 5, "schema": {}}})", "name"},
      {R"({"type": "json_schema", "json_schema": {"strict": "yes", "schema": {}}})", "strict"},
      {R"({"type": "json_schema", "json_schema": {"schema": {"type": "string", "format":
          "email"}}})",
       "at #/format: the keyword 'format' is not supported"},
      {R"({"type": "json_schema", "json_schema": {"schema": {"properties": {"a": {"type":
          "number", "minimum": 1}}}}})",
       "at #/properties/a/minimum"},
  };
  for (const auto& c : cases) {
    const auto e = error_of(fmt::format(R"({{"prompt": "x", "response_format": {}}})", c.format));
    EXPECT_EQ(e.param, "response_format") << c.format;
    EXPECT_THAT(e.message, HasSubstr(c.says)) << c.format;
  }
  const std::string tools =
      R"("messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
      "function": {"name": "f"}}], "response_format": {"type": "json_object"})";
  const auto e = error_of("{" + tools + "}", Endpoint::kChat);
  EXPECT_EQ(e.param, "response_format");
  EXPECT_THAT(e.message, HasSubstr("cannot be combined with tools"));
  EXPECT_NE(ok_of("{" + tools + R"(, "tool_choice": "none"})", Endpoint::kChat).response_grammar,
            nullptr);
}
