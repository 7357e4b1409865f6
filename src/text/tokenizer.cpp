// Tokenizer: loading tokenizer.json / tokenizer_config.json, the encode pipeline, decode and the
// streaming decoder. See include/exl3/text/tokenizer.hpp for what is supported and why.
#include "exl3/text/tokenizer.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"  // read_text_file
#include "tokenizer_internal.hpp"

namespace exl3 {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The GPT-2 pre-tokenization pattern ByteLevel applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

struct TokenEntry {
  std::string token;  // as stored (byte-level form for model tokens, content for added tokens)
  std::string bytes;  // what decode emits for it
  bool special = false;
};

// One TemplateProcessing `single` template: ids before and after the sequence.
struct Wrap {
  std::vector<int32_t> before, after;
};

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  for (size_t at = 0;;) {
    const size_t hit = s.find(from, at);
    if (hit == std::string_view::npos) {
      out.append(s.substr(at));
      return out;
    }
    out.append(s.substr(at, hit - at)).append(to);
    at = hit + from.size();
  }
}

// The byte of a SentencePiece byte-fallback token `<0xXX>`, or nullopt for any other token.
std::optional<char> fallback_byte(std::string_view t) {
  const auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return std::nullopt;
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<char>(hi * 16 + lo);
}

std::string type_of(const json& j) {
  if (!j.is_object()) return "";
  const auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

// A normalizer step: NFC, Prepend(a) (to non-empty text) or Replace(a -> b) (a literal).
struct NormStep {
  enum class Kind { kNfc, kPrepend, kReplace } kind;
  std::string a, b;
};

// The Metaspace pre-tokenizer / decoder: spaces <-> `replacement`, a leading one prepended to
// every piece (kAlways) or to the text's first (kFirst), and words cut before each one (split).
struct Metaspace {
  enum class Scheme { kAlways, kFirst, kNever } scheme = Scheme::kAlways;
  std::string replacement = "\xE2\x96\x81";  // U+2581
  bool split = true;
};

// A decoder step over the token strings (SentencePiece-style tokenizers; byte-level ones decode
// by their byte alphabet instead).
struct DecodeStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string a, b;  // Replace: a -> b; Strip: a is the stripped character
  int start = 0, stop = 0;
  Metaspace metaspace;
};

struct Tokenizer::Impl {
  std::string source;
  tok::BpeModel bpe;
  std::vector<AddedToken> added;  // matcher values index this
  tok::TokenMatcher raw_matcher, norm_matcher;
  std::vector<NormStep> normalizers;
  std::vector<tok::Regex> splits;  // Split(Isolated) steps, in order, before ByteLevel
  std::optional<tok::Regex> byte_level_regex;
  std::optional<Metaspace> metaspace;  // the pre-tokenizer of a SentencePiece-style BPE
  std::vector<DecodeStep> decoders;    // SentencePiece-style BPE: what decode() runs
  std::vector<Wrap> post;              // TemplateProcessing steps in order
  std::unordered_map<int32_t, TokenEntry> by_id;
  tok::Vocab token_ids;  // every token string -> id (added tokens take precedence)
  int32_t vocab_size = 0;
  std::optional<int32_t> bos_id, eos_id;
  std::optional<std::string> bos_token, eos_token;
  std::string chat_template, chat_template_file;

  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void split_added(std::string_view s, const tok::TokenMatcher& m,
                   std::vector<tok::TokenMatcher::Match>& out) const;
  std::string normalize(std::string_view s) const;
  // `at_start`: s begins the text (Metaspace's prepend_scheme "first").
  void encode_normalized(std::string_view s, bool at_start, std::vector<int32_t>& out) const;
  void pre_tokenize_and_bpe(std::string_view s, bool at_start, std::vector<int32_t>& out) const;
  // decode() of a SentencePiece-style tokenizer: the decoder steps over the token strings.
  std::string decode_pieces(std::span<const int32_t> ids, bool skip_special) const;
};

// ---- loading ------------------------------------------------------------------------------------

namespace {

class Loader {
 public:
  Loader(Tokenizer::Impl& t, std::string file) : t_(t), file_(std::move(file)) {}

  void load(const json& j) {
    if (!j.is_object()) fail("{}: expected a JSON object at the top level", file_);
    const json& model = field(j, "model", "model");
    load_model(model);
    load_added_tokens(j.contains("added_tokens") ? j["added_tokens"] : json::array());
    load_normalizer(j.contains("normalizer") ? j["normalizer"] : json(nullptr), "normalizer");
    load_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(nullptr));
    load_decoder(j.contains("decoder") ? j["decoder"] : json(nullptr), "decoder");
    load_post_processor(j.contains("post_processor") ? j["post_processor"] : json(nullptr),
                        "post_processor");
    build_tables();
  }

 private:
  [[noreturn]] void unsupported(const std::string& where, const std::string& what) const {
    fail(
        "{}: {}: {} is not supported (exl3 reads byte-level BPE tokenizers, GPT-2, Llama-3 and "
        "Qwen2/3 style, and SentencePiece-style BPE with byte fallback, Llama-2 and Mistral "
        "style)",
        file_, where, what);
  }

