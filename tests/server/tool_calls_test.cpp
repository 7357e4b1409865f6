// Tool calls in model replies: each format's calls are found with the text around them kept as
// content, malformed calls come back verbatim as content, and the result does not depend on how
// the reply was cut into pieces (every cut position, and byte by byte). Text that could open a
// call is held back while streaming, text that cannot is released at once.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/server/tool_calls.hpp"
#include "test_support.hpp"

using namespace exl3::server;
using ::testing::MatchesRegex;

namespace {

struct Result {
  std::string content;
  std::vector<ParsedToolCall> calls;
};

void add(Result& r, ToolCallExtractor::Output o) {
  r.content += o.content;
  for (auto& c : o.calls) r.calls.push_back(std::move(c));
}

Result run(ToolParser p, const std::vector<std::string>& pieces, size_t max_calls = SIZE_MAX) {
  ToolCallExtractor x(p, max_calls);
  Result r;
  for (const auto& s : pieces) add(r, x.push(s));
  add(r, x.finish());
  EXPECT_EQ(x.calls(), r.calls.size());
  return r;
}

// The reply whole, then cut once at every position and fed byte by byte: all must agree.
Result run_all_cuts(ToolParser p, const std::string& text, size_t max_calls = SIZE_MAX) {
  const Result whole = run(p, {text}, max_calls);
  for (size_t i = 0; i <= text.size(); ++i) {
    const Result cut = run(p, {text.substr(0, i), text.substr(i)}, max_calls);
    EXPECT_EQ(cut.content, whole.content) << "cut at " << i << " of: " << text;
    EXPECT_EQ(cut.calls, whole.calls) << "cut at " << i << " of: " << text;
  }
  std::vector<std::string> bytes;
  for (const char c : text) bytes.emplace_back(1, c);
  const Result each = run(p, bytes, max_calls);
  EXPECT_EQ(each.content, whole.content) << "byte by byte: " << text;
  EXPECT_EQ(each.calls, whole.calls) << "byte by byte: " << text;
  return whole;
}

ParsedToolCall call(std::string name, std::string args) {
  return {std::move(name), std::move(args)};
}

}  // namespace

TEST(ToolCalls, HermesCallsWithTextAround) {
  const auto r = run_all_cuts(ToolParser::kHermes,
                              "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
                              "\"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
                              "</tool_call>");
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], call("get_weather", R"({"city":"Paris","unit":"celsius"})"));

  // Several calls; the white space between and after them is not content, text after them is.
  const std::string two =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"z\": 1, \"b\": [1, {\"c\": null}]}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n";
  auto r2 = run_all_cuts(ToolParser::kHermes, two);
  EXPECT_EQ(r2.content, "");
  ASSERT_EQ(r2.calls.size(), 2u);
  EXPECT_EQ(r2.calls[0], call("a", R"({"z":1,"b":[1,{"c":null}]})")) << "key order is kept";
  EXPECT_EQ(r2.calls[1], call("b", "{}"));
  r2 = run_all_cuts(ToolParser::kHermes, two + "\nDone: é 日本");
  EXPECT_EQ(r2.content, "\n\nDone: é 日本");
  EXPECT_EQ(r2.calls.size(), 2u);

  // An unclosed block at the end still counts when its JSON is whole.
  const auto r3 = run_all_cuts(ToolParser::kHermes,
                               "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"}{\"}}\n");
  ASSERT_EQ(r3.calls.size(), 1u);
  EXPECT_EQ(r3.calls[0], call("f", R"({"s":"}{"})"));
}

