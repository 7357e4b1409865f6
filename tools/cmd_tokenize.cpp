// `exl3 tokenize`: encode text (optionally as a chat prompt) or decode ids with a model's
// Hugging Face tokenizer.
#include <charconv>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/text/chat_template.hpp"
#include "exl3/text/tokenizer.hpp"

namespace exl3::cli {

namespace {

std::vector<int32_t> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < list.size()) {
    while (i < list.size() && (list[i] == ' ' || list[i] == ',')) ++i;
    if (i >= list.size()) break;
    int32_t v = 0;
    const auto [p, ec] = std::from_chars(list.data() + i, list.data() + list.size(), v);
    if (ec != std::errc() || (p != list.data() + list.size() && *p != ',' && *p != ' ')) {
      fail("--decode: '{}' is not a comma-separated list of token ids", list);
    }
    ids.push_back(v);
    i = static_cast<size_t>(p - list.data());
  }
  return ids;
}

// A token's text for a terminal: escapes for control characters and bytes that are not (yet)
// complete UTF-8, so "\xe4\xbd" shows as such instead of garbage.
std::string printable(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    const size_t len = c < 0x80         ? 1
                       : (c >> 5) == 6  ? 2
                       : (c >> 4) == 14 ? 3
                       : (c >> 3) == 30 ? 4
                                        : 0;
    bool ok = len > 0 && i + len <= bytes.size();
    for (size_t k = 1; ok && k < len; ++k)
      ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (ok && len > 1) {
      out.append(bytes, i, len);
      i += len;
      continue;
    }
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\\')
      out += "\\\\";
    else if (c < 0x20 || c >= 0x7F)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
    ++i;
  }
  return out;
}

std::string dump(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

Runner add_tokenize(CLI::App& app, Common&) {
  struct Opts {
    std::string model, text, file, decode, system, chat_format;
    bool json = false, chat = false, no_special = false, skip_special = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL_DIR", o->model,
                 "Model folder with tokenizer.json (+ tokenizer_config.json), or a tokenizer.json")
      ->required();
  auto* text = app.add_option("--text", o->text, "Text to encode");
  auto* file =
      app.add_option("--file", o->file, "Encode the contents of this file instead (UTF-8)");
  auto* decode = app.add_option("--decode", o->decode,
                                "Decode these token ids instead, e.g. --decode 9707,1879");
  text->excludes(file)->excludes(decode);
  file->excludes(decode);
  app.add_flag("--json", o->json,
               "Print one JSON document (encode: ids, tokens, count; decode: text)");
  auto* chat_flag = app.add_flag(
      "--chat", o->chat,
      "Encode --text as one user turn of a chat prompt (the model's chat format, with the "
      "assistant generation prompt)");
  app.add_option("--system", o->system, "With --chat: a system message before the user turn")
      ->needs(chat_flag);
  app.add_option("--chat-format", o->chat_format,
                 "With --chat: use this native format instead of the model's chat_template")
      ->check(CLI::IsMember({"chatml", "llama3", "plain"}))
      ->needs(chat_flag);
  app.add_flag("--no-special", o->no_special,
               "Encode without the tokens the post-processor adds (e.g. Llama-3's BOS); special "
               "tokens written in "
               "the text are still recognised");
  app.add_flag("--skip-special", o->skip_special,
               "With --decode: leave special tokens out of the text");
  app.footer(
      "Examples:\n"
      "  exl3 tokenize ./Qwen3-8B-exl3 --text 'Hello world'            ids and the text of each "
      "token\n"
      "  exl3 tokenize ./Qwen3-8B-exl3 --text 'Hello world' --json     {\"ids\": [...], "
      "\"tokens\": [...], ...}\n"
      "  exl3 tokenize ./Qwen3-8B-exl3 --decode 9707,1879               back to text\n"
      "  exl3 tokenize ./Llama-3.1-8B-exl3 --chat --text 'Hi' --system 'Be brief'\n\n"
      "Reads Hugging Face byte-level BPE tokenizers (GPT-2, Llama-3, Qwen2/3 families) and "
      "produces the same\n"
      "ids as the `tokenizers` library. Tokens are shown as the text they decode to, with \\n, \\t "
      "and \\xNN\n"
      "escapes (\\xNN: part of a multi-byte character that continues in the next token).\n"
      "--chat renders the model's own Jinja chat_template (tokenizer_config.json or\n"
      "chat_template.jinja) byte for byte as transformers' apply_chat_template does; a template\n"
      "using something the interpreter lacks is refused with its line and column, and\n"
      "--chat-format chatml|llama3|plain picks a native format instead.");
  return [o] {
    const auto tok = Tokenizer::load(o->model);
    if (!o->decode.empty()) {
      const auto ids = parse_ids(o->decode);
      for (const int32_t id : ids) {
        if (!tok.id_to_token(id))
          fail("--decode: token id {} is not in the vocabulary (0..{})", id, tok.vocab_size() - 1);
      }
      const std::string out = tok.decode(ids, o->skip_special);
      if (o->json) {
        fmt::print("{}\n", dump({{"ids", ids}, {"text", out}}));
      } else {
        fmt::print("{}\n", out);
      }
      return 0;
    }

    std::string input = o->file.empty() ? o->text : read_text_file(o->file);
    if (o->file.empty() && o->text.empty() && !o->chat) {
      fail("nothing to do: give --text, --file or --decode (see exl3 tokenize --help)");
    }
    std::string prompt = input;
    bool add_special = !o->no_special;
    std::optional<ChatTemplate> chat;
    if (o->chat) {
      std::optional<ChatFormat> force;
      if (!o->chat_format.empty()) force = parse_chat_format(o->chat_format);
      chat = ChatTemplate::for_tokenizer(tok, force);
      std::vector<ChatMessage> msgs;
      if (!o->system.empty()) msgs.push_back({"system", o->system});
      msgs.push_back({"user", input});
      prompt = chat->render(msgs, true);
      add_special = add_special && chat->encode_adds_special_tokens();
    }
    const auto ids = tok.encode(prompt, add_special);

    if (o->json) {
      nlohmann::json tokens = nlohmann::json::array();
      for (const int32_t id : ids) {
        tokens.push_back({{"id", id},
                          {"token", tok.id_to_token(id).value_or("")},
                          {"text", tok.decode(std::vector<int32_t>{id})},
                          {"special", tok.is_special(id)}});
      }
      nlohmann::json j = {{"ids", ids}, {"count", ids.size()}, {"tokens", tokens}};
      if (chat) {
        j["chat_format"] = std::string(chat->kind());
        j["prompt"] = prompt;
      }
      fmt::print("{}\n", dump(j));
      return 0;
    }
    if (chat) fmt::print("chat: {}; prompt:\n{}\n\n", chat->description(), prompt);
    fmt::print("{} tokens from {} bytes (vocabulary {}):\n", ids.size(), prompt.size(),
               tok.vocab_size());
    for (size_t i = 0; i < ids.size(); ++i) {
      fmt::print("{:>6} {:>8}  \"{}\"{}\n", i, ids[i],
                 printable(tok.token_bytes(ids[i]).value_or("")),
                 tok.is_special(ids[i]) ? "  (special)" : "");
    }
    std::string list;
    for (size_t i = 0; i < ids.size(); ++i) list += (i ? "," : "") + std::to_string(ids[i]);
    fmt::print("ids: {}\n", list);
    return 0;
  };
}

}  // namespace exl3::cli
