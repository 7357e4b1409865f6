// Chat prompt formatting for the common chat templates.
//
// This is NOT a Jinja engine. Hugging Face models ship a Jinja `chat_template` in
// tokenizer_config.json; exl3 renders a template natively only when it recognises the template's
// exact text as one whose every output a native format reproduces (plain ChatML as fine-tunes
// ship it, Meta-Llama-3-Instruct). A template that only shares the marker tokens is refused with
// a hint (--chat-format forces a format), never rendered by guesswork. The formats:
//
//   chatml  (Qwen2, Qwen2.5, Qwen3, ...; markers <|im_start|> and <|im_end|>)
//       <|im_start|>{role}\n{content}<|im_end|>\n ...   generation prompt: <|im_start|>assistant\n
//   llama3  (Llama-3.x; markers <|start_header_id|>, <|end_header_id|>, <|eot_id|>)
//       {bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|> ...
//       generation prompt: <|start_header_id|>assistant<|end_header_id|>\n\n
//   plain   (fallback, chosen explicitly; no special tokens)
//       {Role}: {content}\n\n ...                          generation prompt: Assistant:
//
// Template logic beyond the basic turn structure is not reproduced, which is why such templates
// are not recognised: SmolLM2's and Qwen2.5's injected default system prompts, Qwen3's <think>
// handling and enable_thinking, tool calls, Llama-3.1's "Cutting Knowledge Date" preamble.
//
// Render, then encode with add_special_tokens = encode_adds_special_tokens(): chatml and llama3
// prompts already contain their special tokens as text (as transformers' apply_chat_template
// does), while plain prompts let the tokenizer's post-processor add BOS.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "exl3/text/tokenizer.hpp"

namespace exl3 {

enum class ChatFormat { kChatML, kLlama3, kPlain };

std::string_view chat_format_name(ChatFormat f);  // "chatml", "llama3", "plain"
// Parses a name as chat_format_name prints it; throws exl3::Error listing the choices.
ChatFormat parse_chat_format(std::string_view name);
// The format whose rendering equals the template's for every conversation of text turns: set
// only for a template whose exact text exl3 knows (one trailing newline aside); nullopt otherwise.
std::optional<ChatFormat> detect_chat_format(std::string_view jinja_template);
// The format a template's marker tokens suggest (both or neither: nullopt). For messages only: a
// template that merely looks like a format is not rendered as one.
std::optional<ChatFormat> chat_format_by_markers(std::string_view jinja_template);

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // `bos_text` is prepended by llama3 (the template's {{ bos_token }}).
  explicit ChatTemplate(ChatFormat format, std::string bos_text = {});

  // The format for `tok`: `force` if given, else detected from tok.chat_template(). Throws
  // exl3::Error when the tokenizer has no chat template or an unrecognised one, and when the
  // format's marker tokens are not tokens of `tok` (they would be tokenized as plain text).
  static ChatTemplate for_tokenizer(const Tokenizer& tok,
                                    std::optional<ChatFormat> force = std::nullopt);

  ChatFormat format() const { return format_; }
  std::string render(std::span<const ChatMessage> messages,
                     bool add_generation_prompt = true) const;
  // Whether to encode the rendered prompt with add_special_tokens (true only for plain).
  bool encode_adds_special_tokens() const { return format_ == ChatFormat::kPlain; }
  // The token text that ends an assistant turn ("<|im_end|>", "<|eot_id|>"; empty for plain):
  // a stop token for generation.
  std::string_view end_of_turn() const;

 private:
  ChatFormat format_;
  std::string bos_text_;
};

}  // namespace exl3
