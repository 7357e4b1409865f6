// Structured output over the real server (the conformance model, whose random weights write
// junk): whatever the model prefers, a constrained reply parses as JSON and satisfies its schema,
// greedy and sampled, whole and streamed, with a draft model beside it; max_tokens cuts a value
// short with finish_reason "length"; schemas outside the subset are a 400 naming the keyword.
#include <future>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/text/json_schema.hpp"
#include "server_test_util.hpp"
#include "test_support.hpp"

using namespace exl3;
using namespace exl3::server;
using namespace exl3::server::test;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

ServerOptions structured_options() {
  ServerOptions o;
  o.model_name = "tiny";
  o.scheduler.max_seqs = 4;
  o.scheduler.step_tokens = 64;
  return o;
}

// Bounded schemas (no free strings, bounded arrays): every reply must end by itself.
const char* const kBounded[] = {
    R"({"type": "object", "properties": {"name": {"enum": ["Ann", "Bo"]}, "age": {"type":
       "integer"}, "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["a",
       "b"]}, "maxItems": 3}}, "required": ["name", "age", "ok"], "additionalProperties": false})",
    R"({"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4})",
    R"({"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"anyOf":
       [{"type": "boolean"}, {"type": "null"}]}}, "required": ["x", "y"]}}, "type": "object",
       "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/p"}, "maxItems": 2},
       "kind": {"const": "pts"}}, "required": ["points", "kind"]})",
};

// A validator for the subset the tests use, written against the schema's meaning.
bool valid(const json& v, const json& s, const json& root) {
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return valid(v, ref == "#" ? root : root.at(json::json_pointer(ref.substr(1))), root);
  }
  if (s.contains("anyOf")) {
    for (const auto& alt : s["anyOf"])
      if (valid(v, alt, root)) return true;
    return false;
  }
  if (s.contains("enum")) {
    for (const auto& e : s["enum"])
      if (v == e) return true;
    return false;
  }
  if (s.contains("const")) return v == s["const"];
  const std::string type = s.value("type", "");
  if (type == "integer") return v.is_number_integer();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "string") return v.is_string();
  if (type == "array") {
    if (!v.is_array()) return false;
    if (v.size() < s.value("minItems", 0u) || v.size() > s.value("maxItems", 1000000u))
      return false;
    for (const auto& x : v)
      if (s.contains("items") && !valid(x, s["items"], root)) return false;
    return true;
  }
  if (type == "object") {
    if (!v.is_object()) return false;
    const json props = s.value("properties", json::object());
    for (const auto& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [k, x] : v.items()) {
      if (!props.contains(k)) {
        if (!props.empty()) return false;  // absent additionalProperties: no other keys
        continue;
      }
      if (!valid(x, props[k], root)) return false;
    }
    return true;
  }
  return true;
}

json structured_post(const LiveServer& s, const json& body, const char* path = "/v1/completions") {
  auto r = s.client()->Post(path, body.dump(), "application/json");
  if (!r) return {{"status", -1}};
  json j = json::parse(r->body, nullptr, false);
  j["status"] = r->status;
  return j;
}

json json_schema_format(const char* schema) {
  return {{"type", "json_schema"},
          {"json_schema", {{"name", "t"}, {"strict", true}, {"schema", json::parse(schema)}}}};
}

}  // namespace

