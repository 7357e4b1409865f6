// Jinja2's lexer for the chat-template settings (see lexer.hpp).
#include "lexer.hpp"

#include <cctype>

#include "exl3/error.hpp"
#include "unicode.hpp"

namespace exl3::jinja {

std::string normalize_source(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  // keep_trailing_newline is off in Jinja's default environment.
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

std::string where(const std::string& source, const std::string& name, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return name + ":" + std::to_string(line) + ":" + std::to_string(col);
}

namespace {

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : s_(src), name_(name) {}

  std::vector<Token> run() {
    size_t i = 0;
    bool line_starting = true;
    while (i < s_.size()) {
      const size_t j = next_opener(i);
      std::string text = s_.substr(i, j - i);
      if (j == s_.size()) {
        emit_text(std::move(text), i);
        break;
      }
      const char kind = s_[j + 1];  // '{', '%' or '#'
      const char sign = j + 2 < s_.size() && (s_[j + 2] == '-' || s_[j + 2] == '+') ? s_[j + 2] : 0;
      if (sign == '-') {
        text = uni::strip(text, std::nullopt, false, true);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only white space between the line start and the tag.
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_space(text.substr(l_pos))) {
          text.resize(l_pos);
        }
      }
      emit_text(std::move(text), i);
      size_t p = j + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        p = close_comment(j, p);
      } else if (kind == '%' && is_raw(p)) {
        fail("{}: raw blocks are not supported", where(s_, name_, j));
      } else {
        out_.push_back({kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, "", j});
        p = tag_body(p, kind == '%');
      }
      line_starting = p > 0 && s_[p - 1] == '\n';
      i = p;
    }
    out_.push_back({Tok::kEof, "", s_.size()});
    return std::move(out_);
  }

 private:
  const std::string& s_;
  const std::string& name_;
  std::vector<Token> out_;

  [[noreturn]] void error(size_t at, std::string_view msg) const {
    fail("{}: {}", where(s_, name_, at), msg);
  }

  static bool all_space(std::string_view t) {
    return uni::strip(t, std::nullopt, true, false).empty();
  }

  void emit_text(std::string text, size_t at) {
    if (!text.empty()) out_.push_back({Tok::kText, std::move(text), at});
  }

  size_t next_opener(size_t i) const {
    for (size_t k = s_.find('{', i); k != std::string::npos; k = s_.find('{', k + 1)) {
      if (k + 1 < s_.size() && (s_[k + 1] == '{' || s_[k + 1] == '%' || s_[k + 1] == '#')) {
        return k;
      }
    }
    return s_.size();
  }

  // After a closing delimiter: `-` eats all following white space, trim_blocks one newline
  // (block and comment tags only), `+` nothing.
  size_t after_close(size_t p, char sign, bool trim) const {
    if (sign == '-') {
      const std::string rest =
          uni::strip(std::string_view(s_).substr(p), std::nullopt, true, false);
      return s_.size() - rest.size();
    }
    if (sign == 0 && trim && p < s_.size() && s_[p] == '\n') return p + 1;
    return p;
  }

  size_t close_comment(size_t open, size_t p) const {
    const size_t k = s_.find("#}", p);
    if (k == std::string::npos) error(open, "missing end of comment tag");
    const char sign = k > p && (s_[k - 1] == '-' || s_[k - 1] == '+') ? s_[k - 1] : 0;
    return after_close(k + 2, sign, true);
  }

  bool is_raw(size_t p) const {
    while (p < s_.size() && std::isspace(static_cast<unsigned char>(s_[p]))) ++p;
    return s_.compare(p, 3, "raw") == 0 &&
           (p + 3 >= s_.size() || !std::isalnum(static_cast<unsigned char>(s_[p + 3])));
  }

