// Text building blocks of the tokenizer: UTF-8 scanning, PCRE2 regexes, NFC (utf8proc), the
// Unicode predicates of added-token matching, GPT-2's byte alphabet and the added-token matcher.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <optional>

#include "exl3/error.hpp"
#include "exl3/format/byte_alphabet.hpp"
#include "tokenizer_internal.hpp"

namespace exl3::tok {

// ---- UTF-8 -------------------------------------------------------------------------------------

Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return {Utf8Kind::kValid, 1};
  int need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Table 3-7)
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return {Utf8Kind::kInvalid, 1};
  }
  size_t k = 1;
  for (int j = 0; j < need; ++j, ++k) {
    if (i + k >= s.size()) return {Utf8Kind::kTruncated, k};
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return {Utf8Kind::kInvalid, k};
    lo = 0x80, hi = 0xBF;
  }
  return {Utf8Kind::kValid, k};
}

std::optional<size_t> utf8_invalid_offset(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w = 0;
      for (int k = 0; k < 8; ++k)
        w |= static_cast<uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const auto st = utf8_step(s, i);
    if (st.kind != Utf8Kind::kValid) return i;
    i += st.len;
  }
  return std::nullopt;
}

size_t utf8_append_lossy(std::string_view s, std::string& out, bool final) {
  size_t i = 0;
  while (i < s.size()) {
    const auto st = utf8_step(s, i);
    if (st.kind == Utf8Kind::kValid) {
      out.append(s.substr(i, st.len));
    } else if (st.kind == Utf8Kind::kTruncated && !final) {
      return i;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
    }
    i += st.len;
  }
  return i;
}

size_t utf8_last_char_start(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

// ---- PCRE2 -------------------------------------------------------------------------------------

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? std::string("PCRE2 error ") + std::to_string(code)
               : std::string(reinterpret_cast<char*>(buf));
}

// One match-data block per thread: only the whole-match offsets are read.
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  if (h.md == nullptr) throw std::bad_alloc();
  return h.md;
}

}  // namespace

namespace {

// Oniguruma's Unicode \w, as measured against the reference: Alphabetic, marks, numbers and
// connector punctuation; inside a character class (and as [:word:]) it leaves out No (e.g. "²").
constexpr std::string_view kOnigWordItems = R"(\p{Alphabetic}\p{M}\p{N}\p{Pc})";
constexpr std::string_view kOnigClassWordItems = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})";

// POSIX brackets inside a class, Oniguruma's Unicode meaning (measured); others are refused.
std::optional<std::string_view> onig_posix(std::string_view name) {
  if (name == "alpha") return R"(\p{Alphabetic})";
  if (name == "alnum") return R"(\p{Alphabetic}\p{Nd})";
  if (name == "word") return kOnigClassWordItems;
  if (name == "space") return R"(\p{White_Space})";
  if (name == "digit") return R"(\p{Nd})";
  if (name == "xdigit") return "0-9A-Fa-f";
  return std::nullopt;
}

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

