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

bool cased(uint32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

// Unicode's Case_Ignorable: marks, format characters, modifiers, and the apostrophes and
// middle dots that may sit inside a word.
bool case_ignorable(uint32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  if (c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
      c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK) {
    return true;
  }
  for (const uint32_t x : {0x27u, 0x2Eu, 0x3Au, 0xB7u, 0x387u, 0x5F4u, 0x2018u, 0x2019u, 0x2024u,
                           0x2027u, 0xFE13u, 0xFE52u, 0xFE55u, 0xFF07u, 0xFF0Eu, 0xFF1Au}) {
    if (cp == x) return true;
  }
  return false;
}

void append_upper(uint32_t cp, bool title, std::string& out) {
  if (const char* s = special_upper(cp, title)) {
    out += s;
    return;
  }
  const auto i = static_cast<utf8proc_int32_t>(cp);
  append_utf8(static_cast<uint32_t>(title ? utf8proc_totitle(i) : utf8proc_toupper(i)), out);
}

}  // namespace

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t len = 0;
  for (size_t i = 0; i < s.size(); i += len) append_upper(decode_at(s, i, &len), false, out);
  return out;
}

std::string title_char(std::string_view ch) {
  std::string out;
  size_t len = 0;
  for (size_t i = 0; i < ch.size(); i += len) append_upper(decode_at(ch, i, &len), true, out);
  return out;
}

namespace {

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> cps;
  size_t len = 0;
  for (size_t i = 0; i < s.size(); i += len) cps.push_back(decode_at(s, i, &len));
  return cps;
}

// Python's lower-case mapping of cps[i] in its context.
void append_lower(const std::vector<uint32_t>& cps, size_t i, std::string& out) {
  const uint32_t cp = cps[i];
  if (cp == 0x130) {  // İ: i followed by a combining dot above
    out += "i\xcc\x87";
  } else if (cp == 0x3A3) {
    // Final sigma: after a cased letter (case-ignorables between) and not before one.
    size_t j = i;
    while (j > 0 && case_ignorable(cps[j - 1])) --j;
    bool final = j > 0 && cased(cps[j - 1]);
    size_t k = i + 1;
    while (k < cps.size() && case_ignorable(cps[k])) ++k;
    if (k < cps.size() && cased(cps[k])) final = false;
    append_utf8(final ? 0x3C2 : 0x3C3, out);
  } else {
    append_utf8(static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), out);
  }
}

}  // namespace

std::string lower(std::string_view s) {
  const auto cps = code_points(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size(); ++i) append_lower(cps, i, out);
  return out;
}

std::string title(std::string_view s) {
  const auto cps = code_points(s);
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (previous_cased) {
      append_lower(cps, i, out);
    } else {
      append_upper(cps[i], true, out);
    }
    previous_cased = cased(cps[i]);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  if (s.empty()) return {};
  size_t len = 0;
  decode_at(s, 0, &len);
  return title_char(s.substr(0, len)) + lower(s.substr(len));
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
