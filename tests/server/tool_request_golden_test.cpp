// Chat requests with tools, checked against transformers: each golden case is an OpenAI body
// (tools, assistant tool calls with arguments as JSON text, tool results) and the prompt
// transformers renders for it with one of the repo's chat templates
// (tests/server/data/make_tool_request_golden.py). The server's request parser and exl3's
// renderer must produce the same bytes, so templates get the tools and turns transformers would
// hand them.
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <variant>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/server/openai.hpp"
#include "exl3/text/chat_template.hpp"

using namespace exl3;
using namespace exl3::server;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

std::optional<std::string> optional_string(const json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<std::string>();
}

}  // namespace

TEST(ToolRequestGolden, MatchesTransformers) {
  const auto src = std::filesystem::path(EXL3_SOURCE_DIR) / "tests";
  const auto doc =
      json::parse(exl3::test::read_file(src / "server" / "data" / "golden_tool_requests.json"));
  ASSERT_GE(doc["cases"].size(), 7u);
  for (const auto& c : doc["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto parsed = parse_completion_request(c["body"].get<std::string>(), Endpoint::kChat);
    ASSERT_TRUE(std::holds_alternative<CompletionRequest>(parsed))
        << std::get<ApiError>(parsed).message;
    const auto& r = std::get<CompletionRequest>(parsed);
    const auto name = c["template"].get<std::string>();
    const auto tmpl = ChatTemplate::from_jinja(
        exl3::test::read_file(src / "text" / "data" / "chat_templates" / name), name,
        optional_string(c["bos_token"]), optional_string(c["eos_token"]));
    // As the server renders it: the tools as parsed, the template variables as an object.
    const auto extra = ojson::parse(r.chat_template_kwargs.dump());
    EXPECT_EQ(tmpl.render(r.template_messages, true, r.tools, extra),
              c["expected"].get<std::string>());
  }
}