  const json& field(const json& obj, const char* key, const std::string& where) const {
    const auto it = obj.find(key);
    if (it == obj.end()) fail("{}: {}: missing", file_, where);
    return *it;
  }

  bool flag(const json& obj, const char* key, bool dflt, const std::string& where) const {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail("{}: {}.{}: expected true or false", file_, where, key);
    return it->get<bool>();
  }

  static bool null_or_empty(const json& obj, const char* key) {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ||
           (it->is_string() && it->get_ref<const std::string&>().empty());
  }

  int32_t token_id(const json& v, const std::string& where) const {
    if (!v.is_number_integer()) fail("{}: {}: expected an integer token id", file_, where);
    const auto id = v.get<int64_t>();
    if (id < 0 || id >= std::numeric_limits<int32_t>::max())
      fail("{}: {}: token id {} out of range", file_, where, id);
    return static_cast<int32_t>(id);
  }

  void load_model(const json& m) {
    if (!m.is_object()) fail("{}: model: expected an object", file_);
    const std::string type = type_of(m);
    if (type.empty() && !m.contains("merges"))
      unsupported("model", "a model without \"type\" and merges");
    if (!type.empty() && type != "BPE") unsupported("model.type", "model type '" + type + "'");
    if (const auto it = m.find("dropout"); it != m.end() && !it->is_null()) {
      if (!it->is_number() || it->get<double>() != 0.0) unsupported("model.dropout", "BPE dropout");
    }
    if (!null_or_empty(m, "continuing_subword_prefix"))
      unsupported("model.continuing_subword_prefix", "a subword prefix");
    if (!null_or_empty(m, "end_of_word_suffix"))
      unsupported("model.end_of_word_suffix", "an end-of-word suffix");
    auto& bpe = t_.bpe;
    bpe.byte_fallback = flag(m, "byte_fallback", false, "model");
    bpe.fuse_unk = flag(m, "fuse_unk", false, "model");
    bpe.ignore_merges = flag(m, "ignore_merges", false, "model");

    const json& vocab = field(m, "vocab", "model.vocab");
    if (!vocab.is_object()) fail("{}: model.vocab: expected an object of token -> id", file_);
    bpe.vocab.reserve(vocab.size());
    std::unordered_map<int32_t, const std::string*> seen;
    seen.reserve(vocab.size());
    for (const auto& [tok, v] : vocab.items()) {
      const int32_t id = token_id(v, "model.vocab['" + tok + "']");
      const auto [it, fresh] = bpe.vocab.emplace(tok, id);
      if (const auto [s, ok] = seen.emplace(id, &it->first); !ok) {
        fail("{}: model.vocab: id {} is used by both '{}' and '{}'", file_, id, *s->second, tok);
      }
      (void)fresh;
    }

    if (const auto it = m.find("unk_token"); it != m.end() && !it->is_null()) {
      if (!it->is_string()) fail("{}: model.unk_token: expected a string", file_);
      const auto u = bpe.vocab.find(it->get<std::string>());
      if (u == bpe.vocab.end())
        fail("{}: model.unk_token '{}' is not in the vocab", file_, it->get<std::string>());
      bpe.unk_id = u->second;
    }

    const auto& alpha = tok::ByteAlphabet::get();
    for (int b = 0; b < 256; ++b) {
      const auto it = bpe.vocab.find(alpha.utf8[static_cast<size_t>(b)]);
      bpe.byte_id[static_cast<size_t>(b)] = it == bpe.vocab.end() ? -1 : it->second;
      const auto fb = bpe.vocab.find(fmt::format("<0x{:02X}>", b));
      bpe.fallback_id[static_cast<size_t>(b)] = fb == bpe.vocab.end() ? -1 : fb->second;
    }

    const json& merges = field(m, "merges", "model.merges");
    if (!merges.is_array()) fail("{}: model.merges: expected an array", file_);
    bpe.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& e = merges[i];
      std::string a, b;
      if (e.is_string()) {
        const auto& s = e.get_ref<const std::string&>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          fail("{}: model.merges[{}]: '{}' is not two tokens separated by one space", file_, i, s);
        }
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>(), b = e[1].get<std::string>();
      } else {
        fail("{}: model.merges[{}]: expected \"a b\" or [\"a\", \"b\"]", file_, i);
      }
      const auto ia = bpe.vocab.find(a), ib = bpe.vocab.find(b), iab = bpe.vocab.find(a + b);
      if (ia == bpe.vocab.end())
        fail("{}: model.merges[{}]: token '{}' is not in the vocab", file_, i, a);
      if (ib == bpe.vocab.end())
        fail("{}: model.merges[{}]: token '{}' is not in the vocab", file_, i, b);
      if (iab == bpe.vocab.end())
        fail("{}: model.merges[{}]: merged token '{}' is not in the vocab", file_, i, a + b);
      // A repeated pair keeps its last rank, as in the reference.
      bpe.merges[tok::BpeModel::key(ia->second, ib->second)] = {static_cast<int32_t>(i),
                                                                iab->second};
    }
  }

  void load_added_tokens(const json& arr) {
    if (!arr.is_array()) fail("{}: added_tokens: expected an array", file_);
    std::unordered_map<std::string, size_t> by_content;
    std::unordered_map<int32_t, size_t> by_id;
    for (size_t i = 0; i < arr.size(); ++i) {
      const json& e = arr[i];
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      if (!e.is_object()) fail("{}: {}: expected an object", file_, where);
      AddedToken t;
      t.id = token_id(field(e, "id", where + ".id"), where + ".id");
      const json& c = field(e, "content", where + ".content");
      if (!c.is_string() || c.get_ref<const std::string&>().empty())
        fail("{}: {}.content: expected a non-empty string", file_, where);
      t.content = c.get<std::string>();
      t.special = flag(e, "special", false, where);
      t.single_word = flag(e, "single_word", false, where);
      t.lstrip = flag(e, "lstrip", false, where);
      t.rstrip = flag(e, "rstrip", false, where);
      t.normalized = flag(e, "normalized", !t.special, where);
      if (by_content.count(t.content))
        fail("{}: {}: token '{}' is listed twice", file_, where, t.content);
      if (by_id.count(t.id)) fail("{}: {}: id {} is used by two added tokens", file_, where, t.id);
      if (const auto it = t_.bpe.vocab.find(t.content);
          it != t_.bpe.vocab.end() && it->second != t.id) {
        fail("{}: {}: token '{}' has id {} but the model vocab gives it id {}", file_, where,
             t.content, t.id, it->second);
      }
      by_content.emplace(t.content, i);
      by_id.emplace(t.id, i);
      t_.added.push_back(std::move(t));
    }
    // The reference does not take the ids of added tokens missing from the model vocab from the
    // file: it numbers them in list order from the vocab's size (and warns when the file differs).
    // Files it wrote agree; refuse any other instead of using different ids than it would.
    const auto vocab_count = static_cast<int64_t>(t_.bpe.vocab.size());
    std::optional<int64_t> max_id;
    for (size_t i = 0; i < t_.added.size(); ++i) {
      const auto& a = t_.added[i];
      if (!t_.bpe.vocab.count(a.content)) {
        int64_t expect = vocab_count;
        if (max_id && (vocab_count == 0 || *max_id >= vocab_count)) expect = *max_id + 1;
        if (a.id != expect) {
          fail(
              "{}: added_tokens[{}]: token '{}' has id {}, but tokenizers numbers it {} (added "
              "tokens outside the "
              "model vocab follow it in order); the file is inconsistent",
              file_, i, a.content, a.id, expect);
        }
      }
      max_id = std::max(max_id.value_or(a.id), static_cast<int64_t>(a.id));
    }
    // A model token with the id of a different added token would make decode ambiguous.
    for (const auto& [tok, id] : t_.bpe.vocab) {
      if (const auto it = by_id.find(id);
          it != by_id.end() && t_.added[it->second].content != tok) {
        fail("{}: added token '{}' has id {}, which the model vocab gives to '{}'", file_,
             t_.added[it->second].content, id, tok);
      }
    }
  }

  // A Replace normalizer's or decoder's literal pattern ({"String": ...}; regexes unsupported).
  std::string literal_pattern(const json& s, const std::string& where) const {
    const json& pat = field(s, "pattern", where + ".pattern");
    if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string()) {
      unsupported(where + ".pattern", "a Replace pattern other than {\"String\": ...}");
    }
    const auto& a = pat["String"].get_ref<const std::string&>();
    if (a.empty()) fail("{}: {}.pattern: empty string", file_, where);
    const json& content = field(s, "content", where + ".content");
    if (!content.is_string()) fail("{}: {}.content: expected a string", file_, where);
    return a;
  }

  Metaspace metaspace(const json& s, const std::string& where) const {
    Metaspace m;
    const json& r = field(s, "replacement", where + ".replacement");
    if (!r.is_string() || tok::utf8_step(r.get_ref<const std::string&>(), 0).len !=
                              r.get_ref<const std::string&>().size()) {
      fail("{}: {}.replacement: expected one character", file_, where);
    }
    m.replacement = r.get<std::string>();
    const std::string scheme = s.value("prepend_scheme", std::string("always"));
    if (scheme == "always") {
      m.scheme = Metaspace::Scheme::kAlways;
    } else if (scheme == "first") {
      m.scheme = Metaspace::Scheme::kFirst;
    } else if (scheme == "never") {
      m.scheme = Metaspace::Scheme::kNever;
    } else {
      fail("{}: {}.prepend_scheme: '{}' (expected always, first or never)", file_, where, scheme);
    }
    m.split = flag(s, "split", true, where);
    return m;
  }

  void load_normalizer(const json& n, const std::string& where) {
    if (n.is_null()) return;
    const std::string type = type_of(n);
    if (type == "NFC") {
      t_.normalizers.push_back({NormStep::Kind::kNfc, {}, {}});
    } else if (type == "Prepend") {
      const json& p = field(n, "prepend", where + ".prepend");
      if (!p.is_string()) fail("{}: {}.prepend: expected a string", file_, where);
      t_.normalizers.push_back({NormStep::Kind::kPrepend, p.get<std::string>(), {}});
    } else if (type == "Replace") {
      const std::string a = literal_pattern(n, where);
      t_.normalizers.push_back({NormStep::Kind::kReplace, a, n["content"].get<std::string>()});
    } else if (type == "Sequence") {
      const json& list = field(n, "normalizers", where + ".normalizers");
      if (!list.is_array()) fail("{}: {}.normalizers: expected an array", file_, where);
      for (size_t i = 0; i < list.size(); ++i)
        load_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]");
    } else {
      unsupported(where, "normalizer '" + (type.empty() ? n.dump() : type) +
                             "' (supported: none, NFC, Prepend, Replace with a string)");
    }
  }

  void flatten_pre_tokenizers(const json& p, const std::string& where,
                              std::vector<std::pair<const json*, std::string>>& out) {
    if (type_of(p) == "Sequence") {
      const json& list = field(p, "pretokenizers", where + ".pretokenizers");
      if (!list.is_array()) fail("{}: {}.pretokenizers: expected an array", file_, where);
      for (size_t i = 0; i < list.size(); ++i) {
        flatten_pre_tokenizers(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", out);
      }
    } else {
      out.emplace_back(&p, where);
    }
  }

  void load_pre_tokenizer(const json& p) {
    if (t_.bpe.byte_fallback) {  // SentencePiece style: the whole text, or Metaspace words
      if (p.is_null()) return;
      if (type_of(p) != "Metaspace") {
        unsupported("pre_tokenizer", "pre-tokenizer '" + type_of(p) +
                                         "' with a byte_fallback BPE (supported: none, Metaspace)");
      }
      t_.metaspace = metaspace(p, "pre_tokenizer");
      return;
    }
    if (p.is_null())
      unsupported("pre_tokenizer", "a BPE without the ByteLevel pre-tokenizer (not byte-level)");
    std::vector<std::pair<const json*, std::string>> steps;
    flatten_pre_tokenizers(p, "pre_tokenizer", steps);
    bool byte_level = false;
    for (const auto& [sp, where] : steps) {
      const json& s = *sp;
      const std::string type = type_of(s);
      if (byte_level) unsupported(where, "a pre-tokenizer after ByteLevel ('" + type + "')");
      if (type == "Split") {
        const json& pat = field(s, "pattern", where + ".pattern");
        const std::string behavior = s.value("behavior", std::string());
        if (behavior != "Isolated")
          unsupported(where + ".behavior",
                      "Split behavior '" + behavior + "' (supported: Isolated)");
        if (flag(s, "invert", false, where)) unsupported(where + ".invert", "an inverted Split");
        if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
          t_.splits.emplace_back(pat["Regex"].get<std::string>(), tok::Regex::Syntax::kOniguruma,
                                 file_ + ": " + where + ".pattern");
        } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
          if (pat["String"].get_ref<const std::string&>().empty())
            fail("{}: {}.pattern: empty string", file_, where);
          t_.splits.emplace_back(pat["String"].get<std::string>(), tok::Regex::Syntax::kLiteral,
                                 file_ + ": " + where + ".pattern");
        } else {
          fail("{}: {}.pattern: expected {{\"Regex\": ...}} or {{\"String\": ...}}", file_, where);
        }
      } else if (type == "Digits") {
        // tokenizers splits off characters for which Rust's char::is_numeric holds (general
        // categories Nd, Nl, No: \p{N}), each on its own or runs of them together: the same as
        // an isolating Split on \p{N} or \p{N}+ (SmolLM2's pre-tokenizer starts with it).
        const bool individual = flag(s, "individual_digits", false, where);
        t_.splits.emplace_back(individual ? "\\p{N}" : "\\p{N}+", tok::Regex::Syntax::kOniguruma,
                               file_ + ": " + where);
      } else if (type == "ByteLevel") {
        if (flag(s, "add_prefix_space", true, where))
          unsupported(where + ".add_prefix_space", "ByteLevel add_prefix_space=true");
        if (flag(s, "use_regex", true, where)) {
          t_.byte_level_regex.emplace(kGpt2Pattern, tok::Regex::Syntax::kOniguruma,
                                      "ByteLevel GPT-2 pattern");
        }
        byte_level = true;
      } else {
        unsupported(where, "pre-tokenizer '" + (type.empty() ? s.dump() : type) +
                               "' (supported: Split, Digits, ByteLevel)");
      }
    }
    if (!byte_level)
      unsupported("pre_tokenizer", "a BPE without the ByteLevel pre-tokenizer (not byte-level)");
  }

  void load_decoder(const json& d, const std::string& where) {
    const std::string type = type_of(d);
    if (t_.bpe.byte_fallback && type != "Sequence") {
      DecodeStep s{};
      if (type == "Replace") {
        s.kind = DecodeStep::Kind::kReplace;
        s.a = literal_pattern(d, where);
        s.b = d["content"].get<std::string>();
      } else if (type == "ByteFallback") {
        s.kind = DecodeStep::Kind::kByteFallback;
      } else if (type == "Fuse") {
        s.kind = DecodeStep::Kind::kFuse;
      } else if (type == "Strip") {
        s.kind = DecodeStep::Kind::kStrip;
        const json& c = field(d, "content", where + ".content");
        if (!c.is_string() || c.get_ref<const std::string&>().size() != 1) {
          unsupported(where + ".content", "a Strip of other than one ASCII character");
        }
        s.a = c.get<std::string>();
        const json& start = field(d, "start", where + ".start");
        const json& stop = field(d, "stop", where + ".stop");
        if (!start.is_number_unsigned() || !stop.is_number_unsigned() ||
            start.get<int64_t>() > 64 || stop.get<int64_t>() > 64) {
          fail("{}: {}: start and stop must be counts of at most 64", file_, where);
        }
        s.start = start.get<int>();
        s.stop = stop.get<int>();
      } else if (type == "Metaspace") {
        s.kind = DecodeStep::Kind::kMetaspace;
        s.metaspace = metaspace(d, where);
      } else {
        unsupported(where,
                    "decoder '" + (d.is_null() ? std::string("null") : type) +
                        "' with a byte_fallback BPE (supported: Replace, ByteFallback, Fuse, "
                        "Strip, Metaspace)");
      }
      t_.decoders.push_back(std::move(s));
      return;
    }
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      const json& list = field(d, "decoders", where + ".decoders");
      if (!list.is_array() || list.empty())
        fail("{}: {}.decoders: expected a non-empty array", file_, where);
      for (size_t i = 0; i < list.size(); ++i)
        load_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]");
      return;
    }
    unsupported(where, "decoder '" +
                           (d.is_null()    ? std::string("null")
                            : type.empty() ? d.dump()
                                           : type) +
                           "' (a byte-level BPE needs the ByteLevel decoder)");
  }

  void load_post_processor(const json& p, const std::string& where) {
    if (p.is_null()) return;
    const std::string type = type_of(p);
    if (type == "ByteLevel") return;  // offsets only
    if (type == "Sequence") {
      const json& list = field(p, "processors", where + ".processors");
      if (!list.is_array()) fail("{}: {}.processors: expected an array", file_, where);
      for (size_t i = 0; i < list.size(); ++i)
        load_post_processor(list[i], where + ".processors[" + std::to_string(i) + "]");
      return;
    }
    if (type != "TemplateProcessing") {
      unsupported(where, "post-processor '" + (type.empty() ? p.dump() : type) +
                             "' (supported: ByteLevel, TemplateProcessing)");
    }
    const json& single = field(p, "single", where + ".single");
    const json& specials = p.contains("special_tokens") ? p["special_tokens"] : json::object();
    if (!single.is_array()) fail("{}: {}.single: expected an array", file_, where);
    Wrap w;
    bool seen_a = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& item = single[i];
      const std::string iw = where + ".single[" + std::to_string(i) + "]";
      if (item.is_object() && item.contains("Sequence")) {
        const std::string id = item["Sequence"].value("id", std::string());
        if (id != "A" || seen_a)
          unsupported(iw, "a single template with sequence '" + id + "' (expected one $A)");
        seen_a = true;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].value("id", std::string());
        const auto it = specials.find(name);
        if (it == specials.end() || !it->is_object() || !it->contains("ids") ||
            !(*it)["ids"].is_array()) {
          fail("{}: {}: special token '{}' is not listed in {}.special_tokens", file_, iw, name,
               where);
        }
        for (const auto& v : (*it)["ids"]) (seen_a ? w.after : w.before).push_back(token_id(v, iw));
      } else {
        fail("{}: {}: expected {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", file_, iw);
      }
    }
    if (!seen_a) unsupported(where + ".single", "a template without $A");
    t_.post.push_back(std::move(w));
  }

  void build_tables() {
    auto& t = t_;
    // Matchers: special tokens first, then the others, in file order (the reference's order,
    // which decides between two tokens with the same normalized text).
    for (const bool special : {true, false}) {
      for (size_t i = 0; i < t.added.size(); ++i) {
        const auto& a = t.added[i];
        if (a.special != special) continue;
        if (a.normalized) {
          t.norm_matcher.add(t.normalize(a.content), static_cast<int32_t>(i));
        } else {
          t.raw_matcher.add(a.content, static_cast<int32_t>(i));
        }
      }
    }
    const bool byte_level = !t.bpe.byte_fallback;
    auto entry_for = [&](const std::string& token, bool special) {
      if (byte_level) {
        auto bytes = tok::byte_level_decode(token);
        return TokenEntry{token, bytes ? std::move(*bytes) : token, special};
      }
      // SentencePiece-style tokens are text (decode() runs the decoder steps over a whole
      // sequence); a token alone: <0xXX> is its byte, the replacement character a space.
      std::string bytes = token;
      if (const auto b = fallback_byte(token)) {
        bytes.assign(1, *b);
      } else {
        for (const auto& d : t.decoders) {
          if (d.kind == DecodeStep::Kind::kReplace) bytes = replace_all(bytes, d.a, d.b);
          if (d.kind == DecodeStep::Kind::kMetaspace)
            bytes = replace_all(bytes, d.metaspace.replacement, " ");
        }
      }
      return TokenEntry{token, std::move(bytes), special};
    };
    t.by_id.reserve(t.bpe.vocab.size() + t.added.size());
    t.token_ids.reserve(t.bpe.vocab.size() + t.added.size());
    int32_t max_id = -1;
    for (const auto& a : t.added) {
      t.by_id.emplace(a.id, entry_for(a.content, a.special));
      t.token_ids.emplace(a.content, a.id);
      max_id = std::max(max_id, a.id);
    }
    for (const auto& [token, id] : t.bpe.vocab) {
      t.by_id.emplace(id, entry_for(token, false));
      t.token_ids.emplace(token, id);
      max_id = std::max(max_id, id);
    }
    for (const auto& w : t.post) {
      for (const auto* list : {&w.before, &w.after}) {
        for (const int32_t id : *list) {
          if (!t.by_id.count(id))
            fail("{}: post_processor: template token id {} is not in the vocab", file_, id);
        }
      }
    }
    t.vocab_size = max_id + 1;
  }

  Tokenizer::Impl& t_;
  std::string file_;
};