std::string onig_to_pcre2(std::string_view p, const std::string& what) {
  const std::string word = "[" + std::string(kOnigWordItems) + "]";
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t class_start = 0;  // offset in `out` of the current class's '['
  auto unsupported = [&](std::string_view construct) {
    fail(
        "{}: the Oniguruma construct {} has no PCRE2 translation here (exl3 would match "
        "differently)",
        what, construct);
  };
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      i += 2;
      switch (d) {
        case 's':
          out += R"(\p{White_Space})";
          break;
        case 'S':
          out += R"(\P{White_Space})";
          break;
        case 'w':
          out += in_class ? std::string(kOnigClassWordItems) : word;
          break;
        case 'W':
          if (in_class) unsupported("\\W inside a character class");
          out += "[^" + std::string(kOnigWordItems) + "]";
          break;
        case 'h':
          out += in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]";
          break;
        case 'H':
          if (in_class) unsupported("\\H inside a character class");
          out += "[^0-9A-Fa-f]";
          break;
        case 'b':
          out += in_class
                     ? R"(\x08)"
                     : "(?:(?<=" + word + ")(?!" + word + ")|(?<!" + word + ")(?=" + word + "))";
          break;
        case 'B':
          if (in_class) unsupported("\\B inside a character class");
          out += "(?:(?<=" + word + ")(?=" + word + ")|(?<!" + word + ")(?!" + word + "))";
          break;
        case 'v':
          out += R"(\x0B)";
          break;
        case 'u':
          if (i + 4 <= p.size() && is_hex(p[i]) && is_hex(p[i + 1]) && is_hex(p[i + 2]) &&
              is_hex(p[i + 3])) {
            out += "\\x{" + std::string(p.substr(i, 4)) + "}";
            i += 4;
          } else {
            unsupported("\\u without four hex digits");
          }
          break;
        default:
          out += c;
          out += d;
      }
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX bracket [:alpha:]
        const size_t end = p.find(":]", i + 2);
        if (end == std::string_view::npos) unsupported("an unterminated POSIX bracket");
        const auto items = onig_posix(p.substr(i + 2, end - i - 2));
        if (!items) unsupported("the POSIX bracket " + std::string(p.substr(i, end + 2 - i)));
        out += *items;
        i = end + 2;
        continue;
      }
      if (c == '[') unsupported("a nested character class");
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') unsupported("class intersection &&");
      // A ']' right after '[' or '[^' is a literal in both dialects.
      const bool first =
          out.size() == class_start + 1 || (out.size() == class_start + 2 && out.back() == '^');
      if (c == ']' && !first) in_class = false;
      out += c;
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      class_start = out.size();
      out += c;
      ++i;
      continue;
    }
    if (c == '(' && i + 2 < p.size() && p[i + 1] == '?') {
      // Inline options (?flags) / (?flags:...): Ruby's m is dot-all (PCRE2's s).
      size_t j = i + 2;
      std::string flags;
      while (j < p.size() && (std::isalpha(static_cast<unsigned char>(p[j])) || p[j] == '-'))
        flags += p[j++];
      if (!flags.empty() && j < p.size() && (p[j] == ':' || p[j] == ')')) {
        for (char& f : flags) {
          if (f == 'm') {
            f = 's';
          } else if (f != 'i' && f != 'x' && f != '-') {
            unsupported(std::string("the inline option (?") + flags + ")");
          }
        }
        out += "(?" + flags + p[j];
        i = j + 1;
        continue;
      }
    }
    out += c;
    ++i;
  }
  return out;
}

Regex::Regex(std::string_view pattern, Syntax syntax, const std::string& what) : what_(what) {
  std::string translated;
  uint32_t opts = PCRE2_UTF;
  if (syntax == Syntax::kLiteral) {
    opts |= PCRE2_LITERAL;  // admits no UCP (nothing to classify in a literal)
  } else {
    opts |= PCRE2_UCP;
  }
  if (syntax == Syntax::kOniguruma) {
    translated = onig_to_pcre2(pattern, what);
    pattern = translated;
    opts |= PCRE2_MULTILINE;  // Ruby's ^ and $ are line anchors
  }
  // Newline is LF, as in Oniguruma (`.` matches \r; $ matches before \n only).
  std::unique_ptr<pcre2_compile_context, void (*)(pcre2_compile_context*)> ctx(
      pcre2_compile_context_create(nullptr), pcre2_compile_context_free);
  if (!ctx) throw std::bad_alloc();
  pcre2_set_newline(ctx.get(), PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   opts, &err, &err_off, ctx.get());
  if (code == nullptr) {
    fail("{}: cannot compile regex{} at offset {}: {}", what,
         translated.empty() ? "" : " (translated to PCRE2)", static_cast<size_t>(err_off),
         pcre2_message(err));
  }
  code_ =
      std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
  // JIT is an optimisation only: without it (unsupported platform) pcre2_match interprets.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
}

namespace {

int run_match(const pcre2_code* code, std::string_view s, size_t start, pcre2_match_data* md) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  int rc = pcre2_match(code, subject, s.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
  // The JIT's default 32 KiB stack can run out on pathological inputs; the interpreter keeps its
  // frames on the heap.
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc =
        pcre2_match(code, subject, s.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
  }
  return rc;
}

}  // namespace

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  const auto* code = static_cast<const pcre2_code*>(code_.get());
  pcre2_match_data* md = thread_match_data();
  size_t last_end = 0;
  std::optional<size_t> last_match_end;
  while (last_end <= s.size()) {
    const int rc = run_match(code, s, last_end, md);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("{}: regex match failed: {}", what_, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (b == e && last_match_end == e) {
      if (last_end >= s.size()) break;
      last_end += utf8_step(s, last_end).len;
      continue;
    }
    out.emplace_back(b, e);
    last_end = e;
    last_match_end = e;
  }
}

bool Regex::matches_at(std::string_view s, size_t offset) const {
  const auto* code = static_cast<const pcre2_code*>(code_.get());
  const int rc = run_match(code, s, offset, thread_match_data());
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("{}: regex match failed: {}", what_, pcre2_message(rc));
  return pcre2_get_ovector_pointer(thread_match_data())[0] == offset;
}

