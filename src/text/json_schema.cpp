// JSON schema -> JsonGrammar (see json_schema.hpp).
#include "exl3/text/json_schema.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "exl3/error.hpp"

namespace exl3 {

using ojson = nlohmann::ordered_json;

namespace {

using Kind = JsonGrammar::Kind;

constexpr int kMaxSchemaDepth = 64;   // nesting of the schema text itself
constexpr size_t kMaxNodes = 10'000;  // grammar size: bounds the work on a hostile schema

const std::set<std::string, std::less<>>& annotations() {
  static const std::set<std::string, std::less<>> s = {"title",      "description", "default",
                                                       "examples",   "$schema",     "$comment",
                                                       "deprecated", "readOnly",    "writeOnly"};
  return s;
}

const std::set<std::string, std::less<>>& structural() {
  static const std::set<std::string, std::less<>> s = {
      "type",  "properties", "required", "additionalProperties",
      "items", "minItems",   "maxItems", "enum",
      "const", "anyOf",      "oneOf",    "$ref",
      "$defs", "definitions"};
  return s;
}

std::string compact(const ojson& v) {
  return v.dump(-1, ' ', false, ojson::error_handler_t::strict);
}

// "~1" and "~0" of a JSON pointer token, and its %XX escapes (a URI fragment).
std::string unescape_pointer_token(std::string_view t, const std::string& where) {
  std::string pct;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '%' && i + 2 < t.size()) {
      const std::string hex(t.substr(i + 1, 2));
      if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        fail("{}: a bad %-escape in the reference", where);
      pct += static_cast<char>(std::stoi(hex, nullptr, 16));
      i += 2;
    } else {
      pct += t[i];
    }
  }
  std::string out;
  for (size_t i = 0; i < pct.size(); ++i) {
    if (pct[i] == '~' && i + 1 < pct.size() && (pct[i + 1] == '0' || pct[i + 1] == '1')) {
      out += pct[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      out += pct[i];
    }
  }
  return out;
}

bool type_matches(const ojson& v, std::string_view type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") return v.is_number_integer();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  return false;
}

// A grammar holding only node 0 (any value) and node 1 (true, false, null), which kAny uses.
std::shared_ptr<JsonGrammar> base_grammar() {
  auto g = std::make_shared<JsonGrammar>();
  g->nodes.resize(2);
  g->nodes[1].kind = Kind::kLiterals;
  g->nodes[1].literals = {"true", "false", "null"};
  return g;
}

// Compiles one schema (the root its references resolve in) into `g`.
class Compiler {
 public:
  Compiler(const ojson& root, std::string_view what, JsonGrammar& g)
      : root_(root), what_(what), g_(&g) {}

  int32_t run() { return compile(root_, "#", 0); }

 private:
  [[noreturn]] void refuse(const std::string& where, const std::string& why) const {
    fail("{}: at {}: {}", what_, where, why);
  }

  int32_t add(JsonGrammar::Node n) {
    if (g_->nodes.size() >= kMaxNodes)
      fail("{}: the schema is too large (over {} parts); hint: simplify it", what_, kMaxNodes);
    g_->nodes.push_back(std::move(n));
    return static_cast<int32_t>(g_->nodes.size() - 1);
  }

  const ojson* resolve(const std::string& ref, const std::string& where) const {
    if (ref.empty() || ref[0] != '#')
      refuse(where, fmt::format("the reference \"{}\" is not local (only \"#...\" references "
                                "into this schema are supported)",
                                ref));
    const ojson* cur = &root_;
    std::string_view rest = std::string_view(ref).substr(1);
    if (!rest.empty() && rest[0] != '/')
      refuse(where, fmt::format("the reference \"{}\" is not a JSON pointer (e.g. "
                                "\"#/$defs/name\")",
                                ref));
    while (!rest.empty()) {
      rest.remove_prefix(1);
      const size_t slash = rest.find('/');
      const std::string token = unescape_pointer_token(rest.substr(0, slash), where);
      rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
      if (cur->is_object()) {
        const auto it = cur->find(token);
        if (it == cur->end())
          refuse(where, fmt::format("the reference \"{}\" points at nothing", ref));
        cur = &*it;
      } else if (cur->is_array() && !token.empty() &&
                 token.find_first_not_of("0123456789") == std::string::npos && token.size() < 9 &&
                 std::stoul(token) < cur->size()) {
        cur = &(*cur)[std::stoul(token)];
      } else {
        refuse(where, fmt::format("the reference \"{}\" points at nothing", ref));
      }
    }
    return cur;
  }

