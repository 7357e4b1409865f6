// The values a template computes with: Python's None, bool, int, float, str, list and dict as
// Jinja2 sees them, plus Jinja's Undefined and callables (macros, globals, bound methods).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace exl3::jinja {

struct Value;
using List = std::vector<Value>;

// Insertion-ordered string-keyed mapping (Python dicts keep insertion order, and tojson shows it).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): the one object a template may assign attributes to

  const Value* find(std::string_view key) const;
  void set(std::string key, Value v);
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Callable {
  std::string name;
  std::function<Value(Args&)> fn;
};

// Jinja's Undefined: what a missing variable, attribute or index evaluates to. Falsy, renders as
// "", iterates as empty; most other uses are errors that name `what`.
struct Undefined {
  std::string what;
};

struct Value {
  using Data = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string,
                            std::shared_ptr<const List>, std::shared_ptr<Dict>,
                            std::shared_ptr<const Callable>>;
  Data data;
  bool is_tuple = false;  // a list that Python would hold as a tuple: repr() shows (a, b)

  Value() = default;
  Value(Undefined u) : data(std::move(u)) {}
  Value(std::nullptr_t) : data(nullptr) {}
  Value(bool b) : data(b) {}
  Value(int64_t i) : data(i) {}
  Value(int i) : data(static_cast<int64_t>(i)) {}
  Value(double d) : data(d) {}
  Value(std::string s) : data(std::move(s)) {}
  Value(const char* s) : data(std::string(s)) {}
  Value(List l) : data(std::make_shared<const List>(std::move(l))) {}
  static Value tuple(List l) {
    Value v(std::move(l));
    v.is_tuple = true;
    return v;
  }
  Value(std::shared_ptr<Dict> d) : data(std::move(d)) {}
  Value(std::shared_ptr<const Callable> c) : data(std::move(c)) {}

  bool is_undefined() const { return std::holds_alternative<Undefined>(data); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(data); }
  bool is_bool() const { return std::holds_alternative<bool>(data); }
  bool is_int() const { return std::holds_alternative<int64_t>(data); }
  bool is_float() const { return std::holds_alternative<double>(data); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is int
  bool is_string() const { return std::holds_alternative<std::string>(data); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<const List>>(data); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(data); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<const Callable>>(data); }

  const std::string& str() const { return std::get<std::string>(data); }
  const List& list() const { return *std::get<std::shared_ptr<const List>>(data); }
  Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(data); }
  const Callable& callable() const { return *std::get<std::shared_ptr<const Callable>>(data); }
  // Python's int / float views; any other type throws ValueError.
  int64_t as_int() const;   // bool or int
  double as_float() const;  // bool, int or float
};

Value make_dict(std::vector<std::pair<std::string, Value>> items = {});
// A JSON value as the template sees it; nesting deeper than 256 throws ValueError.
Value from_json(const nlohmann::ordered_json& j, int depth = 0);

// Python's type name ("str", "int", "dict", "NoneType", ...; "undefined" for Undefined).
std::string type_name(const Value& v);
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
// Python's ordering: numbers with numbers, str with str, lists element-wise; else throws a
// message-only error (the caller adds the position).
bool less(const Value& a, const Value& b);
// str(v): what {{ v }} prints. repr(v): lists and dicts print their items this way.
std::string to_str(const Value& v);
std::string repr(const Value& v);

// json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...) as transformers'
// tojson filter calls it. `indent` < 0: none (one line).
struct JsonStyle {
  int indent = -1;
  std::string indent_text;        // used when non-empty (indent given as a string)
  std::string item_sep, key_sep;  // empty: Python's defaults for the indent
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonStyle& style);

// The message-only error operations throw; the evaluator adds the template name and position.
struct ValueError {
  std::string message;
};
[[noreturn]] void value_error(std::string message);

}  // namespace exl3::jinja
