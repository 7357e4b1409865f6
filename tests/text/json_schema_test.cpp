// The JSON-schema compiler and matcher: byte strings accepted or refused, completion, token
// masks over a small synthetic vocabulary, and the refusal of keywords outside the subset.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/text/json_schema.hpp"

using namespace exl3;
using ojson = nlohmann::ordered_json;
using ::testing::HasSubstr;

namespace {

std::shared_ptr<const JsonGrammar> schema(const char* text) {
  return JsonGrammar::from_schema(ojson::parse(text));
}

// Whether `text` is a whole value of `g`, fed in one piece and byte by byte alike.
bool accepts(const std::shared_ptr<const JsonGrammar>& g, std::string_view text) {
  JsonMatcher whole(g), bytewise(g);
  const bool a = whole.feed(text) && whole.complete();
  bool b = true;
  for (const char c : text) b = b && bytewise.feed(std::string_view(&c, 1));
  b = b && bytewise.complete();
  EXPECT_EQ(a, b) << text;
  return a;
}

// Whether `text` can still grow into a value of `g`.
bool prefix(const std::shared_ptr<const JsonGrammar>& g, std::string_view text) {
  JsonMatcher m(g);
  return m.feed(text);
}

std::string refusal(const char* text) {
  try {
    schema(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST(JsonSchema, AnyObject) {
  const auto g = JsonGrammar::any_object();
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_TRUE(accepts(g, R"({"a": [1, -2.5e+3, true, null, {"b": "x\u00e9\n"}], "c": false})"));
  EXPECT_TRUE(accepts(g, "{\"k\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}"));
  EXPECT_TRUE(accepts(g, " {\n  \"a\": 1\n}"));
  EXPECT_FALSE(accepts(g, "[]"));
  EXPECT_FALSE(accepts(g, "\"x\""));
  EXPECT_FALSE(accepts(g, "{\"a\":01}"));
  EXPECT_FALSE(accepts(g, "{\"a\":1,}"));
  EXPECT_FALSE(accepts(g, "{\"a\" 1}"));
  EXPECT_FALSE(accepts(g, "{} "));                   // nothing after the value
  EXPECT_FALSE(accepts(g, "{\"a\":\"\\ud800\"}"));   // a lone surrogate
  EXPECT_FALSE(accepts(g, "{\"a\":\"\xc0\xaf\"}"));  // an overlong form
  EXPECT_FALSE(accepts(g, "{\"a\":\"\x01\"}"));      // a raw control character
  EXPECT_FALSE(accepts(g, "{\"a\":tru}"));
  EXPECT_TRUE(prefix(g, "{\"a\": [1, {\"b\""));
  EXPECT_FALSE(prefix(g, "{\"a\": ]"));
}

TEST(JsonSchema, WhitespaceIsBounded) {
  const auto g = JsonGrammar::any_object();
  EXPECT_TRUE(prefix(g, "{" + std::string(JsonMatcher::kMaxSpace, ' ')));
  EXPECT_FALSE(prefix(g, "{" + std::string(JsonMatcher::kMaxSpace + 1, ' ')));
  EXPECT_FALSE(prefix(g, std::string(JsonMatcher::kMaxSpace + 1, '\n')));
}

TEST(JsonSchema, NumbersAndIntegers) {
  const auto num = schema(R"({"type": "number"})");
  const auto integer = schema(R"({"type": "integer"})");
  for (const char* ok : {"0", "-0", "12", "-3.25", "1e5", "1.5E-3", "0.0"}) {
    EXPECT_TRUE(accepts(num, ok)) << ok;
  }
  for (const char* bad : {"-", "01", "1.", ".5", "1e", "+1", "1e+", "--1"}) {
    EXPECT_FALSE(accepts(num, bad)) << bad;
  }
  EXPECT_TRUE(accepts(integer, "-42"));
  EXPECT_FALSE(accepts(integer, "4.2"));
  EXPECT_FALSE(accepts(integer, "4e2"));
  // Digits are bounded, so a model cannot grow a number forever.
  EXPECT_TRUE(accepts(integer, std::string(16, '9')));
  EXPECT_FALSE(prefix(integer, std::string(17, '9')));
  // A bare number is complete but may still grow: not finished.
  JsonMatcher m(integer);
  ASSERT_TRUE(m.feed("12"));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.finished());
}

TEST(JsonSchema, PropertiesInOrderRequiredAndClosed) {
  const auto g = schema(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array",
      "items": {"type": "string"}, "minItems": 1, "maxItems": 2}},
      "required": ["name", "tags"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(g, R"({"name": "Ann", "age": 7, "tags": ["a"]})"));
  EXPECT_TRUE(accepts(g, R"({"name":"Ann","tags":["a","b"]})"));
  EXPECT_FALSE(accepts(g, R"({"name":"Ann"})"));                       // tags missing
  EXPECT_FALSE(accepts(g, R"({"age":7,"name":"Ann","tags":["a"]})"));  // out of order
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","tags":[]})"));             // minItems
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","tags":["a","b","c"]})"));  // maxItems
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","x":1,"tags":["a"]})"));    // unknown key
  EXPECT_FALSE(accepts(g, R"({"name":3,"tags":["a"]})"));              // wrong type
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","tags":["a"],})"));
  JsonMatcher m(g);
  ASSERT_TRUE(m.feed(R"({"name":"A","tags":["x"]})"));
  EXPECT_TRUE(m.finished());
}

