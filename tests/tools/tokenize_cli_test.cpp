// `exl3 tokenize` through the binary: ids as the reference tokenizer gives them, JSON for scripts,
// decode, chat prompts, and the errors a user sees.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/format/safetensors.hpp"
#include "test_support.hpp"

using exl3::test::run_cli;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

std::string q(const std::filesystem::path& p) {
  return exl3::test::shell_quote(p);
}
std::filesystem::path data(const char* style) {
  return std::filesystem::path(EXL3_SOURCE_DIR) / "tests" / "text" / "data" / style;
}

// The golden ids of one case of tests/text/data/golden_<name>.json.
std::vector<int32_t> golden_ids(const std::string& name, const std::string& text,
                                const char* key = "ids") {
  const auto g = json::parse(exl3::read_text_file(data("") / ("golden_" + name + ".json")));
  for (const auto& c : g["cases"]) {
    if (c["text"] == text) return c[key].get<std::vector<int32_t>>();
  }
  ADD_FAILURE() << "no golden case " << text;
  return {};
}

}  // namespace

TEST(TokenizeCli, HelpTeaches) {
  const auto top = run_cli("--help");
  EXPECT_THAT(top.out, HasSubstr("tokenize"));
  const auto h = run_cli("tokenize --help");
  EXPECT_EQ(h.code, 0);
  for (const char* s : {"MODEL_DIR", "--text", "--json", "--decode", "--chat", "--chat-format",
                        "--system", "Examples:", "apply_chat_template"}) {
    EXPECT_THAT(h.out, HasSubstr(s));
  }
}

TEST(TokenizeCli, EncodeMatchesReference) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = dir / "models" / "tiny-qwen3moe-exl3";
  const auto r =
      run_cli(fmt::format("tokenize {} --text 'Hello world' --json", q(model)), "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json::parse(r.out);
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), golden_ids("conformance", "Hello world"));
  EXPECT_EQ(j["count"], j["ids"].size());
  std::string joined;
  for (const auto& t : j["tokens"]) joined += t["text"].get<std::string>();
  EXPECT_EQ(joined, "Hello world");

  const auto text = run_cli(fmt::format("tokenize {} --text 'Hello world'", q(model)));
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("tokens from 11 bytes"));
  EXPECT_THAT(text.out, HasSubstr("\" w\""));  // each token shown as the text it stands for
  std::string list;
  for (const int32_t id : golden_ids("conformance", "Hello world"))
    list += (list.empty() ? "" : ",") + std::to_string(id);
  EXPECT_THAT(text.out, HasSubstr("ids: " + list + "\n"));
}

TEST(TokenizeCli, DecodeAndChat) {
  const auto qwen = data("qwen2_style");
  const auto ids = golden_ids("qwen2_style", "Hello world");
  std::string list;
  for (const int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  const auto d = run_cli(fmt::format("tokenize {} --decode {}", q(qwen), list), "", false);
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_EQ(d.out, "Hello world\n");

  const auto c = run_cli(
      fmt::format("tokenize {} --chat --text 'Hi' --system 'Be brief' --json", q(qwen)), "", false);
  ASSERT_EQ(c.code, 0) << c.out;
  const auto j = json::parse(c.out);
  EXPECT_EQ(j["chat_format"], "jinja");  // the model's template, interpreted
  EXPECT_EQ(j["prompt"],
            "<|im_start|>system\nBe "
            "brief<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(j["ids"][0], 1);  // <|im_start|>
  EXPECT_EQ(j["tokens"][0]["special"], true);

  const auto l = run_cli(
      fmt::format("tokenize {} --chat --text 'Hi' --json", q(data("llama3_style"))), "", false);
  ASSERT_EQ(l.code, 0) << l.out;
  EXPECT_EQ(json::parse(l.out)["prompt"],
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const auto p =
      run_cli(fmt::format("tokenize {} --chat --chat-format plain --text 'Hi'", q(qwen)));
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_THAT(p.out, HasSubstr("User: Hi"));
}

TEST(TokenizeCli, Errors) {
  const auto qwen = data("qwen2_style");
  auto r = run_cli(fmt::format("tokenize {} --decode 1,x", q(qwen)));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("not a comma-separated list"));
  r = run_cli(fmt::format("tokenize {} --decode 99999", q(qwen)));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("token id 99999 is not in the vocabulary"));
  r = run_cli(fmt::format("tokenize {}", q(qwen)));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("give --text, --file or --decode"));
  r = run_cli(fmt::format("tokenize {} --text a --decode 1", q(qwen)));
  EXPECT_NE(r.code, 0);  // mutually exclusive
  r = run_cli(fmt::format("tokenize {} --text a --chat-format chatml", q(qwen)));
  EXPECT_NE(r.code, 0);  // needs --chat
  r = run_cli(fmt::format("tokenize {} --text a", q(data("no_such_model"))));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("no tokenizer.json"));
  EXL3_REQUIRE_CONFORMANCE(dir);
  r = run_cli(fmt::format("tokenize {} --chat --text a", q(dir / "models" / "tiny-qwen3moe-exl3")));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("no chat_template"));
}
