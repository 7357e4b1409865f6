// Bad and unsupported tokenizer.json / tokenizer_config.json: each fails at load with an
// exl3::Error that names the file and the feature, never tokenizing differently in silence.
// Plus the small semantics a hand-written tokenizer.json can reach (unk, literal Split).
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/text/tokenizer.hpp"
#include "test_support.hpp"

using exl3::Tokenizer;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

constexpr const char* kFile = "bad/tokenizer.json";

// The smallest useful byte-level BPE: a, b, ab, "Ġ" (space) and "-", one merge.
json minimal() {
  return json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
              "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "-": 4},
              "merges": ["a b"]}})");
}

std::string load_error(const std::string& tokenizer_json, const std::string& config = "") {
  try {
    (void)Tokenizer::from_json(tokenizer_json, config, kFile);
  } catch (const exl3::Error& e) {
    return e.what();
  }
  return "<loaded without error>";
}

#define EXPECT_LOAD_FAILS(json_text, ...)                                            \
  do {                                                                               \
    const std::string msg_ = load_error(json_text);                                  \
    EXPECT_THAT(msg_, HasSubstr(kFile));                                             \
    for (const char* needle_ : {__VA_ARGS__}) EXPECT_THAT(msg_, HasSubstr(needle_)); \
  } while (0)

}  // namespace

TEST(TokenizerBadInput, MinimalIsValid) {
  const auto tok = Tokenizer::from_json(minimal().dump());
  EXPECT_EQ(tok.encode("ab ab-a"), (std::vector<int32_t>{2, 3, 2, 4, 0}));
  EXPECT_EQ(tok.decode(tok.encode("ab ab-a")), "ab ab-a");
  EXPECT_EQ(tok.vocab_size(), 5);
}

TEST(TokenizerBadInput, MalformedJson) {
  EXPECT_LOAD_FAILS("{ not json", "invalid JSON");
  EXPECT_LOAD_FAILS("[1, 2]", "expected a JSON object");
  EXPECT_LOAD_FAILS("{}", "model: missing");
  auto j = minimal();
  j["model"]["vocab"] = json::array();
  EXPECT_LOAD_FAILS(j.dump(), "model.vocab", "expected an object");
  j = minimal();
  j["model"]["vocab"]["x"] = "seven";
  EXPECT_LOAD_FAILS(j.dump(), "model.vocab['x']", "integer token id");
  j = minimal();
  j["model"]["vocab"]["x"] = -1;
  EXPECT_LOAD_FAILS(j.dump(), "out of range");
  j = minimal();
  j["model"]["vocab"]["x"] = 0;
  EXPECT_LOAD_FAILS(j.dump(), "id 0 is used by both");
  j = minimal();
  j["model"]["ignore_merges"] = "yes";
  EXPECT_LOAD_FAILS(j.dump(), "model.ignore_merges", "true or false");
  j = minimal();
  j["added_tokens"] = {{{"id", 9}}};
  EXPECT_LOAD_FAILS(j.dump(), "added_tokens[0].content");
}

TEST(TokenizerBadInput, UnsupportedModels) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    auto j = minimal();
    j["model"]["type"] = type;
    const std::string needle = std::string("model type '") + type + "' is not supported";
    EXPECT_LOAD_FAILS(j.dump(), "model.type", needle.c_str());
  }
  // byte_fallback is SentencePiece-style BPE: a byte-level pre-tokenizer or decoder with it, and
  // the steps of that style that exl3 does not run, are refused by name.
  auto j = minimal();
  j["model"]["byte_fallback"] = true;
  EXPECT_LOAD_FAILS(j.dump(), "pre-tokenizer 'ByteLevel' with a byte_fallback BPE");
  j["pre_tokenizer"] = nullptr;
  EXPECT_LOAD_FAILS(j.dump(), "decoder 'ByteLevel' with a byte_fallback BPE");
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}};
  EXPECT_LOAD_FAILS(j.dump(), "decoder.prepend_scheme: 'sometimes'");
  j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
  EXPECT_LOAD_FAILS(j.dump(), "decoder.content", "Strip of other than one ASCII character");
  j["decoder"] = {{"type", "Fuse"}};
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}};
  EXPECT_LOAD_FAILS(j.dump(), "normalizer.pattern", "Replace pattern other than");
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
  EXPECT_LOAD_FAILS(j.dump(), "pre_tokenizer.replacement: expected one character");
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "first"}};
  // "_ab": "_" has no token, no byte token and no unk here, so it is dropped.
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("ab"), (std::vector<int32_t>{2}));
  j = minimal();
  j = minimal();
  j["model"]["dropout"] = 0.1;
  EXPECT_LOAD_FAILS(j.dump(), "BPE dropout");
  j = minimal();
  j["model"]["continuing_subword_prefix"] = "##";
  EXPECT_LOAD_FAILS(j.dump(), "subword prefix");
  j = minimal();
  j["model"]["unk_token"] = "<unk>";
  EXPECT_LOAD_FAILS(j.dump(), "model.unk_token '<unk>' is not in the vocab");
}