TEST(JsonSchema, AbsentAdditionalPropertiesMeansNoOtherKeys) {
  const auto listed = schema(R"({"properties": {"a": {"type": "boolean"}}})");
  EXPECT_TRUE(accepts(listed, R"({"a":true})"));
  EXPECT_TRUE(accepts(listed, "{}"));
  EXPECT_FALSE(accepts(listed, R"({"b":true})"));
  // Without properties, an object schema says nothing about keys: any object.
  const auto open = schema(R"({"type": "object"})");
  EXPECT_TRUE(accepts(open, R"({"b":[1,{"c":null}]})"));
  const auto closed = schema(R"({"type": "object", "additionalProperties": false})");
  EXPECT_TRUE(accepts(closed, "{}"));
  EXPECT_FALSE(accepts(closed, R"({"b":1})"));
}

TEST(JsonSchema, EnumConstTypeListsAndAlternatives) {
  const auto e = schema(R"({"enum": ["red", "green", 3, null, {"a": [1]}]})");
  for (const char* ok : {"\"red\"", "\"green\"", "3", "null", "{\"a\":[1]}"}) {
    EXPECT_TRUE(accepts(e, ok)) << ok;
  }
  EXPECT_FALSE(accepts(e, "\"blue\""));
  EXPECT_FALSE(accepts(e, "4"));
  const auto typed_enum = schema(R"({"type": "string", "enum": ["a", 1]})");
  EXPECT_TRUE(accepts(typed_enum, "\"a\""));
  EXPECT_FALSE(accepts(typed_enum, "1"));
  EXPECT_TRUE(accepts(schema(R"({"const": "x"})"), "\"x\""));
  const auto list = schema(R"({"type": ["integer", "null"]})");
  EXPECT_TRUE(accepts(list, "5"));
  EXPECT_TRUE(accepts(list, "null"));
  EXPECT_FALSE(accepts(list, "\"5\""));
  const auto alt = schema(R"({"anyOf": [{"type": "object", "properties": {"n": {"type":
      "number"}}, "required": ["n"]}, {"type": "array", "items": {"type": "boolean"}}]})");
  EXPECT_TRUE(accepts(alt, R"({"n":1.5})"));
  EXPECT_TRUE(accepts(alt, "[true,false]"));
  EXPECT_FALSE(accepts(alt, R"({"n":true})"));
  const auto one = schema(R"({"oneOf": [{"type": "string"}, {"type": "boolean"}]})");
  EXPECT_TRUE(accepts(one, "true"));
  EXPECT_FALSE(accepts(one, "1"));
}

