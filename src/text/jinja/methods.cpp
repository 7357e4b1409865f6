// The string and dict methods templates call on a value (a name after a dot, then arguments).
// Lists have none: a template may read the values it is given but never change them, every list
// method but the reading ones changes its list, and chat templates call no reading ones.
#include <algorithm>

#include <fmt/format.h>

#include "builtins.hpp"
#include "unicode.hpp"

namespace exl3::jinja {

namespace {

Value bound(const Value& self, std::string_view name, Value (*fn)(const Value&, Args&)) {
  auto c = std::make_shared<const Callable>(
      Callable{std::string(name), [self, fn](Args& a) { return fn(self, a); }});
  return Value(std::move(c));
}

std::optional<std::string> chars_arg(std::string_view fn, Args& a) {
  Binder b(fn, a, {"chars"});
  if (!b.has(0) || b[0].is_none()) return std::nullopt;
  if (!b[0].is_string())
    value_error(fmt::format("{}(): the characters to strip are {}; expected a string or none", fn,
                            type_name(b[0])));
  return b[0].str();
}

const std::string& str_arg(const Value& v, std::string_view fn) {
  if (!v.is_string())
    value_error(fmt::format("{}(): the argument is {}; expected a string", fn, type_name(v)));
  return v.str();
}

// split / rsplit of a string, both cutting from the left here. No separator: every stretch of
// white space is one cut and the result holds no empty pieces. A separator: a cut at each place
// it occurs, so neighbouring separators leave an empty piece between them.
List split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is_none() || sep.is_undefined()) {
    const auto starts = uni::char_starts(s);
    size_t i = 0, len = 0;
    const size_t n = starts.size() - 1;
    auto space = [&](size_t k) { return uni::is_space(uni::decode_at(s, starts[k], &len)); };
    while (true) {
      while (i < n && space(i)) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.emplace_back(
            uni::strip(std::string_view(s).substr(starts[i]), std::nullopt, false, true));
        break;
      }
      size_t j = i;
      while (j < n && !space(j)) ++j;
      out.emplace_back(s.substr(starts[i], starts[j] - starts[i]));
      i = j;
    }
    return out;
  }
  const std::string& d = str_arg(sep, "split");
  if (d.empty()) value_error("split(): the separator is empty");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t k = s.find(d, pos);
    if (k == std::string::npos) break;
    out.emplace_back(s.substr(pos, k - pos));
    pos = k + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

bool affix(const Value& self, Args& a, bool prefix) {
  Binder b(prefix ? "startswith" : "endswith", a, {"prefix"});
  const std::string& s = self.str();
  const List options = b[0].is_list() ? b[0].list() : List{b[0]};
  for (const auto& o : options) {
    const std::string& p = str_arg(o, prefix ? "startswith" : "endswith");
    if (prefix ? s.starts_with(p) : s.ends_with(p)) return true;
  }
  return false;
}

// The string format method. Each {...} field is replaced: an empty one by the next positional
// argument in turn, a number by that positional argument, a name by that keyword argument. "{{"
// and "}}" write one brace. Fields with a conversion (!), layout options after a colon (:), an
// attribute (.) or an index ([) are refused.
std::string brace_format(const std::string& f, Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if ((c == '{' || c == '}') && i + 1 < f.size() && f[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') value_error("format(): a '}' without its '{' (write '}}' for a literal brace)");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t end = f.find('}', i);
    if (end == std::string::npos)
      value_error("format(): a '{' without its '}' (write '{{' for a literal brace)");
    const std::string field = f.substr(i + 1, end - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) {
      value_error(fmt::format(
          "format field '{{{}}}': conversions and layout options are not supported", field));
    }
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      if (field.size() > 9)
        value_error(fmt::format("format field '{{{}}}' is out of range", field));
      const size_t k = field.empty() ? auto_index++ : std::stoul(field);
      if (k >= a.pos.size())
        value_error(
            fmt::format("format(): a field asks for positional argument {}, but {} {} given", k,
                        a.pos.size(), a.pos.size() == 1 ? "was" : "were"));
      v = &a.pos[k];
    } else {
      for (const auto& [name, val] : a.kw) {
        if (name == field) v = &val;
      }
      if (!v) value_error(fmt::format("format: no argument named '{}'", field));
    }
    out += to_str(*v);
    i = end;
  }
  return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with,
                    int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // an empty pattern matches before every character and at the end
    const auto starts = uni::char_starts(s);
    for (size_t i = 0; i + 1 < starts.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      out += s.substr(starts[i], starts[i + 1] - starts[i]);
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    const size_t k = s.find(old, pos);
    if (k == std::string::npos) break;
    out += s.substr(pos, k - pos) + with;
    pos = k + old.size();
    ++done;
  }
  return out + s.substr(pos);
}

