// OpenAI request parsing: every field's wrong types and values give a 400 naming the field, the
// accepted forms parse to the right values, and the response shapes are OpenAI's.
#include <string>
#include <variant>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/server/openai.hpp"

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
