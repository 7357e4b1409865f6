// Python str semantics over UTF-8 (see unicode.hpp).
#include "unicode.hpp"

#include <utf8proc.h>

namespace exl3::jinja::uni {

uint32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = 1;
  uint32_t cp = b;
  if (b >= 0xF0 && b < 0xF8) {
    n = 4;
    cp = b & 0x07u;
  } else if (b >= 0xE0) {
    n = 3;
    cp = b & 0x0Fu;
  } else if (b >= 0xC0) {
    n = 2;
    cp = b & 0x1Fu;
  }
  if (n > 1 && i + n > s.size()) n = 1;  // truncated: one byte, one character
  if (n > 1) {
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
  } else {
    cp = b;
  }
  *len = n;
  return cp;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<size_t> char_starts(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  size_t len = 0;
  for (size_t i = 0; i < s.size(); i += len) {
    out.push_back(i);
    decode_at(s, i, &len);
  }
  out.push_back(s.size());
  return out;
}

size_t char_count(std::string_view s) {
  return char_starts(s).size() - 1;
}

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  std::vector<uint32_t> set;
  if (chars) {
    size_t len = 0;
    for (size_t i = 0; i < chars->size(); i += len) set.push_back(decode_at(*chars, i, &len));
  }
  auto strippable = [&](uint32_t cp) {
    if (!chars) return is_space(cp);
    for (const auto c : set) {
      if (c == cp) return true;
    }
    return false;
  };
  const auto starts = char_starts(s);
  size_t a = 0, b = starts.size() - 1;  // character range [a, b)
  size_t len = 0;
  while (left && a < b && strippable(decode_at(s, starts[a], &len))) ++a;
  while (right && b > a && strippable(decode_at(s, starts[b - 1], &len))) --b;
  return std::string(s.substr(starts[a], starts[b] - starts[a]));
}

namespace {

template <typename F>
std::string map_chars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  size_t len = 0;
  for (size_t i = 0; i < s.size(); i += len) {
    const uint32_t cp = decode_at(s, i, &len);
    if (cp < 0x80) {
      out += static_cast<char>(f(static_cast<utf8proc_int32_t>(cp)));
    } else {
      append_utf8(static_cast<uint32_t>(f(static_cast<utf8proc_int32_t>(cp))), out);
    }
  }
  return out;
}

}  // namespace

std::string upper(std::string_view s) {
  return map_chars(s, utf8proc_toupper);
}
std::string lower(std::string_view s) {
  return map_chars(s, utf8proc_tolower);
}

std::string capitalize(std::string_view s) {
  if (s.empty()) return {};
  size_t len = 0;
  decode_at(s, 0, &len);
  return upper(s.substr(0, len)) + lower(s.substr(len));
}

bool is_alpha(uint32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}
bool is_upper(uint32_t cp) {
  return utf8proc_isupper(static_cast<utf8proc_int32_t>(cp));
}
bool is_lower(uint32_t cp) {
  return utf8proc_islower(static_cast<utf8proc_int32_t>(cp));
}

}  // namespace exl3::jinja::uni
