// Tools over the real server (the conformance model, given a chat template that shows tools):
// the template receives the request's tools and tool turns as transformers would hand them over,
// replies without calls come back as plain content (whole and streamed alike), and requests the
// server cannot honour are refused with 400 naming the field: tools for a template or format that
// cannot show them, tool turns for a format that cannot show them, tool calling turned off.
#include <future>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server_test_util.hpp"
#include "test_support.hpp"

using namespace exl3;
using namespace exl3::server;
using namespace exl3::server::test;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

// Hermes-style: tools as JSON lines, calls as <tool_call> blocks, results with their call id.
constexpr const char* kToolTemplate =
    "{{ bos_token }}{% if tools %}TOOLS:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "{% endif %}{% for m in messages %}{{ m.role }}: {% if m.tool_calls %}{% for c in "
    "m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ "
    "c.function.arguments | tojson }}}</tool_call>{% endfor %}{% elif m.role == 'tool' %}[{{ "
    "m.tool_call_id }}] {{ m.content }}{% else %}{{ m.content }}{% endif %}\n{% endfor %}{% if "
    "add_generation_prompt %}assistant:{% endif %}";

ServerOptions tools_options() {
  ServerOptions o;
  o.model_name = "tiny";
  o.scheduler.max_seqs = 2;
  o.scheduler.step_tokens = 64;
  return o;
}

std::pair<int, json> chat_post(const LiveServer& s, const json& body) {
  auto r = s.client()->Post("/v1/chat/completions", body.dump(), "application/json");
  if (!r) return {-1, nullptr};
  return {r->status, json::parse(r->body, nullptr, false)};
}

// The conformance model in `dir`, with `chat_template` in its tokenizer_config.json.
void copy_model_with_template(const std::filesystem::path& from, const exl3::test::TempDir& dir,
                              const std::string& chat_template) {
  for (const auto& e : std::filesystem::directory_iterator(from))
    std::filesystem::copy_file(e.path(), dir / e.path().filename());
  auto cfg = json::parse(exl3::test::read_file(dir / "tokenizer_config.json"));
  cfg["chat_template"] = chat_template;
  exl3::test::write_file(dir / "tokenizer_config.json", cfg.dump());
}

const json kTool = json::parse(R"({"type": "function", "function": {"name": "get_weather",
    "description": "Weather in a city", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}})");

json tool_conversation() {
  return json::parse(R"([
      {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}])");
}

}  // namespace