  int32_t compile(const ojson& s, const std::string& where, int depth) {
    if (depth > kMaxSchemaDepth)
      refuse(where, fmt::format("the schema nests deeper than {} levels", kMaxSchemaDepth));
    if (s.is_boolean()) {
      if (!s.get<bool>()) refuse(where, "the schema false accepts nothing");
      return 0;
    }
    if (!s.is_object())
      refuse(where, fmt::format("a schema must be an object, got {}", s.type_name()));
    // Follow a chain of plain references to the schema they name; a cycle of them names none.
    const ojson* target = &s;
    std::string at = where;
    for (int hops = 0; target->contains("$ref"); ++hops) {
      if (hops > 64) refuse(where, "the references form a cycle");
      for (const auto& kv : target->items()) {
        const std::string& k = kv.key();
        if (k != "$ref" && k != "$defs" && k != "definitions" && !annotations().contains(k))
          refuse(at + "/" + k, fmt::format("'{}' beside '$ref' is not supported; move it into "
                                           "the referenced schema",
                                           k));
      }
      const ojson& ref = (*target)["$ref"];
      if (!ref.is_string()) refuse(at, "'$ref' must be a string");
      at = ref.get<std::string>();
      target = resolve(at, where);
      if (target->is_boolean()) return compile(*target, at, depth + 1);
      if (!target->is_object()) refuse(at, "the reference does not name a schema object");
    }
    if (const auto it = memo_.find(target); it != memo_.end()) return it->second;
    for (const auto& kv : target->items()) {
      const std::string& k = kv.key();
      if (!structural().contains(k) && !annotations().contains(k)) {
        refuse(at + "/" + k,
               fmt::format("the keyword '{}' is not supported (supported: type, "
                           "properties, required, additionalProperties, items, minItems, "
                           "maxItems, enum, const, anyOf, oneOf, $ref, $defs); remove it",
                           k));
      }
    }
    // Reserved before its parts compile, so a recursive reference finds it.
    const int32_t id = add({});
    memo_[target] = id;
    JsonGrammar::Node n = body(*target, at, depth);
    g_->nodes[static_cast<size_t>(id)] = std::move(n);
    return id;
  }

