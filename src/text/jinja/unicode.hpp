// The parts of Python's str semantics templates reach: code-point indexing, str.isspace,
// strip, and case mapping (per code point, through utf8proc). Input is UTF-8; malformed bytes
// count as one character each (they do not occur in JSON-decoded content).
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
std::string capitalize(std::string_view s);  // first character upper, the rest lower
bool is_alpha(uint32_t cp);
bool is_upper(uint32_t cp);
bool is_lower(uint32_t cp);

}  // namespace exl3::jinja::uni
