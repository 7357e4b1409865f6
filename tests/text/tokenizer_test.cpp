// The tokenizer against Hugging Face `tokenizers` (golden ids written by
// data/make_tokenizer_golden.py): encode with and without special tokens, decode (whole, skipping
// special tokens, and cut mid-character), streaming decode, lookups, threads and speed.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/text/tokenizer.hpp"
#include "test_support.hpp"
#include "text/tokenizer_internal.hpp"  // the regex layer, checked on its own below
#include "tokenizer_test_util.hpp"

namespace {

using exl3::Tokenizer;
using nlohmann::json;

json read_golden(const std::string& name) {
  return json::parse(
      exl3::read_text_file(exl3::test::tokenizer_data_dir() / ("golden_" + name + ".json")));
}

std::string show(const std::string& s) {
  return json(s).dump(-1, ' ', true, json::error_handler_t::replace);
}

// Every golden case of `name` through `tok`. `round_trip`: decode(encode(s)) must give s back
// (tokenizers without a normalizer or whitespace-stripping added tokens).
void check_golden(const Tokenizer& tok, const std::string& name, bool round_trip) {
  const json g = read_golden(name);
  ASSERT_GT(g["cases"].size(), 20u);
  for (const auto& c : g["cases"]) {
    const auto text = c["text"].get<std::string>();
    SCOPED_TRACE(name + ": " + show(text));
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto plain = c["ids_no_special"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, true), ids);
    EXPECT_EQ(tok.encode(text, false), plain);
    EXPECT_EQ(tok.decode(plain), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>());
    const std::vector<int32_t> half(plain.begin(),
                                    plain.begin() + static_cast<std::ptrdiff_t>(plain.size() / 2));
    EXPECT_EQ(tok.decode(half), c["decoded_half"].get<std::string>());
    if (round_trip) {
      EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
    }
  }
}

Tokenizer load_style(const std::string& style) {
  return Tokenizer::load(exl3::test::tokenizer_data_dir() / style);
}

}  // namespace

TEST(Tokenizer, ConformanceMatchesReference) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto tok = Tokenizer::load(dir / "models" / "tiny-qwen3moe-exl3");
  check_golden(tok, "conformance", true);
}

TEST(Tokenizer, Qwen2StyleMatchesReference) {
  // Split(Qwen2 regex) + ByteLevel, NFC, ChatML specials, lstrip/rstrip/single_word/normalized
  // added tokens, merges as pairs. NFC and the stripping tokens change the text, so the golden
  // decode is the reference's, not the input.
  check_golden(load_style("qwen2_style"), "qwen2_style", false);
}

TEST(Tokenizer, DigitsPreTokenizerMatchesReference) {
  // SmolLM2's pre-tokenizer shape: Sequence[Digits, ByteLevel(use_regex)], digits one by one and
  // in runs, with "11" / "22" merges so the two differ; ASCII, Arabic-Indic, fullwidth, fraction,
  // Roman-numeral and superscript digits (data/make_digits_golden.py).
  check_golden(load_style("digits_style"), "digits_style", false);
  check_golden(load_style("digits_grouped_style"), "digits_grouped_style", false);
}

TEST(Tokenizer, SentencePieceStyleMatchesReference) {
  // BPE over characters with byte_fallback (<0xXX> tokens for characters outside the vocabulary):
  // Llama-2 / Mistral v0.1 / Mixtral's Prepend + Replace normalizer with Replace, ByteFallback,
  // Fuse, Strip decoding; Mistral v0.3's Metaspace (prepend_scheme first) pre-tokenizer and
  // decoder; Metaspace with prepend_scheme always and split (data/make_sentencepiece_golden.py).
  for (const char* style : {"sp_llama_style", "sp_meta_style", "sp_split_style"}) {
    const auto tok = load_style(style);
    EXPECT_FALSE(tok.byte_level()) << style;
    EXPECT_EQ(tok.bos_id(), 1) << style;
    check_golden(tok, style, false);
  }
  // Gemma's pipeline (data/make_gemma_golden.py): Replace alone, no dummy prefix (a leading
  // space stays a token of its own); <bos> is id 2 and the chat turn markers are special added
  // tokens.
  const auto gemma = load_style("sp_gemma_style");
  EXPECT_FALSE(gemma.byte_level());
  EXPECT_EQ(gemma.bos_id(), 2);
  check_golden(gemma, "sp_gemma_style", false);
  EXPECT_TRUE(load_style("llama3_style").byte_level());
  // token_bytes: a byte token is its byte, the metaspace a space.
  const auto tok = load_style("sp_llama_style");
  EXPECT_EQ(tok.token_bytes(*tok.token_to_id("<0x41>")), "A");
  EXPECT_EQ(tok.token_bytes(*tok.token_to_id("\xE2\x96\x81")), " ");
}