// bos_token / eos_token: a string, an AddedToken object {"content": ...}, or null.
std::optional<std::string> special_token_text(const json& cfg, const char* key,
                                              const std::string& file) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail("{}: {}: expected a string or an object with \"content\"", file, key);
}

void load_config(Tokenizer::Impl& t, std::string_view text, const std::string& file) {
  json cfg;
  try {
    cfg = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", file, e.what());
  }
  if (!cfg.is_object()) fail("{}: expected a JSON object at the top level", file);
  auto resolve = [&](const char* key, std::optional<std::string>& text_out,
                     std::optional<int32_t>& id_out) {
    text_out = special_token_text(cfg, key, file);
    if (!text_out) return;
    const auto it = t.token_ids.find(*text_out);
    if (it == t.token_ids.end())
      fail("{}: {} '{}' is not a token of the tokenizer", file, key, *text_out);
    id_out = it->second;
  };
  resolve("bos_token", t.bos_token, t.bos_id);
  resolve("eos_token", t.eos_token, t.eos_id);
  if (const auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
    if (it->is_string()) {
      t.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      // Named templates [{"name": ..., "template": ...}]: the "default" one.
      for (const auto& e : *it) {
        if (e.is_object() && e.value("name", std::string()) == "default" &&
            e.contains("template") && e["template"].is_string()) {
          t.chat_template = e["template"].get<std::string>();
        }
      }
      if (t.chat_template.empty())
        fail("{}: chat_template: a list of templates without a \"default\" one", file);
    } else {
      fail("{}: chat_template: expected a string", file);
    }
    t.chat_template_file = file;
  }
}