std::optional<Value> str_method(const Value& self, std::string_view name) {
  using F = Value (*)(const Value&, Args&);
  static const std::pair<std::string_view, F> kMethods[] = {
      {"strip",
       [](const Value& s, Args& a) -> Value {
         return uni::strip(s.str(), chars_arg("strip", a), true, true);
       }},
      {"lstrip",
       [](const Value& s, Args& a) -> Value {
         return uni::strip(s.str(), chars_arg("lstrip", a), true, false);
       }},
      {"rstrip",
       [](const Value& s, Args& a) -> Value {
         return uni::strip(s.str(), chars_arg("rstrip", a), false, true);
       }},
      {"upper",
       [](const Value& s, Args& a) -> Value {
         Binder("upper", a, {});
         return uni::upper(s.str());
       }},
      {"lower",
       [](const Value& s, Args& a) -> Value {
         Binder("lower", a, {});
         return uni::lower(s.str());
       }},
      {"title",
       [](const Value& s, Args& a) -> Value {
         Binder("title", a, {});
         return uni::title(s.str());
       }},
      {"capitalize",
       [](const Value& s, Args& a) -> Value {
         Binder("capitalize", a, {});
         return uni::capitalize(s.str());
       }},
      {"startswith", [](const Value& s, Args& a) -> Value { return affix(s, a, true); }},
      {"endswith", [](const Value& s, Args& a) -> Value { return affix(s, a, false); }},
      {"split",
       [](const Value& s, Args& a) -> Value {
         Binder b("split", a, {"sep", "maxsplit"});
         return split(s.str(), b[0], b.get(1, int64_t{-1}).as_int());
       }},
      {"replace",
       [](const Value& s, Args& a) -> Value {
         Binder b("replace", a, {"old", "new", "count"});
         return replace(s.str(), str_arg(b[0], "replace"), str_arg(b[1], "replace"),
                        b.get(2, int64_t{-1}).as_int());
       }},
      {"format", [](const Value& s, Args& a) -> Value { return brace_format(s.str(), a); }},
      {"join",
       [](const Value& s, Args& a) -> Value {
         Binder b("join", a, {"iterable"});
         std::string out;
         bool first = true;
         for (const auto& x : iterate(b[0])) {
           if (!first) out += s.str();
           out += str_arg(x, "join");
           first = false;
         }
         return out;
       }},
      {"find",
       [](const Value& s, Args& a) -> Value {
         Binder b("find", a, {"sub"});
         const size_t k = s.str().find(str_arg(b[0], "find"));
         return k == std::string::npos
                    ? int64_t{-1}
                    : static_cast<int64_t>(uni::char_count(s.str().substr(0, k)));
       }},
      {"count",
       [](const Value& s, Args& a) -> Value {
         Binder b("count", a, {"sub"});
         const std::string& sub = str_arg(b[0], "count");
         if (sub.empty()) return static_cast<int64_t>(uni::char_count(s.str()) + 1);
         int64_t n = 0;
         for (size_t k = s.str().find(sub); k != std::string::npos;
              k = s.str().find(sub, k + sub.size()))
           ++n;
         return n;
       }},
      {"isdigit",
       [](const Value& s, Args& a) -> Value {
         Binder("isdigit", a, {});
         return !s.str().empty() && std::all_of(s.str().begin(), s.str().end(), ::isdigit);
       }},
      {"isspace",
       [](const Value& s, Args& a) -> Value {
         Binder("isspace", a, {});
         return !s.str().empty() && uni::strip(s.str(), std::nullopt, true, false).empty();
       }},
  };
  for (const auto& [n, fn] : kMethods) {
    if (n == name) return bound(self, name, fn);
  }
  return std::nullopt;
}

List pairs(const Dict& d) {
  List out;
  for (const auto& [k, v] : d.items) out.push_back(Value::tuple({Value(k), v}));
  return out;
}

std::optional<Value> dict_method(const Value& self, std::string_view name) {
  using F = Value (*)(const Value&, Args&);
  static const std::pair<std::string_view, F> kMethods[] = {
      {"get",
       [](const Value& d, Args& a) -> Value {
         Binder b("get", a, {"key", "default"});
         const Value* v = b[0].is_string() ? d.dict().find(b[0].str()) : nullptr;
         return v ? *v : b.get(1, nullptr);
       }},
      {"items",
       [](const Value& d, Args& a) -> Value {
         Binder("items", a, {});
         return pairs(d.dict());
       }},
      {"keys",
       [](const Value& d, Args& a) -> Value {
         Binder("keys", a, {});
         return iterate(d);
       }},
      {"values",
       [](const Value& d, Args& a) -> Value {
         Binder("values", a, {});
         List out;
         for (const auto& [_, v] : d.dict().items) out.push_back(v);
         return out;
       }},
  };
  for (const auto& [n, fn] : kMethods) {
    if (n == name) return bound(self, name, fn);
  }
  static constexpr std::string_view kMutators[] = {"pop", "popitem", "update", "setdefault",
                                                   "clear"};
  if (std::find(std::begin(kMutators), std::end(kMutators), name) != std::end(kMutators)) {
    value_error(fmt::format(
        "the dict method {}() would modify a value; templates may only read their values", name));
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> method(const Value& obj, std::string_view name) {
  if (obj.is_string()) return str_method(obj, name);
  if (obj.is_dict() && !obj.dict().is_namespace) return dict_method(obj, name);
  if (obj.is_list()) {
    static constexpr std::string_view kMutators[] = {"append", "extend", "insert", "pop",
                                                     "remove", "clear",  "sort",   "reverse"};
    if (std::find(std::begin(kMutators), std::end(kMutators), name) != std::end(kMutators)) {
      value_error(fmt::format(
          "the list method {}() would modify a value; templates may only read their values", name));
    }
  }
  return std::nullopt;
}

}  // namespace exl3::jinja
