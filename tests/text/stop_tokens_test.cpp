// generation_config_eos / model_stop_tokens: every form of eos_token_id, the union of the three
// sources, and errors that name the file.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/text/stop_tokens.hpp"
#include "test_support.hpp"

using ::testing::HasSubstr;

TEST(StopTokens, GenerationConfigForms) {
  exl3::test::TempDir tmp;
  EXPECT_TRUE(exl3::generation_config_eos(tmp.path()).empty());  // no file
  auto with = [&](const std::string& body) {
    exl3::test::write_file(tmp / "generation_config.json", body);
    return exl3::generation_config_eos(tmp.path());
  };
  EXPECT_EQ(with(R"({"eos_token_id": 151645})"), std::vector<int32_t>{151645});
  EXPECT_EQ(with(R"({"eos_token_id": [128001, 128008, 128009]})"),
            (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_TRUE(with(R"({"eos_token_id": null})").empty());
  EXPECT_TRUE(with(R"({"bos_token_id": 1})").empty());
  for (const char* bad : {R"({"eos_token_id": "x"})", R"({"eos_token_id": [-1]})", "{", "[]"}) {
    try {
      with(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const exl3::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("generation_config.json")) << bad;
    }
  }
}

TEST(StopTokens, UnionOfConfigGenerationConfigAndTokenizer) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  const auto tok =
      exl3::Tokenizer::load(conf / "models" / "tiny-qwen3moe-exl3");  // eos_token <|eos|> = 2
  ASSERT_EQ(tok.eos_id(), 2);
  exl3::test::TempDir tmp;
  exl3::test::write_file(tmp / "generation_config.json", R"({"eos_token_id": [7, 2]})");
  const std::vector<int32_t> config_eos = {9, 7};
  EXPECT_EQ(exl3::model_stop_tokens(tmp.path(), config_eos, tok), (std::vector<int32_t>{2, 7, 9}));
}