TEST(HttpTools, TheTemplateSeesToolsAndToolTurns) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  exl3::test::TempDir tmp;
  copy_model_with_template(tiny_model(conf), tmp, kToolTemplate);
  LiveServer s(tmp.path(), tools_options());
  EXPECT_EQ(s.server().tool_status(), "hermes tool calls");

  const json body = {{"messages", tool_conversation()},
                     {"tools", json::array({kTool})},
                     {"max_tokens", 6},
                     {"temperature", 0}};
  const auto [status, j] = chat_post(s, body);
  ASSERT_EQ(status, 200) << j.dump();
  // What the template must have been given, written out (as transformers renders it, blocks
  // trimmed): the tool as sent (keys in the client's order, which the sorted keys of the request's
  // JSON here happen to match) and the call's arguments as an object.
  const std::string want =
      s.tokenizer().bos_token().value() +
      "TOOLS:\n{\"function\": {\"description\": \"Weather in a city\", \"name\": \"get_weather\", "
      "\"parameters\": {\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
      "[\"city\"], \"type\": \"object\"}}, \"type\": \"function\"}\n"
      "user: Weather in Oslo?"
      "assistant: <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Oslo\"}}</tool_call>"
      "tool: [call_1] -3 Cassistant:";
  const auto prompt = s.tokenizer().encode(want, false);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int64_t>(prompt.size()));

  // This model does not call tools: its reply is the greedy text, as content.
  const auto ref = reference_generate(tmp.path(), prompt, 6, s.options().stop_tokens);
  const std::string text = s.tokenizer().decode(ref.tokens, true);
  const auto& choice = j["choices"][0];
  EXPECT_EQ(choice["message"]["content"], text);
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_EQ(choice["finish_reason"], ref.stopped ? "stop" : "length");

  json streamed = body;
  streamed["stream"] = true;
  auto r = s.client()->Post("/v1/chat/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  std::string got;
  std::string finish;
  for (const auto& d : sse_data(r->body)) {
    if (d == "[DONE]") continue;
    const auto c = json::parse(d)["choices"][0];
    EXPECT_FALSE(c["delta"].contains("tool_calls"));
    if (c["delta"].contains("content")) got += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(got, text);
  EXPECT_EQ(finish, choice["finish_reason"]);

  // tool_choice "none": the same prompt (the tools are still shown), the reply is all content.
  json none = body;
  none["tool_choice"] = "none";
  const auto [status2, j2] = chat_post(s, none);
  ASSERT_EQ(status2, 200) << j2.dump();
  EXPECT_EQ(j2["usage"]["prompt_tokens"], j["usage"]["prompt_tokens"]);
  EXPECT_EQ(j2["choices"][0]["message"]["content"], text);
}

TEST(HttpTools, RefusedWhereTheyCannotWork) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  const json tools_body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                           {"tools", json::array({kTool})},
                           {"max_tokens", 2}};
  auto expect_400 = [](const std::pair<int, json>& r, const char* param, const char* says) {
    EXPECT_EQ(r.first, 400) << r.second.dump();
    EXPECT_EQ(r.second["error"]["param"], param);
    EXPECT_THAT(r.second["error"]["message"].get<std::string>(), HasSubstr(says));
  };
  {
    // A template that never reads `tools`: refused, unless the client does without them.
    exl3::test::TempDir tmp;
    copy_model_with_template(
        tiny_model(conf), tmp,
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:");
    LiveServer s(tmp.path(), tools_options());
    EXPECT_THAT(s.server().tool_status(), HasSubstr("does not show tools"));
    expect_400(chat_post(s, tools_body), "tools", "does not show tools to the model");
    expect_400(chat_post(s, tools_body), "tools", "\"tool_choice\": \"none\"");
    json none = tools_body;
    none["tool_choice"] = "none";
    EXPECT_EQ(chat_post(s, none).first, 200);
    expect_400(chat_post(s, {{"messages", tool_conversation()}, {"max_tokens", 2}}), "messages",
               "cannot show to the model");
  }
  {
    // A native format shows no tools and no tool turns.
    auto o = tools_options();
    o.chat_format = ChatFormat::kPlain;
    LiveServer s(tiny_model(conf), o);
    expect_400(chat_post(s, tools_body), "tools", "the chat format plain cannot show tools");
    expect_400(chat_post(s, {{"messages", tool_conversation()}, {"max_tokens", 2}}), "messages",
               "the chat format plain");
  }
  exl3::test::TempDir tmp;
  copy_model_with_template(tiny_model(conf), tmp, kToolTemplate);
  {
    // Tool calling turned off.
    auto o = tools_options();
    o.tool_parser = ToolParser::kNone;
    LiveServer s(tmp.path(), o);
    expect_400(chat_post(s, tools_body), "tools", "--tool-parser none");
  }
  {
    // A template whose call format is not recognized needs --tool-parser.
    exl3::test::TempDir plain_tools;
    copy_model_with_template(
        tiny_model(conf), plain_tools,
        "{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}");
    LiveServer s(plain_tools.path(), tools_options());
    expect_400(chat_post(s, tools_body), "tools", "--tool-parser hermes|llama3|mistral");
    auto o = tools_options();
    o.tool_parser = ToolParser::kHermes;
    LiveServer forced(plain_tools.path(), o);
    EXPECT_EQ(forced.server().tool_status(), "hermes tool calls");
    EXPECT_EQ(chat_post(forced, tools_body).first, 200);
  }
}