TEST(ToolCalls, HermesMalformedCallsStayContent) {
  for (const std::string bad : {
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>",
           "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
           "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",
           "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",
           "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>",
           "<tool_call>\n[1, 2]\n</tool_call>",
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1",
           "<tool_call>",
           "<tool_call",
           "a <tool b </tool_call> c",
       }) {
    const auto r = run_all_cuts(ToolParser::kHermes, "Before " + bad + " after");
    EXPECT_EQ(r.content, "Before " + bad + " after");
    EXPECT_TRUE(r.calls.empty()) << bad;
  }
  // A bad call between good ones is content; the good ones are calls.
  const auto r = run_all_cuts(
      ToolParser::kHermes,
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{oops}</tool_call>"
      "\n<tool_call>{\"name\": \"c\", \"arguments\": {\"x\": true}}</tool_call>");
  EXPECT_EQ(r.content, "\n<tool_call>{oops}</tool_call>\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1], call("c", R"({"x":true})"));
}

TEST(ToolCalls, HermesStreamsContentAndHoldsOnlyAPossibleMarker) {
  ToolCallExtractor x(ToolParser::kHermes);
  EXPECT_EQ(x.push("Hello <").content, "Hello ");
  EXPECT_EQ(x.push("b>").content, "<b>");
  EXPECT_EQ(x.push(" <tool_").content, " ");
  auto o = x.push("call>{\"name\": \"f\", \"arguments\": {}}");
  EXPECT_EQ(o.content, "");
  EXPECT_TRUE(o.calls.empty()) << "a call is released only once it is complete";
  o = x.push("</tool_call>");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(x.push("\n").content, "") << "white space after a call waits";
  EXPECT_EQ(x.push("ok").content, "\nok");
  EXPECT_EQ(x.finish().content, "");
}

TEST(ToolCalls, Llama3JsonReplies) {
  auto r = run_all_cuts(ToolParser::kLlama3,
                        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], call("get_weather", R"({"city":"Oslo"})"));

  r = run_all_cuts(ToolParser::kLlama3,
                   "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x;y\"}}; "
                   "{\"name\": \"b\", \"arguments\": {}}\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], call("a", R"({"q":"x;y"})"));
  EXPECT_EQ(r.calls[1], call("b", "{}"));
  EXPECT_EQ(r.content, "");

  for (const std::string text : {
           "The answer is {\"name\": \"f\", \"parameters\": {}}",
           "{\"name\": \"f\", \"parameters\": {}} and more",
           "{\"not\": \"a call\"}",
           "{\"name\": \"f\", \"parameters\": {\"a\": 1}",
           "<|python_tag|>search.call(query=\"x\")",
           "<|python",
           "  ",
           "",
       }) {
    r = run_all_cuts(ToolParser::kLlama3, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
}

TEST(ToolCalls, Llama3ReleasesPlainRepliesAtOnce) {
  ToolCallExtractor x(ToolParser::kLlama3);
  EXPECT_EQ(x.push(" ").content, "") << "the reply's start decides";
  EXPECT_EQ(x.push("<|pyth").content, "");
  EXPECT_EQ(x.push("on!").content, " <|python!");
  EXPECT_EQ(x.push(" {").content, " {");
  ToolCallExtractor y(ToolParser::kLlama3);
  EXPECT_EQ(y.push("{\"name\": \"f\", \"parameters\": {}}").content, "");
  const auto o = y.finish();
  EXPECT_EQ(o.calls.size(), 1u);
}

TEST(ToolCalls, MistralLists) {
  auto r =
      run_all_cuts(ToolParser::kMistral,
                   "Sure. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"s\": \"]}\\\"[\"}},"
                   " {\"name\": \"b\", \"arguments\": {\"n\": 2.5}}]");
  EXPECT_EQ(r.content, "Sure. ");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], call("a", R"({"s":"]}\"["})"));
  EXPECT_EQ(r.calls[1], call("b", R"({"n":2.5})"));

  for (const std::string bad : {
           "[TOOL_CALLS] [{\"name\": 1, \"arguments\": {}}]",
           "[TOOL_CALLS] []",
           "[TOOL_CALLS] {\"name\": \"a\", \"arguments\": {}}",
           "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}",
           "[TOOL_CALLS] get_weather[ARGS]{}",
           "[TOOL_CALL",
       }) {
    r = run_all_cuts(ToolParser::kMistral, bad);
    EXPECT_EQ(r.content, bad);
    EXPECT_TRUE(r.calls.empty()) << bad;
  }
  // A finished list is released before the reply ends.
  ToolCallExtractor x(ToolParser::kMistral);
  EXPECT_EQ(x.push("[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}").calls.size(), 0u);
  EXPECT_EQ(x.push("]").calls.size(), 1u);
}