std::shared_ptr<Tokenizer::Impl> build(std::string_view tokenizer_json, const std::string& file,
                                       std::string_view config_json,
                                       const std::string& config_file) {
  auto t = std::make_shared<Tokenizer::Impl>();
  t->source = file;
  json j;
  try {
    j = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", file, e.what());
  }
  try {
    Loader(*t, file).load(j);
    if (!config_json.empty()) load_config(*t, config_json, config_file);
  } catch (const json::exception& e) {
    fail("{}: unexpected JSON content: {}", file, e.what());
  }
  return t;
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json,
                               std::string_view tokenizer_config_json,
                               const std::string& source_name) {
  return Tokenizer(build(tokenizer_json, source_name, tokenizer_config_json,
                         source_name + " (tokenizer_config.json)"));
}

Tokenizer Tokenizer::load(const fs::path& path) {
  const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
  const fs::path file = fs::is_directory(path) ? path / "tokenizer.json" : path;
  if (!fs::exists(file))
    fail("{}: no tokenizer.json (a Hugging Face model folder has one)", file.string());
  const std::string text = read_text_file(file);
  const fs::path cfg = dir / "tokenizer_config.json";
  std::string cfg_text;
  if (fs::exists(cfg)) cfg_text = read_text_file(cfg);
  auto impl = build(text, file.string(), cfg_text, cfg.string());
  if (impl->chat_template.empty() && fs::exists(dir / "chat_template.jinja")) {
    impl->chat_template = read_text_file(dir / "chat_template.jinja");
    impl->chat_template_file = (dir / "chat_template.jinja").string();
  }
  return Tokenizer(std::move(impl));
}