TEST(Tokenizer, Llama3StyleMatchesReference) {
  // Split(Llama-3 regex) + ByteLevel, no normalizer, ignore_merges, BOS template, "a b" merges.
  check_golden(load_style("llama3_style"), "llama3_style", true);
}

TEST(Tokenizer, O200kStyleMatchesReference) {
  // gpt-oss's pre-tokenizer: Split(o200k regex: cased words with case-insensitive contractions,
  // digit triples, punctuation runs keeping trailing newlines and slashes) + ByteLevel.
  check_golden(load_style("o200k_style"), "o200k_style", true);
}

// tokenizer.json patterns are Oniguruma regexes; the PCRE2 translation must cut text exactly as
// the reference's Split(Regex, Isolated) does, including the constructs whose meaning differs.
TEST(Tokenizer, RegexSplitsMatchOniguruma) {
  const json g = read_golden("regex");
  ASSERT_GT(g["cases"].size(), 100u);
  for (const auto& c : g["cases"]) {
    const auto pattern = c["pattern"].get<std::string>();
    const auto text = c["text"].get<std::string>();
    const exl3::tok::Regex re(pattern, exl3::tok::Regex::Syntax::kOniguruma, "golden pattern");
    std::vector<std::pair<size_t, size_t>> matches;
    re.find_all(text, matches);
    std::vector<std::string> pieces;
    size_t prev = 0;
    for (const auto& [b, e] : matches) {
      if (prev < b) pieces.push_back(text.substr(prev, b - prev));
      if (b < e) pieces.push_back(text.substr(b, e - b));
      prev = e;
    }
    if (prev < text.size()) pieces.push_back(text.substr(prev));
    EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>())
        << "pattern " << show(pattern) << " on " << show(text);
  }
}