// A forced call is generated in the parser's format, whatever the (random) model prefers: the
// reply holds only calls (exactly one, but for Mistral's list), their arguments satisfy the
// function's schema, and it ends with finish_reason "tool_calls"; a named function is the one
// called. Each parser's format is read back by that parser, so the shape must match it.
TEST(HttpTools, ForcedCallsFollowTheFormatAndSchema) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  exl3::test::TempDir tmp;
  copy_model_with_template(tiny_model(conf), tmp, kToolTemplate);
  const json now = json::parse(R"({"type": "function", "function": {"name": "now",
      "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}, "digits":
      {"enum": [1, 2, 3]}}, "required": ["utc", "digits"], "additionalProperties": false}}})");
  const json weather_enum = json::parse(R"({"type": "function", "function": {"name":
      "get_weather", "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo",
      "Rome"]}}, "required": ["city"]}}})");
  int calls = 0;
  for (const auto parser : {ToolParser::kHermes, ToolParser::kLlama3, ToolParser::kMistral}) {
    ServerOptions o = tools_options();
    o.tool_parser = parser;
    LiveServer s(tmp.path(), o);
    for (const json& choice :
         {json("required"), json{{"type", "function"}, {"function", {{"name", "now"}}}}}) {
      // Run together (batched), which keeps the test fast under sanitizers.
      std::vector<std::future<std::pair<int, json>>> replies;
      for (const int seed : {1, 2}) {
        const json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                           {"tools", json::array({weather_enum, now})},
                           {"tool_choice", choice},
                           {"max_tokens", 300},
                           {"temperature", 1.0},
                           {"seed", seed}};
        replies.push_back(
            std::async(std::launch::async, [&s, body] { return chat_post(s, body); }));
      }
      for (auto& reply : replies) {
        const auto [status, j] = reply.get();
        ASSERT_EQ(status, 200) << j.dump();
        const auto& c = j["choices"][0];
        EXPECT_EQ(c["finish_reason"], "tool_calls") << j.dump();
        EXPECT_TRUE(c["message"]["content"].is_null()) << j.dump();
        const auto& tool_calls = c["message"]["tool_calls"];
        ASSERT_TRUE(tool_calls.is_array() && !tool_calls.empty()) << j.dump();
        if (parser != ToolParser::kMistral) {
          EXPECT_EQ(tool_calls.size(), 1u) << j.dump();
        }
        for (const auto& call : tool_calls) {
          const auto& fn = call["function"];
          const json args = json::parse(fn["arguments"].get<std::string>());
          if (choice.is_object()) {
            EXPECT_EQ(fn["name"], "now");
          }
          if (fn["name"] == "now") {
            EXPECT_TRUE(args["utc"].is_boolean()) << args;
            EXPECT_THAT(args["digits"].get<int>(), ::testing::AnyOf(1, 2, 3));
            EXPECT_EQ(args.size(), 2u) << args;
          } else {
            EXPECT_EQ(fn["name"], "get_weather");
            EXPECT_THAT(args["city"].get<std::string>(), ::testing::AnyOf("Oslo", "Rome"));
          }
        }
        ++calls;
      }
    }
  }
  EXPECT_EQ(calls, 12);
  LiveServer s(tmp.path(), tools_options());
  // A parameters schema outside the subset cannot be forced: a 400 naming tools and the keyword.
  json bad = weather_enum;
  bad["function"]["parameters"]["properties"]["city"] = {{"type", "string"}, {"maxLength", 9}};
  const auto [status, j] = chat_post(s, {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                         {"tools", json::array({bad})},
                                         {"tool_choice", "required"}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "tools");
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("'maxLength'"));
}

