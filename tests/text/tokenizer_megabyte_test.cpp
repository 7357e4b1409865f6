// A megabyte of mixed text per tokenizer family against the reference `tokenizers` library: the
// text is generated here exactly as data/make_megabyte_golden.py generates it (a splitmix64
// stream of words, numbers, whitespace, punctuation, non-Latin characters, emoji and code), and
// the ids' SHA-256 (and that of every 16384-id prefix, to locate a mismatch) must equal the
// golden's. Byte-level BPE (GPT-2, Qwen2, Llama-3, o200k, Digits splits) and SentencePiece-style
// BPE with byte fallback are covered.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <nlohmann/json.hpp>

#include "exl3/format/byte_alphabet.hpp"
#include "exl3/text/tokenizer.hpp"
#include "test_support.hpp"
#include "tokenizer_test_util.hpp"

namespace exl3::text {
namespace {

// make_megabyte_golden.py's generator, rule for rule.
class MixedText {
 public:
  static std::string make(uint64_t seed = 20261205, size_t target = 1000000) {
    MixedText g(seed);
    std::string out;
    while (out.size() < target) g.piece(out);
    return out;
  }

 private:
  explicit MixedText(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  template <size_t N>
  const char* pick(const char* const (&list)[N]) {
    return list[next() % N];
  }

  static void ascii_upper(std::string& s, size_t from, size_t to) {
    for (size_t i = from; i < to; ++i)
      if (s[i] >= 'a' && s[i] <= 'z') s[i] = static_cast<char>(s[i] - 32);
  }
  void piece(std::string& out) {
    static const char* const kWords[] = {
        "the",      "harbour",  "town",   "woke",         "slowly",      "while",  "fishing",
        "boats",    "returned", "with",   "their",        "catch",       "and",    "children",
        "ran",      "along",    "quay",   "bakery",       "opened",      "early",  "river",
        "winter",   "summer",   "people", "story",        "old",         "new",    "light",
        "road",     "market",   "bread",  "school",       "north",       "south",  "quickly",
        "because",  "although", "never",  "quantization", "transformer", "kernel", "tensor",
        "gradient", "Hello",    "World",  "API",          "JSON",        "naïve",  "café",
        "Straße",   "don't",    "it's",   "we'll",        "they're",     "I'm",    "you've"};
    static const char* const kSpaces[] = {" ", " ", " ", "  ", "\n", "\n\n", "\t", " \n", "   "};
    static const char* const kPunct[] = {".",  ",", "!", "?",  "'s", "'ll", "...",
                                         "--", "(", ")", "\"", ":",  ";",   "/",
                                         "'",  "-", "&", "%",  "$",  "#",   "@"};
    static const char* const kCode[] = {
        "def ",   "return ",  "{",    "}",  "==",       "->", "i++", "0x1F",     "std::", "<div>",
        "</div>", "if (x) {", "    ", "//", "#include", "[]", "a_b", "__init__", "=>",    "!="};
    static const uint32_t kBlocks[][2] = {{0xC0, 0xFF},      {0x391, 0x3C9},   {0x410, 0x44F},
                                          {0x3041, 0x3096},  {0x4E00, 0x4FFF}, {0x2200, 0x22FF},
                                          {0x1F600, 0x1F64F}};
    const uint64_t r = next() % 100;
    if (r < 40) {
      const std::string w = pick(kWords);
      const uint64_t c = next() % 8;
      const size_t at = out.size();
      out += w;
      if (c == 0) ascii_upper(out, at, out.size());
      if (c == 1 || c == 2) ascii_upper(out, at, at + 1);
    } else if (r < 65) {
      out += pick(kSpaces);
    } else if (r < 75) {
      out += pick(kPunct);
    } else if (r < 83) {
      const uint64_t digits = next() % 10 + 1;
      for (uint64_t i = 0; i < digits; ++i) out += static_cast<char>('0' + next() % 10);
    } else if (r < 93) {
      const auto& b = kBlocks[next() % std::size(kBlocks)];
      out += utf8_of_codepoint(b[0] + static_cast<uint32_t>(next() % (b[1] - b[0] + 1)));
    } else {
      out += pick(kCode);
    }
  }

  uint64_t state_;
};

std::string sha256_hex(const void* data, size_t bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, bytes, md, &len, EVP_sha256(), nullptr) != 1) ADD_FAILURE() << "sha256";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::string ids_sha256(const std::vector<int32_t>& ids, size_t n) {
  return sha256_hex(ids.data(), n * sizeof(int32_t));  // int32 little-endian, as the script packs
}

class Megabyte : public ::testing::TestWithParam<const char*> {};

TEST_P(Megabyte, IdsEqualTheReference) {
  const std::string name = GetParam();
  std::filesystem::path dir = exl3::test::tokenizer_data_dir() / name;
  if (name == "conformance") {
    EXL3_REQUIRE_CONFORMANCE(conf);
    dir = conf / "models" / "tiny-qwen3moe-exl3";
  }
  static const nlohmann::json golden = nlohmann::json::parse(
      exl3::test::read_file(exl3::test::tokenizer_data_dir() / "golden_megabyte.json"));
  static const std::string text = MixedText::make();
  ASSERT_EQ(text.size(), golden["text_bytes"].get<size_t>());
  ASSERT_EQ(sha256_hex(text.data(), text.size()), golden["text_sha256"].get<std::string>())
      << "the generator differs from make_megabyte_golden.py's";
  const auto& want = golden["tokenizers_ids"][name];
  const std::vector<int32_t> ids = Tokenizer::load(dir).encode(text, false);
  if (ids_sha256(ids, ids.size()) == want["sha256"].get<std::string>() &&
      ids.size() == want["count"].get<size_t>()) {
    return;
  }
  // Locate the first 16384-id block that differs.
  const auto step = golden["prefix_step"].get<size_t>();
  const auto& prefixes = want["prefixes"];
  size_t block = 0;
  while (block < prefixes.size() && (block + 1) * step <= ids.size() &&
         ids_sha256(ids, (block + 1) * step) == prefixes[block].get<std::string>()) {
    ++block;
  }
  ADD_FAILURE() << name << ": " << ids.size() << " ids (reference " << want["count"]
                << "); the first difference is within ids " << block * step << ".."
                << (block + 1) * step;
}

INSTANTIATE_TEST_SUITE_P(Families, Megabyte,
                         ::testing::Values("conformance", "qwen2_style", "llama3_style",
                                           "o200k_style", "digits_style", "digits_grouped_style",
                                           "sp_llama_style", "sp_meta_style", "sp_gemma_style",
                                           "sp_split_style"));

}  // namespace
}  // namespace exl3::text