  JsonGrammar::Node body(const ojson& s, const std::string& at, int depth) {
    const bool has_enum = s.contains("enum") || s.contains("const");
    const bool has_alt = s.contains("anyOf") || s.contains("oneOf");
    std::vector<std::string> types;
    if (const auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array() && !it->empty()) {
        for (const auto& t : *it) {
          if (!t.is_string()) refuse(at + "/type", "'type' must be a string or a list of them");
          types.push_back(t.get<std::string>());
        }
      } else {
        refuse(at + "/type", "'type' must be a string or a non-empty list of strings");
      }
      for (const auto& t : types) {
        if (t != "object" && t != "array" && t != "string" && t != "number" && t != "integer" &&
            t != "boolean" && t != "null") {
          refuse(at + "/type", fmt::format("the type \"{}\" is not a JSON schema type", t));
        }
      }
    }
    if (has_alt) {
      for (const char* k : {"type", "properties", "items", "enum", "const", "required",
                            "additionalProperties", "minItems", "maxItems"}) {
        if (s.contains(k))
          refuse(at + "/" + k,
                 fmt::format("'{}' beside anyOf/oneOf is not supported; move it into each "
                             "alternative",
                             k));
      }
      if (s.contains("anyOf") && s.contains("oneOf"))
        refuse(at, "anyOf and oneOf in one schema are not supported");
      const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
      const ojson& alts = s[key];
      if (!alts.is_array() || alts.empty())
        refuse(at + "/" + key, fmt::format("'{}' must be a non-empty list of schemas", key));
      JsonGrammar::Node n;
      n.kind = Kind::kAlternatives;
      for (size_t i = 0; i < alts.size(); ++i)
        n.alternatives.push_back(compile(alts[i], fmt::format("{}/{}/{}", at, key, i), depth + 1));
      return n;
    }
    if (has_enum) return literals(s, at, types);
    if (types.empty()) {
      // No type: what the other keywords imply, else any value.
      if (s.contains("properties") || s.contains("required") ||
          s.contains("additionalProperties")) {
        types.push_back("object");
      } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
        types.push_back("array");
      } else {
        return {};  // kAny
      }
    }
    if (types.size() == 1) return typed(s, at, types[0], depth);
    JsonGrammar::Node n;
    n.kind = Kind::kAlternatives;
    for (const auto& t : types) n.alternatives.push_back(add(typed(s, at, t, depth)));
    return n;
  }

  JsonGrammar::Node literals(const ojson& s, const std::string& at,
                             const std::vector<std::string>& types) {
    if (s.contains("enum") && s.contains("const"))
      refuse(at, "enum and const in one schema are not supported");
    std::vector<const ojson*> values;
    if (const auto it = s.find("const"); it != s.end()) {
      values.push_back(&*it);
    } else {
      const ojson& e = s["enum"];
      if (!e.is_array() || e.empty()) refuse(at + "/enum", "'enum' must be a non-empty list");
      for (const auto& v : e) values.push_back(&v);
    }
    JsonGrammar::Node n;
    n.kind = Kind::kLiterals;
    for (const ojson* v : values) {
      const bool fits = types.empty() || std::any_of(types.begin(), types.end(),
                                                     [&](auto& t) { return type_matches(*v, t); });
      if (!fits) continue;
      std::string text;
      try {
        text = compact(*v);
      } catch (const ojson::exception&) {
        refuse(at, "an enum or const value holds invalid UTF-8");
      }
      if (std::find(n.literals.begin(), n.literals.end(), text) == n.literals.end())
        n.literals.push_back(std::move(text));
    }
    if (n.literals.empty()) refuse(at, "no enum or const value has the schema's type");
    return n;
  }

  JsonGrammar::Node typed(const ojson& s, const std::string& at, const std::string& type,
                          int depth) {
    JsonGrammar::Node n;
    if (type == "boolean" || type == "null") {
      n.kind = Kind::kLiterals;
      n.literals = type == "null" ? std::vector<std::string>{"null"}
                                  : std::vector<std::string>{"true", "false"};
    } else if (type == "string") {
      n.kind = Kind::kString;
    } else if (type == "number") {
      n.kind = Kind::kNumber;
    } else if (type == "integer") {
      n.kind = Kind::kInteger;
    } else if (type == "array") {
      n.kind = Kind::kArray;
      n.items = s.contains("items") ? compile(s["items"], at + "/items", depth + 1) : 0;
      n.min_items = count(s, "minItems", at, 0);
      n.max_items = count(s, "maxItems", at, -1);
      if (n.max_items >= 0 && n.min_items > n.max_items)
        refuse(at, fmt::format("minItems {} exceeds maxItems {}", n.min_items, n.max_items));
    } else {
      object(s, at, depth, n);
    }
    return n;
  }

  int64_t count(const ojson& s, const char* key, const std::string& at, int64_t absent) {
    const auto it = s.find(key);
    if (it == s.end()) return absent;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1'000'000)
      refuse(at + "/" + key, fmt::format("'{}' must be an integer in 0..1000000", key));
    return it->get<int64_t>();
  }

  void object(const ojson& s, const std::string& at, int depth, JsonGrammar::Node& n) {
    n.kind = Kind::kObject;
    const auto props = s.find("properties");
    if (props != s.end() && !props->is_object())
      refuse(at + "/properties", "'properties' must be an object");
    std::set<std::string> required;
    if (const auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) refuse(at + "/required", "'required' must be a list of names");
      for (const auto& r : *it) {
        if (!r.is_string()) refuse(at + "/required", "'required' must be a list of names");
        if (props == s.end() || !props->contains(r.get<std::string>())) {
          refuse(at + "/required",
                 fmt::format("the required property '{}' is not in 'properties' (no other keys "
                             "are generated)",
                             r.get<std::string>()));
        }
        required.insert(r.get<std::string>());
      }
    }
    const auto extra = s.find("additionalProperties");
    if (extra != s.end() && !extra->is_boolean() && !extra->is_object())
      refuse(at + "/additionalProperties",
             "'additionalProperties' must be true, false or a schema");
    const bool closed = extra != s.end() && *extra == false;
    if (props == s.end() || props->empty()) {
      // Nothing said about keys: any object, unless closed (then only {}).
      if (extra != s.end() && extra->is_object() && !extra->empty())
        refuse(at + "/additionalProperties",
               "a schema for additionalProperties is not supported; use false or leave it out");
      n.any_keys = !closed;
      return;
    }
    if (extra != s.end() && !closed) {
      refuse(at + "/additionalProperties",
             "additionalProperties other than false beside 'properties' is not supported (the "
             "object holds only its listed properties); set it to false or leave it out");
    }
    for (const auto& kv : props->items()) {
      const std::string& k = kv.key();
      JsonGrammar::Property p;
      p.key = compact(ojson(k));
      p.required = required.contains(k);
      p.node = compile(kv.value(), at + "/properties/" + k, depth + 1);
      n.properties.push_back(std::move(p));
    }
  }

  const ojson& root_;
  std::string what_;
  JsonGrammar* g_;
  std::map<const ojson*, int32_t> memo_;
};

}  // namespace

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
  auto g = base_grammar();
  g->nodes.emplace_back().kind = Kind::kObject;
  g->nodes.back().any_keys = true;
  g->root = 2;
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::from_schema(const nlohmann::ordered_json& schema,
                                                            std::string_view what) {
  auto g = base_grammar();
  g->root = Compiler(schema, what, *g).run();
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::tool_call(
    const std::vector<ToolFunction>& functions, const ToolCallShape& shape) {
  if (functions.empty()) fail("tool_call: no functions to call");
  auto g = base_grammar();
  auto literal = [&](const std::string& text) {
    if (text.empty()) return -1;
    Node n;
    n.kind = Kind::kLiterals;
    n.literals = {text};
    g->nodes.push_back(std::move(n));
    return static_cast<int32_t>(g->nodes.size() - 1);
  };
  // One call object per function: its name, and arguments of its parameters schema (any object
  // when it has none); the calls are the alternatives.
  Node calls;
  calls.kind = Kind::kAlternatives;
  for (const auto& f : functions) {
    Node call;
    call.kind = Kind::kObject;
    call.properties.push_back({compact(ojson("name")), literal(compact(ojson(f.name))), true});
    int32_t args = 0;
    if (f.parameters.is_null()) {
      args = static_cast<int32_t>(g->nodes.size());
      g->nodes.emplace_back().kind = Kind::kObject;
      g->nodes.back().any_keys = true;
    } else {
      args = Compiler(f.parameters, fmt::format("the function '{}' parameters", f.name), *g).run();
    }
    call.properties.push_back({compact(ojson(shape.arguments_key)), args, true});
    g->nodes.push_back(std::move(call));
    calls.alternatives.push_back(static_cast<int32_t>(g->nodes.size() - 1));
  }
  g->nodes.push_back(std::move(calls));
  g->root = static_cast<int32_t>(g->nodes.size() - 1);
  if (shape.list) {
    Node list;
    list.kind = Kind::kArray;
    list.items = g->root;
    list.min_items = 1;
    list.max_items = shape.max_calls;
    g->nodes.push_back(std::move(list));
    g->root = static_cast<int32_t>(g->nodes.size() - 1);
  }
  g->prefix = literal(shape.prefix);
  g->suffix = literal(shape.suffix);
  return g;
}

}  // namespace exl3
