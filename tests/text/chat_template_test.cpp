// ChatTemplate: the model's Jinja template through the interpreter (the prompts the old native
// renderers produced, now from the template itself), the forced native formats, and the errors.
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

using exl3::test::error_of;

}  // namespace

TEST(ChatTemplate, ChatMLTemplate) {
  const auto tok = style("qwen2_style");
  const auto t = ChatTemplate::for_tokenizer(tok);
  EXPECT_EQ(t.format(), std::nullopt);
  EXPECT_EQ(t.kind(), "jinja");
  EXPECT_THAT(t.description(), HasSubstr("tokenizer_config.json"));
  const std::string expected =
      "<|im_start|>system\nYou are terse.<|im_end|>\n"
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
      "<|im_start|>assistant\n 4 <|im_end|>\n"
      "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(t.render(kChat), expected);
  EXPECT_EQ(ChatTemplate(ChatFormat::kChatML).render(kChat), expected);  // the native format agrees
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

TEST(ChatTemplate, Llama3Template) {
  const auto tok = style("llama3_style");
  const auto t = ChatTemplate::for_tokenizer(tok);
  EXPECT_EQ(t.kind(), "jinja");
  const std::string expected =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"  // content | trim
      "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(t.render(kChat), expected);
  EXPECT_EQ(ChatTemplate::for_tokenizer(tok, ChatFormat::kLlama3).render(kChat), expected);
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
  EXPECT_EQ(t.kind(), "plain");
}

TEST(ChatTemplate, Names) {
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
  // A template the interpreter cannot run is refused when it is loaded, naming where.
  const auto odd = Tokenizer::from_json(
      tj, R"({"chat_template": "{% for m in messages %}\n{{ m.content | wordwrap }}{% endfor %}"})",
      "m/tokenizer.json");
  EXPECT_THAT(error_of([&] { ChatTemplate::for_tokenizer(odd); }),
              HasSubstr("tokenizer_config.json):2:16: unknown filter 'wordwrap'"));
  // Forcing a format whose marker tokens the tokenizer lacks.
  EXPECT_THAT(error_of([&] { ChatTemplate::for_tokenizer(odd, ChatFormat::kChatML); }),
              HasSubstr("chat format chatml needs the token <|im_start|>"));
  EXPECT_EQ(ChatTemplate::for_tokenizer(odd, ChatFormat::kPlain).format(), ChatFormat::kPlain);
  // A template's own refusal reaches the caller with its message.
  const auto strict = ChatTemplate::from_jinja(
      "{% if messages[0].role != 'user' %}{{ raise_exception('user first, please') }}{% endif %}",
      "strict.jinja", std::nullopt, std::nullopt);
  EXPECT_THAT(error_of([&] {
                strict.render(std::vector<ChatMessage>{{"assistant", "x"}});
              }),
              testing::AllOf(HasSubstr("strict.jinja:1:"), HasSubstr("user first, please")));
}

TEST(ChatTemplate, DefaultSystemPromptsAreKept) {
  // SmolLM2's template shape: ChatML turns, plus a default system prompt when the conversation
  // has none. The old recognise-by-text path refused it; the interpreter renders it whole.
  const std::string smol =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|im_start|>assistant\n' }}{% endif %}";
  exl3::test::TempDir tmp;
  const auto src = exl3::test::tokenizer_data_dir() / "qwen2_style";
  std::filesystem::copy_file(src / "tokenizer.json", tmp / "tokenizer.json");
  exl3::test::write_file(
      tmp / "tokenizer_config.json",
      nlohmann::json{{"eos_token", "<|im_end|>"}, {"chat_template", smol}}.dump());
  const auto tok = Tokenizer::load(tmp.path());
  const auto t = ChatTemplate::for_tokenizer(tok);
  EXPECT_EQ(t.render(std::vector<ChatMessage>{{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render(std::vector<ChatMessage>{{"system", "S"}, {"user", "Hi"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, ToolsAndExtraVariables) {
  const auto t = ChatTemplate::from_jinja(
      "{{ bos_token }}{% if tools %}{{ tools | map(attribute='name') | join(',') }}|{% endif %}"
      "{{ messages | length }}|{{ enable_thinking is defined and not enable_thinking }}|"
      "{{ eos_token }}|{{ documents }}",
      "t.jinja", "<s>", std::nullopt);
  const auto msgs = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(t.render(msgs, true), "<s>1|False||None");
  EXPECT_EQ(t.render(msgs, true, nlohmann::ordered_json::parse(R"([{"name": "a"}, {"name": "b"}])"),
                     {{"enable_thinking", false}, {"eos_token", "</s>"}}),
            "<s>a,b|1|True|</s>|None");
  EXPECT_THAT(error_of([&] {
                t.render(msgs, true, nullptr, {{"messages", 1}});
              }),
              HasSubstr("would replace a fixed argument"));
  // Native formats take text turns only.
  EXPECT_THAT(
      error_of([&] {
        ChatTemplate(ChatFormat::kChatML).render(msgs, true, nlohmann::ordered_json::array());
      }),
      HasSubstr("cannot list tools"));
  EXPECT_EQ(ChatTemplate(ChatFormat::kChatML).render(msgs, false),
            "<|im_start|>user\nx<|im_end|>\n");
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
  const auto t = ChatTemplate::for_tokenizer(tok);
  EXPECT_EQ(t.render(std::vector<ChatMessage>{{"user", "Hi"}}, false),
            "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_THAT(tok.chat_template_source(), ::testing::EndsWith("chat_template.jinja"));
  EXPECT_THAT(t.description(), ::testing::EndsWith("chat_template.jinja)"));
}