  // Expression tokens up to the closing delimiter; brackets must balance before it counts.
  size_t tag_body(size_t p, bool block) {
    const char* close = block ? "%}" : "}}";
    int depth = 0;
    const size_t open = p;
    while (true) {
      while (p < s_.size() && std::isspace(static_cast<unsigned char>(s_[p]))) ++p;
      if (p >= s_.size()) error(open, block ? "missing end of block tag '%}'" : "missing '}}'");
      if (depth == 0) {
        for (const char sign : {'-', '+', '\0'}) {
          const size_t at = sign ? p + 1 : p;
          if ((!sign || s_[p] == sign) && s_.compare(at, 2, close) == 0) {
            if (sign == '+' && !block) break;  // only blocks take `+`
            out_.push_back({block ? Tok::kBlockEnd : Tok::kVarEnd, "", p});
            return after_close(at + 2, sign, block);
          }
        }
      }
      p = token(p, depth);
    }
  }

  size_t token(size_t p, int& depth) {
    const char c = s_[p];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = p;
      while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
        ++e;
      out_.push_back({Tok::kName, s_.substr(p, e - p), p});
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number(p);
    if (c == '\'' || c == '"') return string(p);
    static constexpr std::string_view kTwo[] = {"**", "//", "==", "!=", "<=", ">="};
    for (const auto op : kTwo) {
      if (s_.compare(p, 2, op) == 0) {
        out_.push_back({Tok::kOp, std::string(op), p});
        return p + 2;
      }
    }
    if (std::string_view("+-*/%~<>=()[]{},.:|;").find(c) == std::string_view::npos) {
      error(p, std::string("unexpected character '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') {
      if (depth == 0) error(p, std::string("unexpected '") + c + "'");
      --depth;
    }
    out_.push_back({Tok::kOp, std::string(1, c), p});
    return p + 1;
  }

  size_t digits(size_t p) const {
    while (p < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[p])) ||
                             (s_[p] == '_' && p + 1 < s_.size() &&
                              std::isdigit(static_cast<unsigned char>(s_[p + 1]))))) {
      ++p;
    }
    return p;
  }

  size_t number(size_t p) {
    size_t e = digits(p);
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t k = e + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      if (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
        e = digits(k);
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = p; k < e; ++k) {
      if (s_[k] != '_') text += s_[k];
    }
    out_.push_back({is_float ? Tok::kFloat : Tok::kInt, std::move(text), p});
    return e;
  }

  // A Python string literal: backslash escapes as Python reads them; unknown ones stay verbatim.
  size_t string(size_t p) {
    const char q = s_[p];
    std::string v;
    size_t k = p + 1;
    while (true) {
      if (k >= s_.size()) error(p, "unterminated string literal");
      const char c = s_[k];
      if (c == q) break;
      if (c != '\\') {
        v += c;
        ++k;
        continue;
      }
      if (k + 1 >= s_.size()) error(p, "unterminated string literal");
      const char e = s_[k + 1];
      k += 2;
      switch (e) {
        case 'n':
          v += '\n';
          break;
        case 't':
          v += '\t';
          break;
        case 'r':
          v += '\r';
          break;
        case '\\':
          v += '\\';
          break;
        case '\'':
          v += '\'';
          break;
        case '"':
          v += '"';
          break;
        case 'a':
          v += '\a';
          break;
        case 'b':
          v += '\b';
          break;
        case 'f':
          v += '\f';
          break;
        case 'v':
          v += '\v';
          break;
        case '0':
          v += '\0';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (k + n > s_.size()) error(k - 2, "truncated \\x/\\u escape");
          uint32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            const char h = s_[k + i];
            if (!std::isxdigit(static_cast<unsigned char>(h))) error(k - 2, "bad \\x/\\u escape");
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                     ? h - '0'
                                                     : std::tolower(h) - 'a' + 10);
          }
          uni::append_utf8(cp, v);
          k += n;
          break;
        }
        default:
          v += '\\';
          v += e;
      }
    }
    out_.push_back({Tok::kString, std::move(v), p});
    return k + 1;
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name) {
  return Lexer(source, name).run();
}

}  // namespace exl3::jinja