TEST(TokenizerBadInput, BadMerges) {
  auto j = minimal();
  j["model"]["merges"] = {"a z"};
  EXPECT_LOAD_FAILS(j.dump(), "model.merges[0]", "token 'z' is not in the vocab");
  j["model"]["merges"] = {"a b", "b a"};
  EXPECT_LOAD_FAILS(j.dump(), "model.merges[1]", "merged token 'ba' is not in the vocab");
  j["model"]["merges"] = {"ab"};
  EXPECT_LOAD_FAILS(j.dump(), "model.merges[0]", "two tokens separated by one space");
  j["model"]["merges"] = {"a b c"};
  EXPECT_LOAD_FAILS(j.dump(), "two tokens separated by one space");
  j["model"]["merges"] = json::array({json::array({1, 2})});
  EXPECT_LOAD_FAILS(j.dump(), "model.merges[0]", "expected \"a b\" or [\"a\", \"b\"]");
  j["model"]["merges"] = json::array({json::array({"a", "b"})});  // the pair form is fine
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("ab"), std::vector<int32_t>{2});
}

TEST(TokenizerBadInput, UnsupportedPipelineSteps) {
  auto j = minimal();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_LOAD_FAILS(j.dump(), "normalizer", "'Lowercase'", "not supported");
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKC"}}}}};
  EXPECT_LOAD_FAILS(j.dump(), "normalizer.normalizers[1]", "'NFKC'");

  j = minimal();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  EXPECT_LOAD_FAILS(j.dump(), "pre_tokenizer", "pre-tokenizer 'Metaspace'");
  j["pre_tokenizer"] = nullptr;
  EXPECT_LOAD_FAILS(j.dump(), "pre_tokenizer", "not byte-level");
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "\\s+"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  EXPECT_LOAD_FAILS(j.dump(), "not byte-level");
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "\\s+"}}},
         {"behavior", "Removed"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_LOAD_FAILS(j.dump(), "pre_tokenizer.pretokenizers[0].behavior",
                    "Split behavior 'Removed'");
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Isolated";
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_LOAD_FAILS(j.dump(), "pre_tokenizer.pretokenizers[0].pattern", "cannot compile regex");
  for (const char* untranslatable : {"[a&&b]", "[a[bc]]", "[\\W]", "(?s:a)", "\\u12"}) {
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = untranslatable;
    EXPECT_LOAD_FAILS(j.dump(), "pre_tokenizer.pretokenizers[0].pattern", "Oniguruma construct");
  }
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Glob", "*"}};
  EXPECT_LOAD_FAILS(j.dump(), "expected {\"Regex\": ...}");
  j = minimal();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_LOAD_FAILS(j.dump(), "add_prefix_space=true");

  j = minimal();
  j["decoder"] = nullptr;
  EXPECT_LOAD_FAILS(j.dump(), "decoder", "'null'");
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_LOAD_FAILS(j.dump(), "decoder 'WordPiece'");

  j = minimal();
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  EXPECT_LOAD_FAILS(j.dump(), "post_processor", "'RobertaProcessing'");
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single",
                          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"special_tokens", json::object()}};
  EXPECT_LOAD_FAILS(j.dump(), "post_processor.single[0]", "'<s>' is not listed");
}

