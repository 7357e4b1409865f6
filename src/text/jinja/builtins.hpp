// Jinja2's filters, tests, the str / dict / list methods templates call, and the globals.
#pragma once

#include <ctime>
#include <optional>
#include <string_view>

#include "value.hpp"

namespace exl3::jinja {

bool is_filter(std::string_view name);
bool is_test(std::string_view name);

// Each throws ValueError (message only) when the arguments do not fit.
Value apply_filter(std::string_view name, const Value& subject, Args& args);
bool apply_test(std::string_view name, const Value& subject, Args& args);
// obj.name as a bound method when obj's type has a method called `name` (nullopt otherwise).
std::optional<Value> method(const Value& obj, std::string_view name);

// range, dict, namespace, raise_exception, strftime_now (at `now`, or the current time).
// raise_exception throws TemplateRaised.
struct TemplateRaised {
  std::string message;
};
Value global(std::string_view name, std::optional<std::time_t> now);

// Jinja's obj.name: a method first (as Python's getattr finds it), then a dict key; missing
// attributes are Undefined. Undefined `obj` throws.
Value get_attr(const Value& obj, std::string_view name);
// obj[key]: a dict key or a list / str index (negative from the end), then the attribute; missing
// items are Undefined. Undefined `obj` throws.
Value get_item(const Value& obj, const Value& key);
// What `for x in v` visits: list items, dict keys, str characters; Undefined is empty.
List iterate(const Value& v);
// Python's `fmt % args` for %s, %r, %d, %i, %f (with precision) and %%.
std::string percent_format(const std::string& fmt, const Value& args);

// Python's keyword binding for a builtin: positional args then keywords, in `names` order.
// Returns the argument for `names[i]` or `fallback`; throws on unknown / duplicate keywords and
// too many arguments.
class Binder {
 public:
  Binder(std::string_view fn, Args& args, std::initializer_list<std::string_view> names);
  const Value& operator[](size_t i) const;
  bool has(size_t i) const { return !bound_[i].is_undefined(); }
  Value get(size_t i, Value fallback) const { return has(i) ? bound_[i] : std::move(fallback); }

 private:
  std::vector<Value> bound_;
};

}  // namespace exl3::jinja