TEST(JsonSchema, LocalReferencesAndRecursion) {
  const auto g = schema(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
      "required": ["v", "next"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(accepts(g, R"({"v":1,"next":{"v":2,"next":null}})"));
  EXPECT_FALSE(accepts(g, R"({"v":1,"next":{"v":2}})"));
  const auto defs = schema(R"({"definitions": {"a": {"type": "string"}},
      "type": "array", "items": {"$ref": "#/definitions/a"}})");
  EXPECT_TRUE(accepts(defs, R"(["x","y"])"));
  EXPECT_FALSE(accepts(defs, "[1]"));
  // Recursion without a base case is bounded by the parse depth, not followed forever.
  const auto deep = schema(R"({"type": "array", "items": {"$ref": "#"}})");
  EXPECT_TRUE(accepts(deep, "[[],[[]]]"));
  EXPECT_FALSE(prefix(deep, std::string(JsonMatcher::kMaxDepth + 1, '[')));
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedByName) {
  EXPECT_THAT(refusal(R"({"type": "string", "pattern": "^a"})"),
              HasSubstr("keyword 'pattern' is not supported"));
  EXPECT_THAT(refusal(R"({"type": "string", "format": "date"})"), HasSubstr("'format'"));
  EXPECT_THAT(refusal(R"({"properties": {"n": {"type": "integer", "minimum": 0}}})"),
              HasSubstr("at #/properties/n/minimum: the keyword 'minimum' is not supported"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"a": {}},
                          "additionalProperties": true})"),
              HasSubstr("additionalProperties"));
  EXPECT_THAT(refusal(R"({"properties": {"a": {}}, "required": ["b"]})"),
              HasSubstr("required property 'b'"));
  EXPECT_THAT(refusal(R"({"$ref": "http://example.com/s.json"})"), HasSubstr("not local"));
  EXPECT_THAT(refusal(R"({"$ref": "#/$defs/missing"})"), HasSubstr("points at nothing"));
  EXPECT_THAT(refusal(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                          "$ref": "#/$defs/a"})"),
              HasSubstr("cycle"));
  EXPECT_THAT(refusal(R"({"type": "decimal"})"), HasSubstr("not a JSON schema type"));
  EXPECT_THAT(refusal(R"({"type": "string", "enum": [1, 2]})"), HasSubstr("no enum"));
  EXPECT_THAT(refusal(R"({"type": "array", "minItems": 3, "maxItems": 2})"),
              HasSubstr("minItems 3 exceeds maxItems 2"));
  EXPECT_THAT(refusal("[]"), HasSubstr("must be an object"));
  EXPECT_THAT(refusal("false"), HasSubstr("accepts nothing"));
  // Annotations are no constraint and are accepted.
  EXPECT_EQ(refusal(R"({"title": "T", "description": "d", "type": "string", "default": "x"})"),
            "(accepted)");
}

TEST(JsonSchema, MasksOverASyntheticVocabulary) {
  // id: bytes; 0 is a special token (no bytes), 9 is a would-be EOS the caller adds itself.
  const std::vector<std::string> vocab = {
      "",     "{", "}",    "\"",  "\"name\"", ":",   " ",  "1",
      "\"na", "",  "true", "\":", "ab",       "{\"", "}x", "\"age\":"};
  const TokenTrie trie(vocab);
  const auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string"},
      "age": {"type": "integer"}}, "required": ["age"]})");
  JsonMatcher m(g);
  std::vector<uint8_t> mask;
  auto allowed = [&] {
    m.allowed_tokens(trie, mask);
    std::vector<int> ids;
    for (size_t i = 0; i < mask.size(); ++i)
      if (mask[i]) ids.push_back(static_cast<int>(i));
    return ids;
  };
  using ::testing::ElementsAre;
  EXPECT_THAT(allowed(), ElementsAre(1, 6, 13));  // "{", " ", "{\""
  ASSERT_TRUE(m.feed("{"));
  // A key ("name" is optional, "age" required), white space, or the start of a key; not "}".
  EXPECT_THAT(allowed(), ElementsAre(3, 4, 6, 8, 15));
  ASSERT_TRUE(m.feed("\"age\":"));
  EXPECT_THAT(allowed(), ElementsAre(6, 7));  // " ", "1"
  ASSERT_TRUE(m.feed("1"));
  EXPECT_THAT(allowed(), ElementsAre(2, 6, 7));  // "}", " ", "1" (no "}x": nothing follows)
  EXPECT_FALSE(m.complete());
  ASSERT_TRUE(m.feed("}"));
  EXPECT_TRUE(m.finished());
  EXPECT_THAT(allowed(), ElementsAre());
  EXPECT_EQ(mask.size(), vocab.size());
}