TEST(Tokenizer, Lookups) {
  const auto q = load_style("qwen2_style");
  EXPECT_EQ(q.token_to_id("<|im_start|>"), 1);
  EXPECT_EQ(q.id_to_token(1), "<|im_start|>");
  EXPECT_TRUE(q.is_special(1));
  EXPECT_FALSE(q.is_special(700));  // <think>: an added token, not special
  EXPECT_EQ(q.id_to_token(700), "<think>");
  EXPECT_EQ(q.eos_id(), 2);
  EXPECT_EQ(q.eos_token(), "<|im_end|>");
  EXPECT_FALSE(q.bos_id().has_value());  // "bos_token": null
  EXPECT_EQ(q.vocab_size(), 706);
  EXPECT_EQ(q.num_tokens(), 706u);
  EXPECT_EQ(q.token_to_id("\xC4\xA0t"), q.encode(" t", false).at(0));  // "Ġt"
  EXPECT_FALSE(q.token_to_id("no such token").has_value());
  EXPECT_FALSE(q.id_to_token(100000).has_value());
  EXPECT_FALSE(q.id_to_token(-1).has_value());
  EXPECT_EQ(q.token_bytes(q.encode(" t", false).at(0)), " t");
  EXPECT_THAT(q.chat_template(), ::testing::HasSubstr("<|im_start|>"));

  const auto l = load_style("llama3_style");
  EXPECT_EQ(l.bos_id(), 0);
  EXPECT_EQ(l.bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(l.eos_token(), "<|eot_id|>");  // given as an AddedToken object
  EXPECT_EQ(l.encode("", true), std::vector<int32_t>{0});
  EXPECT_EQ(l.encode("", false), std::vector<int32_t>{});
  // Unknown ids are skipped by decode, as the reference does.
  EXPECT_EQ(l.decode(std::vector<int32_t>{-5, 123456}), "");
}

TEST(Tokenizer, LoadsFromTheFileItselfAndConformanceConfig) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto tok = Tokenizer::load(dir / "models" / "tiny-qwen3moe-exl3" / "tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.id_to_token(3), "!");
  EXPECT_TRUE(tok.chat_template().empty());
}

TEST(Tokenizer, StreamDecoderYieldsCompleteCharacters) {
  for (const char* style :
       {"qwen2_style", "llama3_style", "sp_llama_style", "sp_meta_style", "sp_split_style"}) {
    const auto tok = load_style(style);
    const json g = read_golden(style);
    for (const auto& c : g["cases"]) {
      const auto ids = c["ids"].get<std::vector<int32_t>>();
      for (const bool skip : {false, true}) {
        exl3::StreamDecoder dec(tok, skip);
        std::string all;
        for (const int32_t id : ids) {
          const std::string piece = dec.push(id);
          // json::dump throws on invalid UTF-8: every piece must be complete text.
          EXPECT_NO_THROW((void)json(piece).dump())
              << style << " " << show(c["text"].get<std::string>());
          all += piece;
        }
        all += dec.finish();
        EXPECT_EQ(all, tok.decode(ids, skip)) << style << " " << show(c["text"].get<std::string>());
      }
    }
  }
  // A character cut by the end of the stream becomes U+FFFD at finish(), like decode().
  const auto tok = load_style("llama3_style");
  const auto ids = tok.encode("\xF0\x9F\x98\x80", false);  // one emoji, several byte tokens
  ASSERT_GT(ids.size(), 1u);
  exl3::StreamDecoder dec(tok);
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(dec.push(ids[i]), "");
  EXPECT_EQ(dec.finish(), "\xEF\xBF\xBD");
  std::string again;  // finish() reset the decoder
  for (const int32_t id : ids) again += dec.push(id);
  EXPECT_EQ(again, "\xF0\x9F\x98\x80");
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const auto tok = load_style("qwen2_style");
  const json g = read_golden("qwen2_style");
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        for (const auto& c : g["cases"]) {
          if (tok.encode(c["text"].get<std::string>(), true) !=
              c["ids"].get<std::vector<int32_t>>())
            ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

TEST(Tokenizer, EncodeSpeed) {
  const auto tok = load_style("qwen2_style");
  const json g = read_golden("qwen2_style");
  std::string text;
  while (text.size() < 100 * 1024) {
    for (const auto& c : g["cases"]) text += c["text"].get<std::string>() + "\n";
  }
  // Pathological shapes: long runs of one class, and one very long word.
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"mixed", text},
      {"spaces", std::string(100 * 1024, ' ') + "x"},
      {"newlines", std::string(100 * 1024, '\n')},
      {"one word", std::string(100 * 1024, 'a')},
      {"digits", std::string(100 * 1024, '7')},
      {"specials", [] {
         std::string s;
         while (s.size() < 100 * 1024) s += "<|im_start|>x<tool> ";
         return s;
       }()}};
  for (const auto& [name, in] : inputs) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(in, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("[encode speed] {:>9}: {} bytes -> {} tokens in {:.1f} ms ({:.1f} MB/s)\n", name,
               in.size(), ids.size(), s * 1e3, in.size() / s / 1e6);
    EXPECT_LT(s, 5.0)
        << name;  // generous: sanitizer builds are slow; a release build takes milliseconds
    if (name != "mixed" && name != "specials") {
      EXPECT_EQ(tok.decode(ids), in) << name;
    }
  }
}