// ---- encode -------------------------------------------------------------------------------------

void Tokenizer::Impl::split_added(std::string_view s, const tok::TokenMatcher& m,
                                  std::vector<tok::TokenMatcher::Match>& out) const {
  // The reference's AddedVocabulary::find_matches; value -1 marks plain text.
  size_t start_offset = 0;
  size_t pos = 0;
  if (!m.empty()) {
    while (const auto mt = m.find(s, pos)) {
      pos = mt->end;
      size_t start = mt->begin, stop = mt->end;
      const auto& a = added[static_cast<size_t>(mt->value)];
      if (a.single_word) {
        const bool start_space = start == 0 || !tok::ends_with_word_char(s.substr(0, start));
        const bool stop_space = stop == s.size() || !tok::starts_with_word_char(s.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (a.lstrip) start = std::max(tok::trailing_space_start(s.substr(0, start)), start_offset);
      if (a.rstrip) stop += tok::leading_space_len(s.substr(stop));
      start = std::max(start, start_offset);  // an rstrip may have consumed the start of this match
      if (start_offset < start) out.push_back({start_offset, start, -1});
      out.push_back({start, stop, mt->value});
      start_offset = stop;
    }
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), -1});
}

std::string Tokenizer::Impl::normalize(std::string_view s) const {
  std::string out(s);
  for (const auto& n : normalizers) {
    switch (n.kind) {
      case NormStep::Kind::kNfc:
        out = tok::nfc(out);
        break;
      case NormStep::Kind::kPrepend:
        if (!out.empty()) out.insert(0, n.a);
        break;
      case NormStep::Kind::kReplace:
        out = replace_all(out, n.a, n.b);
        break;
    }
  }
  return out;
}