// "parallel_tool_calls": false makes a forced Mistral list exactly one call (Hermes and Llama
// force one already), and is accepted with "auto"; a tool's "strict": true is accepted forced
// and under "auto" (with a call format that has a marker), and a strict schema outside the
// subset is a 400 naming the keyword.
TEST(HttpTools, OneCallAtMostAndStrictTools) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  exl3::test::TempDir tmp;
  copy_model_with_template(tiny_model(conf), tmp, kToolTemplate);
  json f = json::parse(R"({"type": "function", "function": {"name": "f", "strict": true,
      "parameters": {"type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"],
      "additionalProperties": false}}})");
  // Both schemas short, so that a forced call always fits in max_tokens (an unconstrained object
  // of arguments can run on past it, and a cut call comes back as content).
  const json g = json::parse(R"({"type": "function", "function": {"name": "g", "parameters":
      {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}})");
  const json hi = json::array({{{"role", "user"}, {"content", "Hi"}}});
  ServerOptions o = tools_options();
  o.tool_parser = ToolParser::kMistral;
  LiveServer s(tmp.path(), o);
  auto rng = exl3::test::make_rng();
  std::vector<std::future<std::pair<int, json>>> replies;
  for (int i = 0; i < 3; ++i) {
    const json body = {{"messages", hi},
                       {"tools", json::array({f, g})},
                       {"tool_choice", "required"},
                       {"parallel_tool_calls", false},
                       {"max_tokens", 200},
                       {"temperature", 1.0},
                       {"seed", rng() % 100000}};
    replies.push_back(std::async(std::launch::async, [&s, body] { return chat_post(s, body); }));
  }
  for (auto& reply : replies) {
    const auto [status, j] = reply.get();
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j.dump();
    const auto& message = j["choices"][0]["message"];
    ASSERT_TRUE(message.contains("tool_calls")) << j.dump();
    const auto& tool_calls = message["tool_calls"];
    ASSERT_EQ(tool_calls.size(), 1u) << j.dump();
    const auto& fn = tool_calls[0]["function"];
    if (fn["name"] == "f") {
      const json args = json::parse(fn["arguments"].get<std::string>());
      EXPECT_THAT(args["n"].get<int>(), ::testing::AnyOf(1, 2)) << args;
      EXPECT_EQ(args.size(), 1u) << args;
    }
  }
  // "auto" with one call at most and no strict tool is served.
  auto [status, j] = chat_post(s, {{"messages", hi},
                                   {"tools", json::array({g})},
                                   {"parallel_tool_calls", false},
                                   {"max_tokens", 4}});
  EXPECT_EQ(status, 200) << j.dump();
  // A strict tool under "auto": served (a call the reply starts is generated under the schema,
  // which tests/server/scheduler_test.cpp checks); a strict schema outside the subset is a 400
  // naming the keyword.
  std::tie(status, j) =
      chat_post(s, {{"messages", hi}, {"tools", json::array({f, g})}, {"max_tokens", 8}});
  EXPECT_EQ(status, 200) << j.dump();
  auto bad = f;
  bad["function"]["name"] = "h";
  bad["function"]["parameters"]["properties"]["n"] = {{"type", "integer"}, {"minimum", 0}};
  std::tie(status, j) =
      chat_post(s, {{"messages", hi}, {"tools", json::array({bad})}, {"max_tokens", 4}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "tools");
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("'minimum'"));
  // ... and a non-strict one with such a schema takes any object instead.
  bad["function"].erase("strict");
  std::tie(status, j) =
      chat_post(s, {{"messages", hi}, {"tools", json::array({f, bad})}, {"max_tokens", 4}});
  EXPECT_EQ(status, 200) << j.dump();
  // Llama's call is the whole reply, with no marker to start the constraint at: a strict tool
  // under "auto" is refused there, saying how to force the call.
  {
    ServerOptions lo = tools_options();
    lo.tool_parser = ToolParser::kLlama3;
    LiveServer llama(tmp.path(), lo);
    std::tie(status, j) =
        chat_post(llama, {{"messages", hi}, {"tools", json::array({f})}, {"max_tokens", 4}});
    EXPECT_EQ(status, 400);
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("tool_choice"));
    std::tie(status, j) = chat_post(llama, {{"messages", hi},
                                            {"tools", json::array({f})},
                                            {"tool_choice", "required"},
                                            {"max_tokens", 200}});
    EXPECT_EQ(status, 200) << j.dump();
  }
  // With "tool_choice": "none" nothing is called, so strict has nothing to hold.
  std::tie(status, j) = chat_post(
      s,
      {{"messages", hi}, {"tools", json::array({g})}, {"tool_choice", "none"}, {"max_tokens", 4}});
  EXPECT_EQ(status, 200) << j.dump();
}
