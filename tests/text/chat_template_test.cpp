// Chat formats: detection from real-style templates, the exact prompt strings, and the errors for
// missing or unrecognised templates.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/text/chat_template.hpp"
#include "exl3/text/tokenizer.hpp"
#include "test_support.hpp"
#include "tokenizer_test_util.hpp"

using exl3::ChatFormat;
using exl3::ChatMessage;
using exl3::ChatTemplate;
using exl3::Tokenizer;
using ::testing::HasSubstr;

namespace {

const std::vector<ChatMessage> kChat = {{"system", "You are terse."},
                                        {"user", "What is 2+2?"},
                                        {"assistant", " 4 "},
                                        {"user", "And 3+3?"}};

Tokenizer style(const char* name) {
  return Tokenizer::load(exl3::test::tokenizer_data_dir() / name);
}

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const exl3::Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(ChatTemplate, ChatML) {
  const auto tok = style("qwen2_style");
  const auto t = ChatTemplate::for_tokenizer(tok);
  EXPECT_EQ(t.format(), ChatFormat::kChatML);
  EXPECT_EQ(t.render(kChat),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n 4 <|im_end|>\n"
            "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(t.render(std::vector<ChatMessage>{{"user", "Hi"}}, false),
            "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(t.end_of_turn(), "<|im_end|>");
  EXPECT_FALSE(t.encode_adds_special_tokens());
  // The markers become their special tokens when the prompt is encoded.
  const auto ids = tok.encode(t.render(std::vector<ChatMessage>{{"user", "Hi"}}),
                              t.encode_adds_special_tokens());
  EXPECT_EQ(ids.front(), *tok.token_to_id("<|im_start|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.token_to_id("<|im_end|>")), 1);
}

TEST(ChatTemplate, Llama3) {
  const auto tok = style("llama3_style");
  const auto t = ChatTemplate::for_tokenizer(tok);
  EXPECT_EQ(t.format(), ChatFormat::kLlama3);
  EXPECT_EQ(
      t.render(kChat),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"  // content | trim
      "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t.end_of_turn(), "<|eot_id|>");
  const auto ids = tok.encode(t.render(std::vector<ChatMessage>{{"user", "Hi"}}),
                              t.encode_adds_special_tokens());
  EXPECT_EQ(ids.front(), *tok.bos_id());  // once: from the template, not the post-processor
  EXPECT_NE(ids.at(1), *tok.bos_id());
}

TEST(ChatTemplate, Plain) {
  const ChatTemplate t(ChatFormat::kPlain);
  EXPECT_EQ(t.render(kChat),
            "System: You are terse.\n\nUser: What is 2+2?\n\nAssistant:  4 \n\nUser: And "
            "3+3?\n\nAssistant:");
  EXPECT_TRUE(t.encode_adds_special_tokens());
  EXPECT_EQ(t.end_of_turn(), "");
}

TEST(ChatTemplate, DetectionAndNames) {
  // Marker tokens alone are not recognition: only a known template text is.
  EXPECT_EQ(exl3::detect_chat_format("{{ '<|im_start|>' + m.role }}...<|im_end|>"), std::nullopt);
  EXPECT_EQ(exl3::chat_format_by_markers("{{ '<|im_start|>' + m.role }}...<|im_end|>"),
            ChatFormat::kChatML);
  EXPECT_EQ(exl3::detect_chat_format("<|start_header_id|>x<|end_header_id|>y<|eot_id|>"),
            std::nullopt);
  EXPECT_EQ(exl3::chat_format_by_markers("<|start_header_id|>x<|end_header_id|>y<|eot_id|>"),
            ChatFormat::kLlama3);
  EXPECT_EQ(exl3::detect_chat_format(style("qwen2_style").chat_template()), ChatFormat::kChatML);
  EXPECT_EQ(exl3::detect_chat_format(style("qwen2_style").chat_template() + "\n"),
            ChatFormat::kChatML);
  EXPECT_EQ(exl3::detect_chat_format(style("llama3_style").chat_template()), ChatFormat::kLlama3);
  EXPECT_EQ(exl3::detect_chat_format("{{ bos_token }}[INST] {{ m.content }} [/INST]"),
            std::nullopt);
  EXPECT_EQ(exl3::detect_chat_format(""), std::nullopt);
  for (const auto f : {ChatFormat::kChatML, ChatFormat::kLlama3, ChatFormat::kPlain}) {
    EXPECT_EQ(exl3::parse_chat_format(exl3::chat_format_name(f)), f);
  }
  EXPECT_THAT(error_of([] { exl3::parse_chat_format("mistral"); }),
              HasSubstr("choose chatml, llama3 or plain"));
}

TEST(ChatTemplate, Errors) {
  const auto tj = R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}, "decoder": {"type": "ByteLevel"}})";
  const auto none = Tokenizer::from_json(tj, "", "m/tokenizer.json");
  EXPECT_THAT(error_of([&] { ChatTemplate::for_tokenizer(none); }),
              testing::AllOf(HasSubstr("m/tokenizer.json"), HasSubstr("no chat_template"),
                             HasSubstr("--chat-format")));
  const auto mistral = Tokenizer::from_json(tj, R"({"chat_template": "[INST] {{ m }} [/INST]"})",
                                            "m/tokenizer.json");
  EXPECT_THAT(
      error_of([&] { ChatTemplate::for_tokenizer(mistral); }),
      testing::AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("unrecognised chat_template"),
                     HasSubstr("does not run Jinja")));
  // Forcing a format whose marker tokens the tokenizer lacks.
  EXPECT_THAT(error_of([&] { ChatTemplate::for_tokenizer(mistral, ChatFormat::kChatML); }),
              HasSubstr("chat format chatml needs the token <|im_start|>"));
  EXPECT_EQ(ChatTemplate::for_tokenizer(mistral, ChatFormat::kPlain).format(), ChatFormat::kPlain);
}

TEST(ChatTemplate, LookalikeTemplatesAreRefusedNotGuessed) {
  // SmolLM2's template shape: ChatML turns, plus a default system prompt when the conversation
  // has none. Rendering it as plain ChatML would drop that prompt (14 tokens instead of 35).
  const std::string smol =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|im_start|>assistant\n' }}{% endif %}";
  EXPECT_EQ(exl3::detect_chat_format(smol), std::nullopt);
  exl3::test::TempDir tmp;
  const auto src = exl3::test::tokenizer_data_dir() / "qwen2_style";
  std::filesystem::copy_file(src / "tokenizer.json", tmp / "tokenizer.json");
  exl3::test::write_file(
      tmp / "tokenizer_config.json",
      nlohmann::json{{"eos_token", "<|im_end|>"}, {"chat_template", smol}}.dump());
  const auto tok = Tokenizer::load(tmp.path());
  EXPECT_THAT(error_of([&] { ChatTemplate::for_tokenizer(tok); }),
              testing::AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("chatml marker tokens"),
                             HasSubstr("not a template exl3 renders exactly"),
                             HasSubstr("--chat-format chatml")));
  // Forcing the format is the user's informed choice.
  EXPECT_EQ(ChatTemplate::for_tokenizer(tok, ChatFormat::kChatML).format(), ChatFormat::kChatML);
}

TEST(ChatTemplate, JinjaFileFallback) {
  // Newer models keep the template in chat_template.jinja instead of tokenizer_config.json.
  exl3::test::TempDir tmp;
  const auto src = exl3::test::tokenizer_data_dir() / "qwen2_style";
  std::filesystem::copy_file(src / "tokenizer.json", tmp / "tokenizer.json");
  exl3::test::write_file(tmp / "tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  EXPECT_TRUE(Tokenizer::load(tmp.path()).chat_template().empty());
  exl3::test::write_file(tmp / "chat_template.jinja", style("qwen2_style").chat_template() + "\n");
  const auto tok = Tokenizer::load(tmp.path());
  EXPECT_EQ(ChatTemplate::for_tokenizer(tok).format(), ChatFormat::kChatML);
  EXPECT_THAT(tok.chat_template_source(), ::testing::EndsWith("chat_template.jinja"));
}
