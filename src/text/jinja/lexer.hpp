// Splits template source into text and tag tokens, applying Jinja2's whitespace rules as
// transformers configures them: trim_blocks (a block or comment tag eats the one newline after
// it), lstrip_blocks (spaces and tabs before a block or comment tag on its own line go), `-`
// inside a delimiter strips all white space on that side, `+` turns lstrip / trim off.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace exl3::jinja {

enum class Tok {
  kText,        // literal output
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // text holds the unescaped value
  kInt,
  kFloat,
  kOp,  // text holds the operator
  kEof,
};

struct Token {
  Tok kind;
  std::string text;
  size_t offset;  // into the normalized source, for line:column
};

// Source as Jinja reads it: newlines normalized to \n, one trailing newline dropped.
std::string normalize_source(std::string_view source);

// Tokens of normalized source; throws exl3::Error "name:line:col: ..." on a lexical error.
std::vector<Token> lex(const std::string& source, const std::string& name);

// "name:line:col" of a byte offset.
std::string where(const std::string& source, const std::string& name, size_t offset);

}  // namespace exl3::jinja
