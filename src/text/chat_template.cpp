// Chat prompts: the model's Jinja template through exl3::jinja, or a native format (see
// chat_template.hpp).
#include "exl3/text/chat_template.hpp"

#include <array>

#include "exl3/error.hpp"
#include "exl3/text/jinja.hpp"
#include "tokenizer_internal.hpp"

namespace exl3 {

namespace {

constexpr std::array<std::string_view, 2> kChatMLMarkers = {"<|im_start|>", "<|im_end|>"};
constexpr std::array<std::string_view, 3> kLlama3Markers = {"<|start_header_id|>",
                                                            "<|end_header_id|>", "<|eot_id|>"};
// Tokens that close an assistant turn in common templates. Generation stops at the model's EOS
// ids anyway; these cover templates whose turn end is a different token (ChatML's <|im_end|>
// when EOS is <|endoftext|>, Llama-3's <|eot_id|>, Phi-3's <|end|>, Gemma's <end_of_turn>).
constexpr std::array<std::string_view, 4> kTurnEnds = {"<|im_end|>", "<|eot_id|>", "<|end|>",
                                                       "<end_of_turn>"};

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

ChatTemplate::ChatTemplate(ChatFormat format, std::string bos_text)
    : format_(format), bos_text_(std::move(bos_text)) {
  if (format == ChatFormat::kChatML) end_of_turn_ = "<|im_end|>";
  if (format == ChatFormat::kLlama3) end_of_turn_ = "<|eot_id|>";
}

ChatTemplate ChatTemplate::from_jinja(std::string_view source, std::string name,
                                      std::optional<std::string> bos_token,
                                      std::optional<std::string> eos_token,
                                      std::string end_of_turn) {
  ChatTemplate t;
  t.jinja_ = std::make_shared<const jinja::Template>(source, std::move(name));
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  t.end_of_turn_ = std::move(end_of_turn);
  return t;
}

ChatTemplate ChatTemplate::for_tokenizer(const Tokenizer& tok, std::optional<ChatFormat> force) {
  if (!force) {
    const std::string& src = tok.chat_template();
    if (src.empty()) {
      fail(
          "{}: the model has no chat_template (tokenizer_config.json or chat_template.jinja); "
          "choose a format explicitly (--chat-format chatml|llama3|plain)",
          tok.source());
    }
    std::string turn_end;
    for (const auto m : kTurnEnds) {
      if (src.find(m) != std::string::npos && tok.token_to_id(m)) {
        turn_end = m;
        break;
      }
    }
    return from_jinja(src, tok.chat_template_source(), tok.bos_token(), tok.eos_token(),
                      std::move(turn_end));
  }
  const ChatFormat f = *force;
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

std::string_view ChatTemplate::kind() const {
  return format_ ? chat_format_name(*format_) : "jinja";
}

std::string ChatTemplate::description() const {
  if (jinja_) return "the model's chat template (" + jinja_->name() + ")";
  return std::string(kind()) + " (chosen explicitly)";
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  if (jinja_) {
    auto j = nlohmann::ordered_json::array();
    for (const auto& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
    return render(j, add_generation_prompt);
  }
  std::string out;
  switch (*format_) {
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

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& tools,
                                 const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) fail("chat messages must be a list, got {}", messages.type_name());
  if (!extra.is_object()) fail("extra chat template variables must be an object");
  if (!jinja_) {
    if (!tools.is_null()) {
      fail("chat format {} cannot list tools; use the model's own chat template",
           chat_format_name(*format_));
    }
    if (!extra.empty()) {
      fail(
          "chat format {} has no template variables (such as '{}'); they need the model's own "
          "chat template",
          chat_format_name(*format_), extra.begin().key());
    }
    std::vector<ChatMessage> text;
    for (const auto& m : messages) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !m.contains("content") || !m["content"].is_string()) {
        fail("chat format {} takes only messages with string role and content",
             chat_format_name(*format_));
      }
      text.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    return render(text, add_generation_prompt);
  }
  // The variables transformers' apply_chat_template passes: its special tokens first, then the
  // caller's keywords (which may override them), then the fixed arguments.
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (bos_token_) ctx["bos_token"] = *bos_token_;
  if (eos_token_) ctx["eos_token"] = *eos_token_;
  for (const auto& [k, v] : extra.items()) {
    if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt") {
      fail("extra chat template variable '{}' would replace a fixed argument", k);
    }
    ctx[k] = v;
  }
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  return jinja_->render(ctx);
}

}  // namespace exl3