TEST(HttpStructured, RepliesSatisfyTheirSchemaGreedyAndSampled) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), structured_options());
  int checked = 0;
  for (const char* schema : kBounded) {
    const json sj = json::parse(schema);
    // The four run together (batched), which keeps the test fast under sanitizers.
    std::vector<std::future<json>> replies;
    for (const int seed : {-1, 1, 2, 3}) {
      json body = {{"prompt", "The answer as JSON:"},
                   {"max_tokens", 400},
                   {"response_format", json_schema_format(schema)}};
      if (seed < 0) {
        body["temperature"] = 0;
      } else {
        body["temperature"] = 1.0;
        body["seed"] = seed;
        if (seed == 3) body.update({{"top_k", 20}, {"top_p", 0.9}, {"repetition_penalty", 1.3}});
      }
      replies.push_back(
          std::async(std::launch::async, [&s, body] { return structured_post(s, body); }));
    }
    for (auto& reply : replies) {
      const json r = reply.get();
      ASSERT_EQ(r["status"], 200) << r.dump();
      const std::string text = r["choices"][0]["text"];
      EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << schema << "\n" << text;
      const json v = json::parse(text, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << text;
      EXPECT_TRUE(valid(v, sj, sj)) << schema << "\n" << text;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

TEST(HttpStructured, JsonObjectAndFreeStringsStayParseable) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), structured_options());
  const char* schema = R"({"type": "object", "properties": {"note": {"type": "string"},
      "n": {"type": "integer"}}, "required": ["note", "n"]})";
  for (const int seed : {1, 2}) {
    for (const json& format : {json{{"type", "json_object"}}, json_schema_format(schema)}) {
      const json r = structured_post(s, {{"prompt", "JSON:"},
                                         {"max_tokens", 120},
                                         {"temperature", 1.0},
                                         {"seed", seed},
                                         {"response_format", format}});
      ASSERT_EQ(r["status"], 200) << r.dump();
      const std::string text = r["choices"][0]["text"];
      // A free string may run to max_tokens; whatever came is then a prefix of a valid value.
      if (r["choices"][0]["finish_reason"] == "stop") {
        const json v = json::parse(text, nullptr, false);
        ASSERT_TRUE(v.is_object()) << text;
        if (format["type"] == "json_schema") {
          EXPECT_TRUE(valid(v, json::parse(schema), json::parse(schema))) << text;
        }
      } else {
        EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
        const auto g = format["type"] == "json_object"
                           ? JsonGrammar::any_object()
                           : JsonGrammar::from_schema(nlohmann::ordered_json::parse(schema));
        JsonMatcher m(g);
        EXPECT_TRUE(m.feed(text)) << text;
      }
    }
  }
}

TEST(HttpStructured, MaxTokensCutsAValueShortWithLength) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), structured_options());
  const json r = structured_post(s, {{"prompt", "JSON:"},
                                     {"max_tokens", 3},
                                     {"temperature", 0},
                                     {"response_format", json_schema_format(kBounded[0])}});
  ASSERT_EQ(r["status"], 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
  const std::string text = r["choices"][0]["text"];
  EXPECT_FALSE(json::accept(text)) << text;
  JsonMatcher m(JsonGrammar::from_schema(nlohmann::ordered_json::parse(kBounded[0])));
  EXPECT_TRUE(m.feed(text)) << text;
}

TEST(HttpStructured, StreamedAndBesideADraftAndPlainRequests) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  const auto model = tiny_model(conf);
  LiveServer s(model, structured_options(), 4096, model);  // the model drafts for itself
  const json sj = json::parse(kBounded[2]);
  // A plain request runs beside the constrained ones (speculative decoding for it).
  std::thread plain([&] {
    const json r =
        structured_post(s, {{"prompt", "Hello"}, {"max_tokens", 24}, {"temperature", 0}});
    EXPECT_EQ(r["status"], 200);
  });
  for (const int seed : {1, 2}) {
    const json body = {{"prompt", "JSON:"},  {"max_tokens", 300},
                       {"temperature", 1.0}, {"seed", seed},
                       {"stream", true},     {"response_format", json_schema_format(kBounded[2])}};
    auto r = s.client()->Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::string text, finish;
    for (const auto& d : sse_data(r->body)) {
      if (d == "[DONE]") continue;
      const json c = json::parse(d);
      text += c["choices"][0]["text"].get<std::string>();
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(finish, "stop") << text;
    const json v = json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text;
    EXPECT_TRUE(valid(v, sj, sj)) << text;
  }
  plain.join();
}

TEST(HttpStructured, RefusesWhatItCannotEnforce) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  LiveServer s(tiny_model(conf), structured_options());
  const json r = structured_post(
      s, {{"prompt", "x"}, {"response_format", json_schema_format(R"({"type": "object",
                              "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}})")}});
  EXPECT_EQ(r["status"], 400);
  EXPECT_EQ(r["error"]["param"], "response_format");
  EXPECT_THAT(r["error"]["message"].get<std::string>(),
              HasSubstr("at #/properties/id/pattern: the keyword 'pattern' is not supported"));
}
