// Structured output: a JSON schema compiled to a grammar of JSON values (JsonGrammar), and an
// incremental matcher (JsonMatcher) that says which next bytes, and so which vocabulary tokens
// (TokenTrie), keep the output a prefix of a value the grammar accepts.
//
// The schema subset (anything else is refused with exl3::Error naming the keyword and where it
// is, so a schema is never silently half enforced):
//   type                  object, array, string, number, integer, boolean, null, or a list of them
//   properties, required  the object holds the listed properties in the schema's order, each
//                         required one present, the others optional
//   additionalProperties  false, or left out: no keys beyond `properties`. An object schema
//                         without `properties` accepts any object (true is then accepted too);
//                         true or a schema next to `properties` is refused
//   items, minItems, maxItems
//   enum, const           the values as compact JSON (no white space inside)
//   anyOf, oneOf          alternation (oneOf's "exactly one" is not checked)
//   $ref, $defs, definitions  local references ("#", "#/$defs/name", "#/definitions/name", ...),
//                         recursion included
//   title, description, default, examples, $schema, $comment, deprecated, readOnly, writeOnly
//                         annotations, ignored
//
// The matcher keeps the output a compact-ish JSON text: at most kMaxSpace white-space bytes
// between two tokens of JSON (so a model cannot loop on spaces), numbers of at most 16 digits
// per part (2 in an exponent), no \u escape of a surrogate, valid UTF-8 in strings, and at most
// kMaxDepth nested frames. Nothing may follow the complete value.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace exl3 {

class Tokenizer;

struct JsonGrammar {
  enum class Kind : uint8_t {
    kAny,           // any JSON value
    kObject,        // properties (or any keys when any_keys)
    kArray,         // items (node), min_items, max_items
    kString,        // any string
    kNumber,        // any number
    kInteger,       // a number without fraction or exponent
    kLiterals,      // one of `literals` (compact JSON texts): enum, const, boolean, null
    kAlternatives,  // any of `alternatives`
  };
  struct Property {
    std::string key;  // the key as JSON text, quotes included
    int32_t node = 0;
    bool required = false;
  };
  struct Node {
    Kind kind = Kind::kAny;
    std::vector<Property> properties;
    bool any_keys = false;  // kObject: any keys, any values
    int32_t items = 0;      // kArray
    int64_t min_items = 0;
    int64_t max_items = -1;  // -1: no bound
    std::vector<std::string> literals;
    std::vector<int32_t> alternatives;
  };
  // Node 0 is "any value" and node 1 the literals true, false and null (what kAny starts);
  // `root` is the value the whole output must be, between the texts of the single-literal nodes
  // `prefix` and `suffix` (-1: none).
  std::vector<Node> nodes;
  int32_t root = 0;
  int32_t prefix = -1, suffix = -1;

  // Any JSON object (response_format json_object).
  static std::shared_ptr<const JsonGrammar> any_object();
  // A schema (see above). `what` prefixes error messages (e.g. "response_format: json_schema").
  // Throws exl3::Error for a keyword outside the subset, a malformed value or a bad reference.
  // Properties are generated in the order of `schema`'s text, hence the ordered JSON.
  static std::shared_ptr<const JsonGrammar> from_schema(const nlohmann::ordered_json& schema,
                                                        std::string_view what = "schema");

  // A forced tool call: one call of one of `functions`, written as a model family writes it.
  struct ToolFunction {
    std::string name;
    nlohmann::ordered_json parameters;  // its JSON schema; null: any object
  };
  struct ToolCallShape {
    std::string prefix, suffix;               // text around the JSON (e.g. "<tool_call>\n")
    std::string arguments_key = "arguments";  // Llama writes "parameters"
    bool list = false;                        // a JSON list of one or more calls (Mistral)
    int64_t max_calls = -1;                   // list: at most this many calls (-1: no limit)
  };
  // The JSON is {"name": NAME, ARGUMENTS_KEY: {...}} (or a list of them). Throws exl3::Error
  // naming the function when a parameters schema is outside the subset.
  static std::shared_ptr<const JsonGrammar> tool_call(const std::vector<ToolFunction>& functions,
                                                      const ToolCallShape& shape);
};

// The vocabulary as a byte trie, built once per tokenizer, so the tokens a matcher state allows
// are found in one walk that abandons a prefix at its first rejected byte.
class TokenTrie {
 public:
  // token_bytes[id]: the bytes the token stands for; empty for tokens a mask never allows.
  explicit TokenTrie(const std::vector<std::string>& token_bytes);
  // Every token of `tok` with its bytes, special tokens left out (they are never JSON text).
  static std::shared_ptr<const TokenTrie> from_tokenizer(const Tokenizer& tok);
  size_t vocab_size() const { return vocab_size_; }

 private:
  friend class JsonMatcher;
  struct Node {
    uint32_t first_edge = 0, num_edges = 0;
    uint32_t first_token = 0, num_tokens = 0;
  };
  struct Edge {
    uint8_t byte;
    uint32_t child;
  };
  uint32_t build(std::vector<int32_t>& ids, size_t lo, size_t hi, size_t depth,
                 const std::vector<std::string>& bytes);
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<int32_t> tokens_;
  size_t vocab_size_ = 0;
};

class JsonMatcher {
 public:
  static constexpr int kMaxSpace = 4;   // white-space bytes in one gap
  static constexpr int kMaxDepth = 64;  // frames of one parse (about 32 nested containers)
  static constexpr size_t kMaxThreads = 64;

  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> grammar);

  // Consumes `bytes` when the output stays a prefix of an accepted value (true); otherwise
  // leaves the state as it was (false).
  bool feed(std::string_view bytes);
  // The output so far is a whole accepted value.
  bool complete() const;
  // Complete, and no byte may follow (the generation is over).
  bool finished() const;
  // allowed[id] = 1 for every token of `trie` whose bytes feed() would take, 0 otherwise (the
  // vector is resized to the trie's vocabulary).
  void allowed_tokens(const TokenTrie& trie, std::vector<uint8_t>& allowed) const;
  // Equal states allow the same tokens: inside a free string the state repeats token after
  // token, and a caller can keep the last mask instead of walking the trie again.
  bool same_state(const JsonMatcher& other) const {
    return g_ == other.g_ && state_ == other.state_;
  }

  // One frame of a parse: a value to start, or the container / string / number / literal being
  // read. Public only so the state's types are complete here.
  struct Frame {
    uint8_t kind = 0, phase = 0, space = 0, pad = 0;
    int32_t node = 0;
    int32_t a = 0, b = 0;
    auto operator<=>(const Frame&) const = default;
  };
  using Thread = std::vector<Frame>;  // one parse: a stack of frames (empty: complete)
  using State = std::vector<Thread>;  // every parse still possible (alternatives run together)

 private:
  bool step(const State& from, uint8_t c, State& to) const;
  std::shared_ptr<const JsonGrammar> g_;
  State state_;
};

}  // namespace exl3