void Tokenizer::Impl::pre_tokenize_and_bpe(std::string_view s, bool at_start,
                                           std::vector<int32_t>& out) const {
  if (metaspace) {
    // The reference's Metaspace: spaces become the replacement, one is prepended (always, or to
    // the text's first piece) unless the piece starts with one, and with split each replacement
    // starts a word.
    const Metaspace& m = *metaspace;
    std::string w = replace_all(s, " ", m.replacement);
    const bool prepend = m.scheme == Metaspace::Scheme::kAlways ||
                         (m.scheme == Metaspace::Scheme::kFirst && at_start);
    if (prepend && !w.starts_with(m.replacement)) w.insert(0, m.replacement);
    if (!m.split) {
      bpe.encode_word(w, out);
      return;
    }
    size_t begin = 0;
    for (size_t at = w.find(m.replacement, 1); at != std::string::npos;
         at = w.find(m.replacement, at + 1)) {
      bpe.encode_word(std::string_view(w).substr(begin, at - begin), out);
      begin = at;
    }
    bpe.encode_word(std::string_view(w).substr(begin), out);
    return;
  }
  if (bpe.byte_fallback) {  // no pre-tokenizer: the piece is one word
    bpe.encode_word(s, out);
    return;
  }
  std::vector<std::pair<size_t, size_t>> pieces{{0, s.size()}}, next, matches;
  auto apply = [&](const tok::Regex& re) {
    next.clear();
    for (const auto& [b, e] : pieces) {
      const std::string_view piece = s.substr(b, e - b);
      matches.clear();
      re.find_all(piece, matches);
      size_t prev = 0;
      for (const auto& [mb, me] : matches) {
        if (prev < mb) next.emplace_back(b + prev, b + mb);
        if (mb < me) next.emplace_back(b + mb, b + me);
        prev = me;
      }
      if (prev < piece.size()) next.emplace_back(b + prev, e);
    }
    pieces.swap(next);
  };
  for (const auto& re : splits) apply(re);
  if (byte_level_regex) apply(*byte_level_regex);
  for (const auto& [b, e] : pieces) bpe.encode_word(s.substr(b, e - b), out);
}

