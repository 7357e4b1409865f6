// Argument binding, attribute / item access, iteration, tests and the global functions.
#include "builtins.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "unicode.hpp"

namespace exl3::jinja {

Binder::Binder(std::string_view fn, Args& args, std::initializer_list<std::string_view> names)
    : bound_(names.size()) {
  if (args.pos.size() > names.size()) {
    value_error(fmt::format("{}() takes at most {} arguments ({} given)", fn, names.size(),
                            args.pos.size()));
  }
  for (size_t i = 0; i < args.pos.size(); ++i) bound_[i] = std::move(args.pos[i]);
  for (auto& [k, v] : args.kw) {
    const auto it = std::find(names.begin(), names.end(), k);
    if (it == names.end())
      value_error(fmt::format("{}() got an unexpected keyword argument '{}'", fn, k));
    const auto i = static_cast<size_t>(it - names.begin());
    if (has(i)) value_error(fmt::format("{}() got multiple values for argument '{}'", fn, k));
    bound_[i] = std::move(v);
  }
}

const Value& Binder::operator[](size_t i) const {
  return bound_[i];
}

namespace {

[[noreturn]] void undefined_use(const Value& v) {
  value_error(std::get<Undefined>(v.data).what);
}

std::string object_name(const Value& v) {
  return "'" + type_name(v) + " object'";
}

}  // namespace

Value get_attr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) undefined_use(obj);
  if (auto m = method(obj, name)) return *m;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(name)) return *v;
  }
  return Undefined{fmt::format("{} has no attribute '{}'", object_name(obj), name)};
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_use(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.dict().find(key.str())) return *v;
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list()[static_cast<size_t>(i)];
    } else {
      const auto starts = uni::char_starts(obj.str());
      const auto n = static_cast<int64_t>(starts.size()) - 1;
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        const auto a = starts[static_cast<size_t>(i)], b = starts[static_cast<size_t>(i) + 1];
        return obj.str().substr(a, b - a);
      }
    }
  }
  if (key.is_string()) {
    if (auto m = method(obj, key.str())) return *m;
  }
  return Undefined{fmt::format("{} has no element {}", object_name(obj), repr(key))};
}

List iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.list();
  if (v.is_dict() && !v.dict().is_namespace) {
    List keys;
    for (const auto& [k, _] : v.dict().items) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    List chars;
    const auto starts = uni::char_starts(v.str());
    for (size_t i = 0; i + 1 < starts.size(); ++i) {
      chars.emplace_back(v.str().substr(starts[i], starts[i + 1] - starts[i]));
    }
    return chars;
  }
  value_error(fmt::format("'{}' object is not iterable", type_name(v)));
}

std::string percent_format(const std::string& fmt, const Value& args) {
  const List items = args.is_list() ? args.list() : List{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) value_error("incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    int precision = -1;
    if (fmt[i] == '.') {
      precision = 0;
      while (++i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        precision = precision * 10 + (fmt[i] - '0');
      }
      if (i >= fmt.size()) value_error("incomplete format");
    }
    if (next >= items.size()) value_error("not enough arguments for format string");
    const Value& a = items[next++];
    switch (fmt[i]) {
      case 's':
        out += to_str(a);
        break;
      case 'r':
        out += repr(a);
        break;
      case 'd':
      case 'i':
        if (!a.is_number())
          value_error(
              fmt::format("%{} format: a real number is required, not {}", fmt[i], type_name(a)));
        out += std::to_string(a.is_float() ? static_cast<int64_t>(a.as_float()) : a.as_int());
        break;
      case 'f':
        if (!a.is_number())
          value_error(fmt::format("%f format: a real number is required, not {}", type_name(a)));
        out += fmt::format("{:.{}f}", a.as_float(), precision < 0 ? 6 : precision);
        break;
      default:
        value_error(fmt::format("unsupported format character '{}'", fmt[i]));
    }
  }
  if (next < items.size()) value_error("not all arguments converted during string formatting");
  return out;
}

// ---- tests ------------------------------------------------------------------------------------

namespace {

constexpr std::string_view kTests[] = {
    "boolean", "callable", "defined",     "divisibleby", "eq",        "equalto",
    "==",      "even",     "false",       "float",       "ge",        ">=",
    "gt",      ">",        "greaterthan", "in",          "integer",   "iterable",
    "le",      "<=",       "lower",       "lt",          "<",         "lessthan",
    "mapping", "ne",       "!=",          "none",        "number",    "odd",
    "sameas",  "sequence", "string",      "true",        "undefined", "upper"};

bool all_chars(const std::string& s, bool (*pred)(uint32_t), bool (*other)(uint32_t)) {
  // Python's str.islower / isupper: at least one cased character, none of the other case.
  bool any = false;
  size_t len = 0;
  for (size_t i = 0; i < s.size(); i += len) {
    const uint32_t cp = uni::decode_at(s, i, &len);
    if (other(cp)) return false;
    any = any || pred(cp);
  }
  return any;
}

}  // namespace

