// Hugging Face tokenizer (`tokenizer.json`) for the model runtime: byte-level BPE as used by
// GPT-2, Llama-3, Qwen2/2.5/3 and their derivatives, and SentencePiece-style BPE with byte
// fallback as used by Llama-2, Mistral and Mixtral, producing the same ids as the reference
// Rust `tokenizers` library (checked against it by tests/text/, golden data from
// tests/text/data/make_tokenizer_golden.py).
//
// Pipeline of encode(text), exactly as `tokenizers` runs it:
//   1. added tokens whose `normalized` flag is false are split out of the raw text
//   (leftmost-longest
//      match; `single_word`, `lstrip` and `rstrip` honoured);
//   2. each remaining piece is normalized (none, or NFC via utf8proc) and the `normalized` added
//      tokens are split out of it;
//   3. the pre-tokenizer cuts the rest into words: Split(Regex, Isolated) steps (PCRE2 with
//   UTF+UCP,
//      which matches Oniguruma on these patterns), then ByteLevel (GPT-2 regex when use_regex);
//   4. each word is mapped to GPT-2's byte->unicode alphabet and run through BPE merges (lowest
//      rank first; `ignore_merges` looks the whole word up first); results are cached per word;
//   5. with add_special_tokens, the post-processor (TemplateProcessing, e.g. Llama-3's BOS) wraps
//      the ids.
//
// Supported tokenizer.json: model BPE (merges as "a b" strings or ["a", "b"] pairs; unk_token,
// fuse_unk, ignore_merges; no dropout or subword prefix/suffix); normalizer null, NFC,
// Prepend, Replace (a literal pattern) or a Sequence of those; pre_tokenizer ByteLevel
// (add_prefix_space=false) optionally preceded by Split(Regex|String, behavior Isolated, invert
// false) and Digits (individual_digits true or false: an isolating split on \p{N} or \p{N}+)
// steps in a Sequence; decoder ByteLevel. With byte_fallback (SentencePiece style): BPE over
// characters, a character outside the vocabulary becoming its <0xXX> byte tokens; pre_tokenizer
// null (the text is one word) or Metaspace (prepend_scheme always/first/never, split); decoder a
// Sequence of Replace, ByteFallback, Fuse, Strip and Metaspace, run over the whole id sequence;
// post_processor null, ByteLevel, TemplateProcessing (single), or a Sequence of those. Anything
// else (WordPiece/Unigram/WordLevel models, other normalizers, pre-tokenizers or decoders) fails at
// load with an exl3::Error naming the file and the feature: exl3 never tokenizes differently in
// silence. `truncation` and `padding` are ignored (the runtime neither truncates nor pads).
//
// Text handed to encode() must be valid UTF-8 (as every Python/Rust string is); invalid input
// throws. decode() output: invalid UTF-8 produced by the byte-level tokens (e.g. a cut multi-byte
// character) is REPLACED with U+FFFD, one per maximal invalid subsequence, exactly like the
// reference decoder (Rust's String::from_utf8_lossy). Ids without a token are skipped, as the
// reference does. StreamDecoder yields the same text incrementally, holding back incomplete
// characters.
//
// A Tokenizer is immutable after load and safe to use from several threads (the word cache is
// internally locked). Copies share the loaded state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace exl3 {

class Tokenizer {
 public:
  // Loads `tokenizer.json` from `path` (a model folder, or the tokenizer.json file itself) plus,
  // when present next to it, `tokenizer_config.json` (bos_token, eos_token, chat_template) and
  // `chat_template.jinja` (used when tokenizer_config.json has no chat_template).
  static Tokenizer load(const std::filesystem::path& path);

  // Builds a tokenizer from in-memory JSON. `tokenizer_config_json` may be empty. `source_name`
  // prefixes error messages (e.g. the folder name).
  static Tokenizer from_json(std::string_view tokenizer_json,
                             std::string_view tokenizer_config_json = {},
                             const std::string& source_name = "tokenizer.json");

  // Token ids of `text` (valid UTF-8, else throws exl3::Error). With add_special_tokens, the
  // post-processor's tokens are added (Llama-3: BOS first); special tokens written in the text
  // (e.g. "<|im_start|>") are always recognised, as in the reference.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Text of `ids`. skip_special drops added tokens marked special. Invalid UTF-8 is replaced by
  // U+FFFD (see above); unknown ids are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Raw bytes of one token (byte-level decoded, possibly an incomplete UTF-8 sequence), or nullopt.
  // SentencePiece-style tokens: <0xXX> gives its byte, others their text with the decoder's
  // replacement character as a space.
  std::optional<std::string> token_bytes(int32_t id) const;
  // True for byte-level BPE (decode concatenates the tokens' bytes); false for SentencePiece-style
  // BPE, whose decoder works on the whole sequence (a leading space dropped, byte runs joined).
  bool byte_level() const;

  // Vocabulary lookups with the stored token strings (byte-level form, e.g. "Ġworld").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;  // an added token with "special": true

  // From tokenizer_config.json (nullopt when absent or null).
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<std::string> bos_token() const;
  std::optional<std::string> eos_token() const;
  // The raw Jinja chat template source (empty when the model has none). See chat_template.hpp.
  const std::string& chat_template() const;
  // The file the chat template came from (tokenizer_config.json or chat_template.jinja), for
  // messages.
  const std::string& chat_template_source() const;

  // 1 + the largest token id (model vocab and added tokens); the embedding must have at least
  // this many rows.
  int32_t vocab_size() const;
  // Number of distinct tokens (model vocab plus added tokens not in it).
  size_t num_tokens() const;

  // Where the tokenizer was loaded from (for messages).
  const std::string& source() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Incremental detokenizer for generation: push() ids one at a time and get back only complete
// UTF-8 text; bytes of a character split across tokens are held until it completes. The
// concatenation of every push() plus finish() equals Tokenizer::decode of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  // Newly completed text (possibly empty).
  std::string push(int32_t id);
  // Flushes held bytes (an incomplete character at the end becomes U+FFFD) and resets.
  std::string finish();

 private:
  Tokenizer tok_;  // shares the loaded state
  bool skip_special_;
  std::string pending_;  // byte-level: bytes of an incomplete character
  // SentencePiece-style: the ids so far; text is the difference between decoding ids[prefix_..]
  // and ids[prefix_..read_) (a window, so the decoder's start-of-text rules cancel out).
  std::vector<int32_t> ids_;
  size_t prefix_ = 0, read_ = 0;
};

}  // namespace exl3