void Tokenizer::Impl::encode_normalized(std::string_view s, bool at_start,
                                        std::vector<int32_t>& out) const {
  std::vector<tok::TokenMatcher::Match> parts;
  split_added(s, norm_matcher, parts);
  for (const auto& p : parts) {
    if (p.value >= 0) {
      out.push_back(added[static_cast<size_t>(p.value)].id);
    } else {
      pre_tokenize_and_bpe(s.substr(p.begin, p.end - p.begin), at_start && p.begin == 0, out);
    }
  }
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<tok::TokenMatcher::Match> parts;
  split_added(text, raw_matcher, parts);
  for (const auto& p : parts) {
    if (p.value >= 0) {
      out.push_back(added[static_cast<size_t>(p.value)].id);
      continue;
    }
    const std::string_view piece = text.substr(p.begin, p.end - p.begin);
    if (normalizers.empty()) {
      encode_normalized(piece, p.begin == 0, out);
    } else {
      encode_normalized(normalize(piece), p.begin == 0, out);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const auto bad = tok::utf8_invalid_offset(text)) {
    fail("{}: encode: the text is not valid UTF-8 (byte {} of {})", impl_->source, *bad,
         text.size());
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode_text(text, ids);
  if (add_special_tokens) {
    for (const auto& w : impl_->post) {
      if (w.before.empty() && w.after.empty()) continue;
      std::vector<int32_t> wrapped;
      wrapped.reserve(w.before.size() + ids.size() + w.after.size());
      wrapped.insert(wrapped.end(), w.before.begin(), w.before.end());
      wrapped.insert(wrapped.end(), ids.begin(), ids.end());
      wrapped.insert(wrapped.end(), w.after.begin(), w.after.end());
      ids.swap(wrapped);
    }
  }
  return ids;
}

// ---- decode and lookups
// ---------------------------------------------------------------------------

std::string Tokenizer::Impl::decode_pieces(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (const int32_t id : ids) {
    const auto it = by_id.find(id);
    if (it == by_id.end() || (skip_special && it->second.special)) continue;
    toks.push_back(it->second.token);
  }
  for (const auto& d : decoders) {
    switch (d.kind) {
      case DecodeStep::Kind::kReplace:
        for (auto& t : toks) t = replace_all(t, d.a, d.b);
        break;
      case DecodeStep::Kind::kByteFallback: {
        // Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one U+FFFD
        // per byte token.
        std::vector<std::string> next;
        std::string run;
        size_t run_tokens = 0;
        const auto flush = [&] {
          if (run_tokens == 0) return;
          if (tok::utf8_invalid_offset(run)) {
            for (size_t i = 0; i < run_tokens; ++i) next.emplace_back("\xEF\xBF\xBD");
          } else {
            next.push_back(run);
          }
          run.clear();
          run_tokens = 0;
        };
        for (auto& t : toks) {
          if (const auto b = fallback_byte(t)) {
            run.push_back(*b);
            ++run_tokens;
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        toks.swap(next);
        break;
      }
      case DecodeStep::Kind::kFuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
      case DecodeStep::Kind::kStrip:
        for (auto& t : toks) {
          size_t b = 0, e = t.size();
          for (int i = 0; i < d.start && b < e && t[b] == d.a[0]; ++i) ++b;
          for (int i = 0; i < d.stop && e > b && t[e - 1] == d.a[0]; ++i) --e;
          t = t.substr(b, e - b);
        }
        break;
      case DecodeStep::Kind::kMetaspace:
        // The replacement becomes a space, and in the first token (unless prepend_scheme is
        // never) it is dropped, as the reference does.
        for (size_t i = 0; i < toks.size(); ++i) {
          const bool drop = i == 0 && d.metaspace.scheme != Metaspace::Scheme::kNever;
          toks[i] = replace_all(toks[i], d.metaspace.replacement, drop ? "" : " ");
        }
        break;
    }
  }
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  if (!impl_->decoders.empty() || impl_->bpe.byte_fallback) {
    return impl_->decode_pieces(ids, skip_special);
  }
  std::string bytes;
  for (const int32_t id : ids) {
    const auto it = impl_->by_id.find(id);
    if (it == impl_->by_id.end() || (skip_special && it->second.special)) continue;
    bytes += it->second.bytes;
  }
  std::string out;
  out.reserve(bytes.size());
  tok::utf8_append_lossy(bytes, out, true);
  return out;
}

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  const auto it = impl_->by_id.find(id);
  if (it == impl_->by_id.end()) return std::nullopt;
  return it->second.bytes;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->token_ids.find(token);
  if (it == impl_->token_ids.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const auto it = impl_->by_id.find(id);
  if (it == impl_->by_id.end()) return std::nullopt;
  return it->second.token;
}

bool Tokenizer::byte_level() const {
  return !impl_->bpe.byte_fallback;
}

bool Tokenizer::is_special(int32_t id) const {
  const auto it = impl_->by_id.find(id);
  return it != impl_->by_id.end() && it->second.special;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos_id;
}
std::optional<std::string> Tokenizer::bos_token() const {
  return impl_->bos_token;
}
std::optional<std::string> Tokenizer::eos_token() const {
  return impl_->eos_token;
}
const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}
const std::string& Tokenizer::chat_template_source() const {
  return impl_->chat_template_file;
}
int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}
size_t Tokenizer::num_tokens() const {
  return impl_->by_id.size();
}
const std::string& Tokenizer::source() const {
  return impl_->source;
}

// ---- streaming decode
// -----------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tok_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  if (!tok_.byte_level()) {
    ids_.push_back(id);
    const std::span<const int32_t> all(ids_);
    const std::string before = tok_.decode(all.subspan(prefix_, read_ - prefix_));
    const std::string now = tok_.decode(all.subspan(prefix_));
    // Held while the text ends in U+FFFD: a character whose byte tokens are still coming.
    if (now.size() <= before.size() || now.ends_with("\xEF\xBF\xBD") || !now.starts_with(before)) {
      return {};
    }
    prefix_ = read_;
    read_ = ids_.size();
    return now.substr(before.size());
  }
  const auto bytes = tok_.token_bytes(id);
  if (!bytes) return {};
  pending_ += *bytes;
  std::string out;
  const size_t used = tok::utf8_append_lossy(pending_, out, false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::finish() {
  if (!tok_.byte_level()) {
    const std::span<const int32_t> all(ids_);
    const std::string before = tok_.decode(all.subspan(prefix_, read_ - prefix_));
    const std::string now = tok_.decode(all.subspan(prefix_));
    ids_.clear();
    prefix_ = read_ = 0;
    return now.size() > before.size() && now.starts_with(before) ? now.substr(before.size()) : "";
  }
  std::string out;
  tok::utf8_append_lossy(pending_, out, true);
  pending_.clear();
  return out;
}

}  // namespace exl3