TEST(TokenizerBadInput, AddedTokenConflicts) {
  auto j = minimal();
  j["added_tokens"] = {{{"id", 1}, {"content", "ab"}, {"special", true}}};
  EXPECT_LOAD_FAILS(j.dump(), "added_tokens[0]",
                    "token 'ab' has id 1 but the model vocab gives it id 2");
  j["model"]["vocab"]["-"] = 5;  // a hole at 4: the reference would number <s> 5 too, a collision
  j["added_tokens"] = {{{"id", 5}, {"content", "<s>"}, {"special", true}}};
  EXPECT_LOAD_FAILS(j.dump(), "added token '<s>' has id 5, which the model vocab gives to '-'");
  j = minimal();
  j["added_tokens"] = {{{"id", 9}, {"content", "<s>"}}};  // the reference would number it 5
  EXPECT_LOAD_FAILS(j.dump(), "added_tokens[0]",
                    "token '<s>' has id 9, but tokenizers numbers it 5");
  j["added_tokens"] = {{{"id", 6}, {"content", "</s>"}},
                       {{"id", 5}, {"content", "<s>"}}};  // list order counts
  EXPECT_LOAD_FAILS(j.dump(), "token '</s>' has id 6, but tokenizers numbers it 5");
  j["added_tokens"] = {{{"id", 5}, {"content", "<s>"}},
                       {{"id", 2}, {"content", "ab"}},
                       {{"id", 6}, {"content", "</s>"}}};
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("</s>ab<s>"), (std::vector<int32_t>{6, 2, 5}));
  j["added_tokens"] = {{{"id", 7}, {"content", "<s>"}}, {{"id", 8}, {"content", "<s>"}}};
  EXPECT_LOAD_FAILS(j.dump(), "added_tokens[1]", "listed twice");
  j["added_tokens"] = {{{"id", 7}, {"content", "<s>"}}, {{"id", 7}, {"content", "</s>"}}};
  EXPECT_LOAD_FAILS(j.dump(), "id 7 is used by two added tokens");
}

TEST(TokenizerBadInput, BadConfig) {
  const auto tj = minimal().dump();
  auto err = [&](const std::string& cfg) {
    try {
      (void)Tokenizer::from_json(tj, cfg, kFile);
    } catch (const exl3::Error& e) {
      return std::string(e.what());
    }
    return std::string("<loaded without error>");
  };
  EXPECT_THAT(err("{"), HasSubstr("tokenizer_config.json"));
  EXPECT_THAT(err(R"({"bos_token": "<s>"})"),
              HasSubstr("bos_token '<s>' is not a token of the tokenizer"));
  EXPECT_THAT(err(R"({"eos_token": 5})"), HasSubstr("eos_token: expected a string"));
  EXPECT_THAT(err(R"({"chat_template": 3})"), HasSubstr("chat_template: expected a string"));
  const auto ok = Tokenizer::from_json(tj, R"({"bos_token": "a", "eos_token": {"content": "b"},
      "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "y"}]})");
  EXPECT_EQ(ok.bos_id(), 0);
  EXPECT_EQ(ok.eos_id(), 1);
  EXPECT_EQ(ok.chat_template(), "y");
}

TEST(TokenizerBadInput, InvalidUtf8TextAndMissingFiles) {
  const auto tok = Tokenizer::from_json(minimal().dump(), "", kFile);
  try {
    (void)tok.encode("ab\xC3(", true);
    FAIL() << "invalid UTF-8 accepted";
  } catch (const exl3::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not valid UTF-8 (byte 2 of 4)"));
  }
  exl3::test::TempDir tmp;
  try {
    (void)Tokenizer::load(tmp.path());
    FAIL() << "loaded an empty folder";
  } catch (const exl3::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no tokenizer.json"));
  }
}

TEST(TokenizerBadInput, UnknownBytesAndLiteralSplit) {
  // Bytes without a token: dropped without unk_token (as the reference does), else unk, fused
  // into one with fuse_unk.
  auto j = minimal();
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("acca"), (std::vector<int32_t>{0, 0}));
  j["model"]["vocab"]["<unk>"] = 9;
  j["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("acca"), (std::vector<int32_t>{0, 9, 9, 0}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("acca"), (std::vector<int32_t>{0, 9, 0}));
  // Split on a literal string, then ByteLevel without its regex: "ab-ab" -> ab | - | ab.
  j = minimal();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"String", "-"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("ab-ab"), (std::vector<int32_t>{2, 4, 2}));
}