TEST(JsonSchema, FeedLeavesTheStateOnARejectedToken) {
  JsonMatcher m(JsonGrammar::any_object());
  ASSERT_TRUE(m.feed("{\"a\":"));
  EXPECT_FALSE(m.feed("]"));
  EXPECT_FALSE(m.feed("1}x"));
  EXPECT_TRUE(m.feed("1}"));
  EXPECT_TRUE(m.finished());
}

TEST(JsonSchema, ForcedToolCallShapes) {
  const std::vector<JsonGrammar::ToolFunction> fns = {
      {"get_weather", ojson::parse(R"({"type": "object", "properties": {"city": {"type":
          "string"}}, "required": ["city"]})")},
      {"now", nullptr}};
  const auto hermes = JsonGrammar::tool_call(fns, {"<tool_call>\n", "\n</tool_call>"});
  EXPECT_TRUE(
      accepts(hermes,
              "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
              "</tool_call>"));
  EXPECT_TRUE(
      accepts(hermes, "<tool_call>\n{\"name\":\"now\",\"arguments\":{\"x\":[1]}}\n</tool_call>"));
  EXPECT_FALSE(
      accepts(hermes, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_FALSE(accepts(hermes, "<tool_call>\n{\"name\":\"other\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_FALSE(accepts(hermes, "{\"name\":\"now\",\"arguments\":{}}"));
  JsonMatcher m(hermes);
  ASSERT_TRUE(m.feed("<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_TRUE(m.finished());
  JsonGrammar::ToolCallShape llama;
  llama.arguments_key = "parameters";
  EXPECT_TRUE(accepts(JsonGrammar::tool_call(fns, llama), R"({"name":"now","parameters":{}})"));
  JsonGrammar::ToolCallShape mistral{"[TOOL_CALLS]", "", "arguments", true, -1};
  const auto list = JsonGrammar::tool_call(fns, mistral);
  EXPECT_TRUE(accepts(
      list, R"([TOOL_CALLS][{"name":"now","arguments":{}},{"name":"now","arguments":{}}])"));
  EXPECT_FALSE(accepts(list, "[TOOL_CALLS][]"));
  // "parallel_tool_calls": false: a list of exactly one call.
  mistral.max_calls = 1;
  const auto one = JsonGrammar::tool_call(fns, mistral);
  EXPECT_TRUE(accepts(one, R"([TOOL_CALLS][{"name":"now","arguments":{}}])"));
  EXPECT_FALSE(
      accepts(one, R"([TOOL_CALLS][{"name":"now","arguments":{}},{"name":"now","arguments":{}}])"));
  EXPECT_FALSE(accepts(one, "[TOOL_CALLS][]"));
  try {
    JsonGrammar::tool_call({{"f", ojson::parse(R"({"type": "string", "format": "date"})")}}, {});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("the function 'f' parameters: at #/format"));
  }
}

TEST(JsonSchema, StatesInsideAStringRepeat) {
  // The scheduler keeps the last mask while the state repeats; inside a free string it must.
  JsonMatcher m(JsonGrammar::any_object());
  ASSERT_TRUE(m.feed("{\"a\":\"x"));
  const JsonMatcher before = m;
  ASSERT_TRUE(m.feed("yz \xc3\xa9\\n"));
  EXPECT_TRUE(m.same_state(before));
  ASSERT_TRUE(m.feed("\""));
  EXPECT_FALSE(m.same_state(before));
}
