// The parts of Python's str semantics templates reach: code-point indexing, str.isspace,
// strip, and case mapping as Python does it (utf8proc's one-to-one mappings, Python's
// multi-character ones such as ß -> SS, and the final-sigma rule of lower()). Input is UTF-8;
// malformed bytes count as one character each (they do not occur in JSON-decoded content).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace exl3::jinja::uni {

// Byte offset of every character start, plus s.size() at the end.
std::vector<size_t> char_starts(std::string_view s);
size_t char_count(std::string_view s);
uint32_t decode_at(std::string_view s, size_t i, size_t* len);
void append_utf8(uint32_t cp, std::string& out);

bool is_space(uint32_t cp);  // Python's str.isspace
// str.strip / lstrip / rstrip: `chars` unset strips white space, else any of its characters.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title_char(std::string_view ch);  // one character's title case
std::string title(std::string_view s);        // str.title: title case after uncased characters
std::string capitalize(std::string_view s);   // str.capitalize: first title case, rest lower
// Python's multi-character upper / title case of `cp`, UTF-8; nullptr when it maps one to one.
const char* special_upper(uint32_t cp, bool title);
bool is_alpha(uint32_t cp);
bool is_upper(uint32_t cp);
bool is_lower(uint32_t cp);

}  // namespace exl3::jinja::uni