bool is_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

bool apply_test(std::string_view name, const Value& v, Args& args) {
  auto arg = [&](std::string_view what) {
    Binder b(name, args, {what});
    return b[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_int() != 0;
  if (name == "false") return v.is_bool() && v.as_int() == 0;
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "callable") return v.is_callable();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "lower") return v.is_string() && all_chars(v.str(), uni::is_lower, uni::is_upper);
  if (name == "upper") return v.is_string() && all_chars(v.str(), uni::is_upper, uni::is_lower);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int() && !v.is_bool())
      value_error(fmt::format("test '{}' needs an integer, got {}", name, type_name(v)));
    const int64_t d = name == "divisibleby" ? arg("num").as_int() : 2;
    if (d == 0) value_error("divisibleby 0");
    const bool divisible = v.as_int() % d == 0;
    return name == "odd" ? !divisible : divisible;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg("other"));
  if (name == "ne" || name == "!=") return !equal(v, arg("other"));
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, arg("other"));
  if (name == "gt" || name == "greaterthan" || name == ">") return less(arg("other"), v);
  if (name == "le" || name == "<=") return !less(arg("other"), v);
  if (name == "ge" || name == ">=") return !less(v, arg("other"));
  if (name == "sameas") {
    const Value o = arg("other");
    if (v.is_dict() && o.is_dict()) return &v.dict() == &o.dict();
    return (v.is_none() && o.is_none()) || (v.is_bool() && o.is_bool() && equal(v, o));
  }
  if (name == "in") {
    const Value seq = arg("seq");
    for (const auto& x : iterate(seq)) {
      if (equal(x, v)) return true;
    }
    return seq.is_string() && v.is_string() && seq.str().find(v.str()) != std::string::npos;
  }
  value_error(fmt::format("unknown test '{}'", name));
}

// ---- globals ----------------------------------------------------------------------------------

namespace {

Value function(std::string name, std::function<Value(Args&)> fn) {
  return Value(std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)}));
}

Value range_fn(Args& args) {
  if (!args.kw.empty()) value_error("range() takes no keyword arguments");
  for (const auto& a : args.pos) {
    if (!a.is_int() && !a.is_bool())
      value_error(
          fmt::format("range(): '{}' object cannot be interpreted as an integer", type_name(a)));
  }
  int64_t start = 0, stop = 0, step = 1;
  if (args.pos.size() == 1) {
    stop = args.pos[0].as_int();
  } else if (args.pos.size() == 2 || args.pos.size() == 3) {
    start = args.pos[0].as_int();
    stop = args.pos[1].as_int();
    if (args.pos.size() == 3) step = args.pos[2].as_int();
  } else {
    value_error(fmt::format("range expected 1 to 3 arguments, got {}", args.pos.size()));
  }
  if (step == 0) value_error("range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 1'000'000) value_error("range() is too long (more than 1000000 items)");
    out.emplace_back(i);
  }
  return out;
}

Value dict_fn(Args& args, bool is_namespace) {
  auto d = std::make_shared<Dict>();
  d->is_namespace = is_namespace;
  if (args.pos.size() > 1) value_error("expected at most 1 positional argument");
  if (!args.pos.empty()) {
    const Value& init = args.pos[0];
    if (!init.is_dict()) value_error(fmt::format("cannot build a dict from '{}'", type_name(init)));
    d->items = init.dict().items;
  }
  for (auto& [k, v] : args.kw) d->set(k, std::move(v));
  return Value(std::move(d));
}

}  // namespace

Value global(std::string_view name, std::optional<std::time_t> now) {
  if (name == "range") return function("range", range_fn);
  if (name == "dict") return function("dict", [](Args& a) { return dict_fn(a, false); });
  if (name == "namespace") return function("namespace", [](Args& a) { return dict_fn(a, true); });
  if (name == "raise_exception") {
    return function("raise_exception", [](Args& a) -> Value {
      Binder b("raise_exception", a, {"message"});
      throw TemplateRaised{to_str(b[0])};
    });
  }
  if (name == "strftime_now") {
    return function("strftime_now", [now](Args& a) -> Value {
      Binder b("strftime_now", a, {"format"});
      if (!b[0].is_string()) value_error("strftime_now() needs a format string");
      const std::time_t t = now.value_or(std::time(nullptr));
      std::tm tm{};
      localtime_r(&t, &tm);
      std::string buf(256 + b[0].str().size() * 8, '\0');
      const size_t n = std::strftime(buf.data(), buf.size(), b[0].str().c_str(), &tm);
      buf.resize(n);
      return buf;
    });
  }
  return Undefined{fmt::format("'{}' is undefined", name)};
}

}  // namespace exl3::jinja
