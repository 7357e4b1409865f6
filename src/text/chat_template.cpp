// Chat formats recognised from a model's Jinja chat_template (see chat_template.hpp).
#include "exl3/text/chat_template.hpp"

#include <array>

#include "exl3/error.hpp"
#include "tokenizer_internal.hpp"

namespace exl3 {

namespace {

constexpr std::array<std::string_view, 2> kChatMLMarkers = {"<|im_start|>", "<|im_end|>"};
constexpr std::array<std::string_view, 3> kLlama3Markers = {"<|start_header_id|>",
                                                            "<|end_header_id|>", "<|eot_id|>"};

template <size_t N>
bool contains_all(std::string_view s, const std::array<std::string_view, N>& markers) {
  for (const auto m : markers) {
    if (s.find(m) == std::string_view::npos) return false;
  }
  return true;
}

// Templates whose whole behaviour a native renderer reproduces, character for character, for any
// conversation of text turns. Recognition is by the exact text: a template that merely uses the
// same marker tokens may add a default system prompt (SmolLM2, Qwen2.5), tools or reasoning
// blocks (Qwen3), or a date preamble (Llama-3.1), and rendering it as plain ChatML or Llama-3
// would silently change the prompt.
struct KnownTemplate {
  std::string_view text;
  ChatFormat format;
};
// (Raw strings: the templates' \n are backslash-n inside Jinja string literals.)
constexpr std::array<KnownTemplate, 3> kKnownTemplates = {{
    // Plain ChatML as many fine-tunes ship it (the form TRL's setup_chat_format writes).
    {R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + )"
     R"('\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})",
     ChatFormat::kChatML},
    // The same with whitespace control and attribute access.
    {R"({%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + )"
     R"('\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})",
     ChatFormat::kChatML},
    // Meta-Llama-3-Instruct (3.0; 3.1 and later add a system preamble and tools).
    {R"({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + )"
     R"(message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 )"
     R"(%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ )"
     R"('<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})",
     ChatFormat::kLlama3},
}};

// Jinja's `trim` (Python str.strip): leading and trailing white space.
std::string_view trim(std::string_view s) {
  s.remove_prefix(tok::leading_space_len(s));
  return s.substr(0, tok::trailing_space_start(s));
}

}  // namespace

std::string_view chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatML:
      return "chatml";
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kPlain:
      return "plain";
  }
  return "?";
}

ChatFormat parse_chat_format(std::string_view name) {
  for (const auto f : {ChatFormat::kChatML, ChatFormat::kLlama3, ChatFormat::kPlain}) {
    if (name == chat_format_name(f)) return f;
  }
  fail("unknown chat format '{}' (choose chatml, llama3 or plain)", name);
}

std::optional<ChatFormat> detect_chat_format(std::string_view jinja_template) {
  // Jinja drops one trailing newline of a template (keep_trailing_newline is off), so a
  // chat_template.jinja file that ends in one renders the same.
  if (jinja_template.ends_with('\n')) jinja_template.remove_suffix(1);
  for (const auto& k : kKnownTemplates) {
    if (jinja_template == k.text) return k.format;
  }
  return std::nullopt;
}

std::optional<ChatFormat> chat_format_by_markers(std::string_view jinja_template) {
  const bool chatml = contains_all(jinja_template, kChatMLMarkers);
  const bool llama3 = contains_all(jinja_template, kLlama3Markers);
  if (chatml == llama3) return std::nullopt;  // neither, or ambiguous
  return chatml ? ChatFormat::kChatML : ChatFormat::kLlama3;
}

ChatTemplate::ChatTemplate(ChatFormat format, std::string bos_text)
    : format_(format), bos_text_(std::move(bos_text)) {}

ChatTemplate ChatTemplate::for_tokenizer(const Tokenizer& tok, std::optional<ChatFormat> force) {
  ChatFormat f{};
  if (force) {
    f = *force;
  } else if (tok.chat_template().empty()) {
    fail(
        "{}: the model has no chat_template (tokenizer_config.json or chat_template.jinja); choose "
        "a format "
        "explicitly (--chat-format chatml|llama3|plain)",
        tok.source());
  } else if (const auto d = detect_chat_format(tok.chat_template())) {
    f = *d;
  } else if (const auto like = chat_format_by_markers(tok.chat_template())) {
    fail(
        "{}: the chat_template uses {} marker tokens but is not a template exl3 renders exactly "
        "(it may add a "
        "default system prompt, tools or reasoning blocks, which plain {} would silently drop); "
        "exl3 does not run "
        "Jinja. hint: pass --chat-format {} to render plain {} turns anyway, or use the model's "
        "own template "
        "elsewhere",
        tok.chat_template_source(), chat_format_name(*like), chat_format_name(*like),
        chat_format_name(*like), chat_format_name(*like));
  } else {
    fail(
        "{}: unrecognised chat_template: it has neither the ChatML markers (<|im_start|>, "
        "<|im_end|>) nor the "
        "Llama-3 markers (<|start_header_id|>, <|end_header_id|>, <|eot_id|>); exl3 does not run "
        "Jinja, choose a "
        "format explicitly (--chat-format chatml|llama3|plain)",
        tok.chat_template_source());
  }
  auto require = [&](std::string_view marker) {
    if (!tok.token_to_id(marker)) {
      fail("{}: chat format {} needs the token {}, which this tokenizer lacks", tok.source(),
           chat_format_name(f), marker);
    }
  };
  if (f == ChatFormat::kChatML) {
    for (const auto m : kChatMLMarkers) require(m);
  } else if (f == ChatFormat::kLlama3) {
    for (const auto m : kLlama3Markers) require(m);
  }
  return ChatTemplate(f, f == ChatFormat::kLlama3 ? tok.bos_token().value_or("") : std::string());
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  std::string out;
  switch (format_) {
    case ChatFormat::kChatML:
      for (const auto& m : messages)
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::kLlama3:
      if (!messages.empty()) out += bos_text_;
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        out += trim(m.content);
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::kPlain:
      for (const auto& m : messages) {
        std::string role = m.role;
        if (!role.empty() && role[0] >= 'a' && role[0] <= 'z')
          role[0] = static_cast<char>(role[0] - 'a' + 'A');
        out += role + ": " + m.content + "\n\n";
      }
      if (add_generation_prompt) out += "Assistant:";
      break;
  }
  return out;
}

std::string_view ChatTemplate::end_of_turn() const {
  switch (format_) {
    case ChatFormat::kChatML:
      return "<|im_end|>";
    case ChatFormat::kLlama3:
      return "<|eot_id|>";
    case ChatFormat::kPlain:
      return "";
  }
  return "";
}

}  // namespace exl3