// ---- normalization -----------------------------------------------------------------------------

std::string nfc(std::string_view s) {
  if (std::all_of(s.begin(), s.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(s);  // ASCII is its own NFC
  }
  utf8proc_uint8_t* dst = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &dst,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) fail("NFC normalization failed: {}", utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

// ---- Unicode predicates ------------------------------------------------------------------------

namespace {

// The reference matches added-token boundaries with Rust's regex crate: \w is
// [\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}] and \s is \p{White_Space}. \G anchors at the
// start offset.
const Regex& word_char() {
  static const Regex r(R"(\G[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])",
                       Regex::Syntax::kPcre2, "word-character class");
  return r;
}
const Regex& space_char() {
  static const Regex r(R"(\G\p{White_Space})", Regex::Syntax::kPcre2, "white-space class");
  return r;
}

}  // namespace

bool starts_with_word_char(std::string_view s) {
  return !s.empty() && word_char().matches_at(s, 0);
}

bool ends_with_word_char(std::string_view s) {
  return !s.empty() && word_char().matches_at(s, utf8_last_char_start(s));
}

size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && space_char().matches_at(s, i)) i += utf8_step(s, i).len;
  return i;
}

size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    const size_t c = utf8_last_char_start(s.substr(0, end));
    if (!space_char().matches_at(s, c)) break;
    end = c;
  }
  return end;
}

// ---- byte-level alphabet ------------------------------------------------------------------------

const ByteAlphabet& ByteAlphabet::get() {
  static const ByteAlphabet a = [] {
    ByteAlphabet t;
    t.byte_of.fill(-1);
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t cp = byte_level_codepoint(static_cast<uint8_t>(b));
      t.utf8[b] = utf8_of_codepoint(cp);
      t.byte_of[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return a;
}

std::optional<std::string> byte_level_decode(std::string_view token) {
  const auto& a = ByteAlphabet::get();
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const auto st = utf8_step(token, i);
    if (st.kind != Utf8Kind::kValid) return std::nullopt;
    uint32_t cp = 0;
    const auto c0 = static_cast<unsigned char>(token[i]);
    if (st.len == 1) {
      cp = c0;
    } else if (st.len == 2) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
    } else {
      return std::nullopt;  // the alphabet ends at U+0143
    }
    if (cp >= a.byte_of.size() || a.byte_of[cp] < 0) return std::nullopt;
    out += static_cast<char>(a.byte_of[cp]);
    i += st.len;
  }
  return out;
}

// ---- added-token matching
// ------------------------------------------------------------------------

void TokenMatcher::add(std::string_view pattern, int32_t value) {
  if (pattern.empty()) return;
  int32_t n = 0;
  for (const char ch : pattern) {
    const auto c = static_cast<unsigned char>(ch);
    auto& next = nodes_[static_cast<size_t>(n)].next;
    auto it = std::lower_bound(next.begin(), next.end(), c,
                               [](const auto& e, unsigned char x) { return e.first < x; });
    if (it != next.end() && it->first == c) {
      n = it->second;
    } else {
      const auto child = static_cast<int32_t>(nodes_.size());
      next.insert(it, {c, child});
      nodes_.emplace_back();  // invalidates `next`; not used after this
      n = child;
    }
  }
  if (nodes_[static_cast<size_t>(n)].value < 0) nodes_[static_cast<size_t>(n)].value = value;
  first_[static_cast<unsigned char>(pattern[0])] = true;
}

std::optional<TokenMatcher::Match> TokenMatcher::find(std::string_view s, size_t from) const {
  for (size_t i = from; i < s.size(); ++i) {
    if (!first_[static_cast<unsigned char>(s[i])]) continue;
    int32_t n = 0;
    std::optional<Match> best;
    for (size_t j = i; j < s.size(); ++j) {
      const auto c = static_cast<unsigned char>(s[j]);
      const auto& next = nodes_[static_cast<size_t>(n)].next;
      auto it = std::lower_bound(next.begin(), next.end(), c,
                                 [](const auto& e, unsigned char x) { return e.first < x; });
      if (it == next.end() || it->first != c) break;
      n = it->second;
      if (nodes_[static_cast<size_t>(n)].value >= 0)
        best = Match{i, j + 1, nodes_[static_cast<size_t>(n)].value};
    }
    if (best) return best;
  }
  return std::nullopt;
}

}  // namespace exl3::tok