// "parallel_tool_calls": false (one call at most): the first call is kept, whatever follows it
// (text, more calls, the rest of a Mistral list or of Llama's ';'-joined calls) is dropped, and
// the text before it stays content. Random replies of 1 to 4 calls, every cut.
TEST(ToolCalls, OneCallAtMost) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 6; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 4);
    std::string before = trial % 2 == 0 ? "" : "Checking " + std::to_string(rng() % 1000) + ".\n";
    std::string hermes = before, mistral = before + "[TOOL_CALLS] [", llama;
    std::vector<ParsedToolCall> want;
    for (int i = 0; i < n; ++i) {
      const std::string name = "f" + std::to_string(rng() % 100);
      const std::string args = "{\"v\":" + std::to_string(rng() % 1000) + "}";
      want.push_back(call(name, args));
      hermes += "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args +
                "}\n</tool_call>\n" + (rng() % 2 ? "and then " : "");
      mistral +=
          std::string(i ? ", " : "") + "{\"name\": \"" + name + "\", \"arguments\": " + args + "}";
      llama +=
          std::string(i ? "; " : "") + "{\"name\": \"" + name + "\", \"parameters\": " + args + "}";
    }
    mistral += "] trailing text";
    for (const auto& [parser, text] :
         {std::pair{ToolParser::kHermes, hermes}, std::pair{ToolParser::kMistral, mistral},
          std::pair{ToolParser::kLlama3, llama}}) {
      const auto one = run_all_cuts(parser, text, 1);
      ASSERT_EQ(one.calls.size(), 1u) << text;
      EXPECT_EQ(one.calls[0], want[0]) << text;
      EXPECT_EQ(one.content, parser == ToolParser::kLlama3 ? "" : before) << text;
      // Without the limit every call comes back.
      EXPECT_EQ(run(parser, {text}).calls.size(), static_cast<size_t>(n)) << text;
    }
  }
  // A malformed first call is content and does not use up the one call.
  const auto r = run_all_cuts(ToolParser::kHermes,
                              "<tool_call>\n{\"name\": 1}\n</tool_call>"
                              "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>"
                              "<tool_call>\n{\"name\": \"h\", \"arguments\": {}}\n</tool_call>",
                              1);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], call("g", "{}"));
  EXPECT_EQ(r.content, "<tool_call>\n{\"name\": 1}\n</tool_call>");
}

TEST(ToolCalls, NoneIsAllContent) {
  const std::string text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>";
  const auto r = run_all_cuts(ToolParser::kNone, text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCalls, DetectsTheFormatFromTheTemplate) {
  const auto dir = std::filesystem::path(EXL3_SOURCE_DIR) / "tests" / "text" / "data";
  EXPECT_EQ(
      detect_tool_parser(exl3::test::read_file(dir / "chat_templates" / "chatml_tools.jinja")),
      ToolParser::kHermes);
  EXPECT_EQ(
      detect_tool_parser(exl3::test::read_file(dir / "chat_templates" / "llama31_style.jinja")),
      ToolParser::kLlama3);
  EXPECT_EQ(
      detect_tool_parser(exl3::test::read_file(dir / "chat_templates" / "mistral_style.jinja")),
      ToolParser::kMistral);
  EXPECT_EQ(detect_tool_parser(exl3::test::read_file(dir / "chat_templates" / "glm_style.jinja")),
            ToolParser::kNone)
      << "GLM's <tool_call> holds <arg_key> pairs, not JSON";
  EXPECT_EQ(
      detect_tool_parser(exl3::test::read_file(dir / "chat_templates" / "smollm2_style.jinja")),
      ToolParser::kNone);
  EXPECT_EQ(
      detect_tool_parser(exl3::test::read_file(dir / "qwen2_style" / "tokenizer_config.json")),
      ToolParser::kNone);
  EXPECT_EQ(detect_tool_parser("{{ '<|python_tag|>' }}"), ToolParser::kLlama3);
}

TEST(ToolCalls, OptionsAndIds) {
  EXPECT_EQ(parse_tool_parser_option("auto"), std::nullopt);
  EXPECT_EQ(parse_tool_parser_option("hermes"), ToolParser::kHermes);
  EXPECT_EQ(parse_tool_parser_option("llama3"), ToolParser::kLlama3);
  EXPECT_EQ(parse_tool_parser_option("mistral"), ToolParser::kMistral);
  EXPECT_EQ(parse_tool_parser_option("none"), ToolParser::kNone);
  EXPECT_THAT(exl3::test::error_of([] { parse_tool_parser_option("qwen"); }),
              ::testing::HasSubstr("choose auto, hermes, llama3, mistral or none"));
  std::mt19937_64 rng(7);
  const auto a = new_tool_call_id(ToolParser::kHermes, rng);
  EXPECT_THAT(a, MatchesRegex("call_[a-zA-Z0-9]{24}"));
  EXPECT_NE(a, new_tool_call_id(ToolParser::kHermes, rng));
  EXPECT_THAT(new_tool_call_id(ToolParser::kMistral, rng), MatchesRegex("[a-zA-Z0-9]{9}"));
}
