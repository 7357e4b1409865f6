// Chat prompts: the model's own Jinja chat template, or a native format chosen explicitly.
//
// Hugging Face models ship their prompt format as a Jinja2 `chat_template` (in
// tokenizer_config.json, or chat_template.jinja beside it). exl3 renders it with its own Jinja2
// interpreter (exl3/text/jinja.hpp) exactly as transformers' apply_chat_template(...,
// tokenize=False) does: the same variables (messages, tools, documents, add_generation_prompt,
// bos_token / eos_token, and extra keywords such as enable_thinking), the same bytes out. Default
// system prompts, tool lists, reasoning blocks and date preambles come out as the model expects.
//
// A template that uses something the interpreter does not support is refused when it is loaded
// (an unknown tag, filter or test, with its line and column) or when it renders (the failing
// construct's line), never rendered by guesswork; --chat-format picks a native format instead:
//
//   chatml  <|im_start|>{role}\n{content}<|im_end|>\n ...   generation prompt:
//   <|im_start|>assistant\n llama3  {bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content,
//   trimmed}<|eot_id|> ...
//           generation prompt: <|start_header_id|>assistant<|end_header_id|>\n\n
//   plain   {Role}: {content}\n\n ...                          generation prompt: Assistant:
//
// Render, then encode with add_special_tokens = encode_adds_special_tokens(): templates and the
// chatml / llama3 formats write their special tokens as text (transformers encodes the rendered
// chat without adding any), while plain prompts let the tokenizer's post-processor add BOS.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "exl3/text/tokenizer.hpp"

namespace exl3 {

namespace jinja {
class Template;
}

enum class ChatFormat { kChatML, kLlama3, kPlain };

std::string_view chat_format_name(ChatFormat f);  // "chatml", "llama3", "plain"
// Parses a name as chat_format_name prints it; throws exl3::Error listing the choices.
ChatFormat parse_chat_format(std::string_view name);

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // A native format. `bos_text` is prepended by llama3 (the template's {{ bos_token }}).
  explicit ChatTemplate(ChatFormat format, std::string bos_text = {});

  // A Jinja chat template; `name` (its file) starts error messages. bos_token / eos_token are
  // passed to the template when set, as transformers passes the tokenizer's special tokens.
  // `end_of_turn` is the token text that ends an assistant turn (empty: none known). Throws
  // exl3::Error on a template the interpreter cannot run.
  static ChatTemplate from_jinja(std::string_view source, std::string name,
                                 std::optional<std::string> bos_token,
                                 std::optional<std::string> eos_token,
                                 std::string end_of_turn = {});

  // `force` if given, else the tokenizer's own chat template. Throws exl3::Error when the
  // tokenizer has none, when the template cannot be parsed, and when a forced format's marker
  // tokens are not tokens of `tok` (they would be tokenized as plain text).
  static ChatTemplate for_tokenizer(const Tokenizer& tok,
                                    std::optional<ChatFormat> force = std::nullopt);

  // The native format; nullopt for a Jinja template.
  std::optional<ChatFormat> format() const { return format_; }
  // For banners and --json: "chatml", "llama3", "plain", or "jinja".
  std::string_view kind() const;
  // For a start-up banner: "the model's chat template (FILE)" or "chatml (chosen explicitly)".
  std::string description() const;

  // Text turns. Throws exl3::Error when the template raises (e.g. roles that do not alternate).
  std::string render(std::span<const ChatMessage> messages,
                     bool add_generation_prompt = true) const;
  // Messages as transformers takes them (objects with role, content and any other keys:
  // tool_calls, reasoning_content, ...), `tools` (null or a list of JSON schemas) and `extra`
  // template variables (an object: enable_thinking, date_string, ...). Native formats take only
  // string role / content messages, no tools and no extra variables.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools = nullptr,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // Whether to encode the rendered prompt with add_special_tokens (true only for plain).
  bool encode_adds_special_tokens() const { return format_ == ChatFormat::kPlain; }
  // The token text that ends an assistant turn ("<|im_end|>", "<|eot_id|>"; empty when none is
  // known): a stop token for generation besides the model's end-of-sequence tokens.
  std::string_view end_of_turn() const { return end_of_turn_; }

 private:
  ChatTemplate() = default;

  std::optional<ChatFormat> format_;
  std::string bos_text_;
  std::string end_of_turn_;
  std::shared_ptr<const jinja::Template> jinja_;
  std::optional<std::string> bos_token_, eos_token_;
};

}  // namespace exl3
