// Building blocks of the tokenizer (not installed): UTF-8 scanning, PCRE2 regexes, NFC through
// utf8proc, GPT-2's byte<->unicode alphabet, the added-token matcher and the BPE model.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace exl3::tok {

// ---- UTF-8 -------------------------------------------------------------------------------------

enum class Utf8Kind { kValid, kInvalid, kTruncated };
struct Utf8Step {
  Utf8Kind kind;
  size_t len;  // kValid: the character's length; kInvalid: the maximal invalid subpart (>= 1);
               // kTruncated: the bytes present (a valid prefix cut by the end of the input)
};
// Classifies the sequence starting at s[i] (i < s.size()) per Unicode Table 3-7.
Utf8Step utf8_step(std::string_view s, size_t i);

// Offset of the first byte that is not part of valid UTF-8, or nullopt if `s` is valid.
std::optional<size_t> utf8_invalid_offset(std::string_view s);

// Appends `s` to `out` with each maximal invalid subpart replaced by U+FFFD (Rust's
// String::from_utf8_lossy). With final = false a trailing incomplete character is left
// unconsumed. Returns the number of bytes consumed.
size_t utf8_append_lossy(std::string_view s, std::string& out, bool final);

// Start of the last character of valid UTF-8 `s` (s non-empty).
size_t utf8_last_char_start(std::string_view s);

// ---- PCRE2 -------------------------------------------------------------------------------------

// A compiled PCRE2 pattern (UTF + UCP; JIT-compiled when the platform allows it).
//
// tokenizer.json regexes are Oniguruma patterns (Ruby syntax), which the reference compiles with
// onig. kOniguruma translates the constructs whose meaning differs in PCRE2, as measured against
// the reference: \s \S (White_Space; PCRE2 adds U+180E), \w \W \b \B (letters, marks, numbers and
// connector punctuation; PCRE2 leaves out marks), \h \H (hex digits in Oniguruma), \v (VT only),
// \uHHHH, POSIX brackets ([:alpha:] is Alphabetic), ^ and $ (line anchors), and the inline option m
// (dot-all in Ruby). Constructs without an equivalent (class intersection &&, nested classes,
// \W \H \B inside a class, other POSIX brackets and inline options) fail with an exl3::Error
// instead of matching differently.
class Regex {
 public:
  enum class Syntax { kOniguruma, kLiteral, kPcre2 };
  // Throws exl3::Error("<what>: ...") on a bad or untranslatable pattern.
  Regex(std::string_view pattern, Syntax syntax, const std::string& what);

  // Match offsets [begin, end) of every non-overlapping match in `s` (valid UTF-8), left to right,
  // appended to `out`. An empty match directly after the previous match is skipped and the search
  // then moves on one character (Oniguruma's find_iter).
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  // Whether the pattern matches at exactly `offset` (anchored there).
  bool matches_at(std::string_view s, size_t offset) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8*
  std::string what_;
};

// The PCRE2 form of an Oniguruma (Ruby syntax) pattern; see Regex. Throws exl3::Error naming
// `what` for constructs it cannot translate.
std::string onig_to_pcre2(std::string_view pattern, const std::string& what);

// ---- normalization -----------------------------------------------------------------------------

// Unicode NFC of valid UTF-8 (utf8proc).
std::string nfc(std::string_view s);

// ---- Unicode predicates used by added-token matching (Rust regex \w and \s semantics)
// ------------

bool starts_with_word_char(std::string_view s);  // first character matches \w
bool ends_with_word_char(std::string_view s);    // last character matches \w
size_t leading_space_len(std::string_view s);    // bytes of the leading White_Space run
size_t trailing_space_start(
    std::string_view s);  // offset where the trailing White_Space run starts

// ---- byte-level alphabet ------------------------------------------------------------------------

// GPT-2's reversible byte <-> unicode map: printable Latin-1 bytes map to themselves, the other
// 68 bytes to U+0100.. in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> utf8;  // byte -> its character, UTF-8 encoded
  std::array<int16_t, 324> byte_of;   // code point -> byte, -1 if not in the alphabet
  static const ByteAlphabet& get();
};
// The raw bytes a byte-level token string stands for; nullopt if a character is outside the
// alphabet (the reference decoder then uses the token's own UTF-8 bytes).
std::optional<std::string> byte_level_decode(std::string_view token);

// ---- added-token matching
// ------------------------------------------------------------------------

// Leftmost-longest multi-pattern matcher (the reference uses Aho-Corasick with that match kind):
// a byte trie walked from each position whose first byte starts some pattern.
class TokenMatcher {
 public:
  void add(std::string_view pattern, int32_t value);  // the first value added for a pattern wins
  bool empty() const { return nodes_.size() == 1; }
  struct Match {
    size_t begin, end;
    int32_t value;
  };
  std::optional<Match> find(std::string_view s, size_t from) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
    int32_t value = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

// ---- BPE ----------------------------------------------------------------------------------------

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  Vocab vocab;
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id)
  std::array<int32_t, 256> byte_id{};          // id of each byte's one-character token, -1 if none
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;
  // SentencePiece-style BPE (Llama-2, Mistral): words are UTF-8 text, not byte-level strings;
  // the initial symbols are characters, and a character outside the vocabulary becomes the
  // <0xXX> tokens of its bytes (fallback_id) when they all exist, else unk.
  bool byte_fallback = false;
  std::array<int32_t, 256> fallback_id{};  // id of `<0xXX>`, -1 if none

  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Appends the ids of one pre-tokenized word, given as raw bytes (the byte-level mapping is
  // implied; with byte_fallback, as text). Words up to kMaxCachedWord bytes are cached.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  static constexpr size_t kMaxCachedWord = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 16;

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace exl3::tok
