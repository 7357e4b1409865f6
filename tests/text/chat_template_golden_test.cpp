// Whole conversations through ChatTemplate against transformers' apply_chat_template(...,
// tokenize=False) (data/make_chat_template_golden.py, "cases"): exl3's own templates in the
// manner of Qwen3, Llama-3.1, Mistral, DeepSeek-V3, GLM-4.5 and SmolLM2, with tools, tool calls,
// tool results, reasoning and enable_thinking, byte for byte; and the conversations those
// templates refuse (raise_exception) refused with the template's own message.
//
// EXL3_CHAT_TEMPLATE_EXTRA_GOLDEN may name another file of the same shape whose templates are
// inline (data/check_smollm2_template.sh writes one from SmolLM2's real template and runs this);
// without it that test is skipped.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/text/chat_template.hpp"
#include "tokenizer_test_util.hpp"

using json = nlohmann::ordered_json;

namespace {

json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

std::string template_source(const std::filesystem::path& p) {
  if (p.extension() == ".json") return read_json(p)["chat_template"].get<std::string>();
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::optional<std::string> opt(const json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<std::string>();
}

// Checks every case; returns how many rendered and how many failed as expected.
std::pair<int, int> check_cases(const json& g, const std::map<std::string, std::string>& sources) {
  int rendered = 0, refused = 0;
  for (const auto& c : g["cases"]) {
    const std::string family = c["template"], name = c["name"];
    SCOPED_TRACE(family + " / " + name);
    const auto t = exl3::ChatTemplate::from_jinja(sources.at(family), family + ".jinja",
                                                  opt(c["bos_token"]), opt(c["eos_token"]));
    std::string got, err;
    try {
      got =
          t.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["tools"], c["kwargs"]);
    } catch (const exl3::Error& e) {
      err = e.what();
    }
    if (c.contains("error")) {
      EXPECT_THAT(err, ::testing::HasSubstr(c["error"].get<std::string>())) << "rendered: " << got;
      ++refused;
    } else {
      EXPECT_EQ(err, "");
      EXPECT_EQ(got, c["expected"].get<std::string>());
      ++rendered;
    }
  }
  return {rendered, refused};
}

}  // namespace

TEST(ChatTemplateGolden, MatchesTransformers) {
  const auto dir = exl3::test::tokenizer_data_dir();
  const json g = read_json(dir / "golden_chat_templates.json");
  std::map<std::string, std::string> sources;
  for (const auto& [family, path] : g["templates"].items()) {
    sources[family] = template_source(dir / path.get<std::string>());
  }
  const auto [rendered, refused] = check_cases(g, sources);
  // Every family is covered, and both outcomes occur.
  EXPECT_EQ(sources.size(), 8u);
  EXPECT_GE(rendered, 80);
  EXPECT_GE(refused, 6);
}

TEST(ChatTemplateGolden, ExtraTemplatesFromTheEnvironment) {
  const char* path = std::getenv("EXL3_CHAT_TEMPLATE_EXTRA_GOLDEN");
  if (path == nullptr || !std::filesystem::exists(path)) {
    GTEST_SKIP() << "EXL3_CHAT_TEMPLATE_EXTRA_GOLDEN is not set (see make_chat_template_golden.py "
                    "--smollm2-wheel)";
  }
  const json g = read_json(path);
  std::map<std::string, std::string> sources;
  for (const auto& [family, src] : g["templates"].items()) sources[family] = src.get<std::string>();
  const auto [rendered, refused] = check_cases(g, sources);
  EXPECT_GT(rendered + refused, 0);
}
