// Jinja2's built-in filters as chat templates use them, with transformers' tojson.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "builtins.hpp"
#include "unicode.hpp"

namespace exl3::jinja {

namespace {

using FilterFn = Value (*)(const Value&, Args&);

// Jinja's attribute getter for filter arguments: "a.b.0" is looked up item by item.
Value attr_path(const Value& v, const Value& path) {
  if (path.is_int()) return get_item(v, path);
  if (!path.is_string()) value_error("attribute must be a string or an integer");
  Value cur = v;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.str().find('.', pos);
    const std::string part = path.str().substr(pos, dot == std::string::npos ? dot : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? get_item(cur, int64_t{std::stoll(part)}) : get_item(cur, part);
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

// Sort / unique / dictsort compare strings case-insensitively unless case_sensitive is set.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(uni::lower(v.str())) : v;
}

Value length(const Value& v, Args& a) {
  Binder("length", a, {});
  if (v.is_string()) return static_cast<int64_t>(uni::char_count(v.str()));
  if (v.is_dict()) return static_cast<int64_t>(v.dict().items.size());
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_undefined()) return int64_t{0};
  value_error(fmt::format("object of type '{}' has no len()", type_name(v)));
}

std::string non_ascii_escaped(const std::string& s) {
  std::string out;
  size_t len = 0;
  for (size_t i = 0; i < s.size(); i += len) {
    const uint32_t cp = uni::decode_at(s, i, &len);
    if (cp < 0x80) {
      out += s[i];
    } else if (cp < 0x10000) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      const uint32_t u = cp - 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
    }
  }
  return out;
}

Value tojson(const Value& v, Args& a) {
  Binder b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle st;
  if (b.has(1) && !b[1].is_none()) {
    if (b[1].is_string()) {
      st.indent_text = b[1].str();
      if (st.indent_text.empty()) st.indent = 0;
    } else {
      st.indent = static_cast<int>(b[1].as_int());
    }
  }
  if (b.has(2) && !b[2].is_none()) {
    if (!b[2].is_list() || b[2].list().size() != 2 || !b[2].list()[0].is_string() ||
        !b[2].list()[1].is_string()) {
      value_error("tojson: separators must be a pair of strings");
    }
    st.item_sep = b[2].list()[0].str();
    st.key_sep = b[2].list()[1].str();
  }
  st.sort_keys = b.has(3) && truthy(b[3]);
  const std::string out = to_json(v, st);
  return b.has(0) && truthy(b[0]) ? non_ascii_escaped(out) : out;
}

Value default_(const Value& v, Args& a) {
  Binder b("default", a, {"default_value", "boolean"});
  const bool use = v.is_undefined() || (b.has(1) && truthy(b[1]) && !truthy(v));
  return use ? b.get(0, std::string()) : v;
}

Value join(const Value& v, Args& a) {
  Binder b("join", a, {"d", "attribute"});
  const std::string sep = b.has(0) ? to_str(b[0]) : "";
  std::string out;
  bool first = true;
  for (const auto& x : iterate(v)) {
    if (!first) out += sep;
    out += to_str(b.has(1) ? attr_path(x, b[1]) : x);
    first = false;
  }
  return out;
}

Value first_last(const Value& v, bool first) {
  const List items = iterate(v);
  if (items.empty())
    return Undefined{fmt::format("the sequence is empty (no {} item)", first ? "first" : "last")};
  return first ? items.front() : items.back();
}

Value to_int(const Value& v, Args& a) {
  Binder b("int", a, {"default", "base"});
  const Value fallback = b.get(0, int64_t{0});
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_float()) return static_cast<int64_t>(v.as_float());
  if (v.is_string()) {
    const std::string s = uni::strip(v.str(), std::nullopt, true, true);
    try {
      size_t used = 0;
      const int64_t i = std::stoll(s, &used, static_cast<int>(b.get(1, int64_t{10}).as_int()));
      if (used == s.size()) return i;
      const double d = std::stod(s, &used);
      if (used == s.size()) return static_cast<int64_t>(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value to_float(const Value& v, Args& a) {
  Binder b("float", a, {"default"});
  if (v.is_number()) return v.as_float();
  if (v.is_string()) {
    const std::string s = uni::strip(v.str(), std::nullopt, true, true);
    try {
      size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (const std::exception&) {
    }
  }
  return b.get(0, 0.0);
}

Value replace(const Value& v, Args& a) {
  Binder b("replace", a, {"old", "new", "count"});
  Args m;
  m.pos = {b[0], b[1]};
  if (b.has(2) && !b[2].is_none()) m.pos.push_back(b[2]);
  return method(Value(to_str(v)), "replace")->callable().fn(m);
}

// select / reject / selectattr / rejectattr: keep the items whose test (truthiness when none is
// named) equals `keep`.
Value select(const Value& v, Args& a, bool by_attr, bool keep) {
  Args rest;
  size_t k = 0;
  Value attr;
  if (by_attr) {
    if (a.pos.empty()) value_error("selectattr / rejectattr need an attribute name");
    attr = a.pos[k++];
  }
  std::string test;
  if (k < a.pos.size()) {
    if (!a.pos[k].is_string()) value_error("the test name must be a string");
    test = a.pos[k++].str();
    if (!is_test(test)) value_error(fmt::format("unknown test '{}'", test));
  }
  rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k), a.pos.end());
  rest.kw = a.kw;
  List out;
  for (const auto& x : iterate(v)) {
    const Value subject = by_attr ? attr_path(x, attr) : x;
    Args args = rest;
    const bool pass = test.empty() ? truthy(subject) : apply_test(test, subject, args);
    if (pass == keep) out.push_back(x);
  }
  return out;
}

Value map(const Value& v, Args& a) {
  List out;
  if (a.pos.empty()) {
    Binder b("map", a, {"attribute", "default"});
    if (!b.has(0)) value_error("map() needs an attribute= or a filter name");
    for (const auto& x : iterate(v)) {
      Value r = attr_path(x, b[0]);
      out.push_back(r.is_undefined() && b.has(1) ? b[1] : r);
    }
    return out;
  }
  if (!a.pos[0].is_string() || !is_filter(a.pos[0].str()))
    value_error("map(): unknown filter " + repr(a.pos[0]));
  const std::string name = a.pos[0].str();
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const auto& x : iterate(v)) {
    Args args = rest;
    out.push_back(apply_filter(name, x, args));
  }
  return out;
}

Value sort(const Value& v, Args& a) {
  Binder b("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool rev = b.has(0) && truthy(b[0]), cs = b.has(1) && truthy(b[1]);
  List items = iterate(v);
  auto key = [&](const Value& x) { return sort_key(b.has(2) ? attr_path(x, b[2]) : x, cs); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return rev ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return items;
}

Value dictsort(const Value& v, Args& a) {
  Binder b("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) value_error("dictsort needs a dict");
  const bool cs = b.has(0) && truthy(b[0]), rev = b.has(2) && truthy(b[2]);
  const std::string by = b.has(1) ? to_str(b[1]) : "key";
  if (by != "key" && by != "value") value_error("dictsort: 'by' must be 'key' or 'value'");
  const size_t pos = by == "key" ? 0 : 1;
  List items;
  for (const auto& [k, x] : v.dict().items) items.push_back(Value::tuple({Value(k), x}));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(x.list()[pos], cs), ky = sort_key(y.list()[pos], cs);
    return rev ? less(ky, kx) : less(kx, ky);
  });
  return items;
}

Value unique(const Value& v, Args& a) {
  Binder b("unique", a, {"case_sensitive", "attribute"});
  const bool cs = b.has(0) && truthy(b[0]);
  List out, seen;
  for (const auto& x : iterate(v)) {
    const Value k = sort_key(b.has(1) ? attr_path(x, b[1]) : x, cs);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); })) {
      seen.push_back(k);
      out.push_back(x);
    }
  }
  return out;
}

Value reverse(const Value& v, Args& a) {
  Binder("reverse", a, {});
  if (v.is_string()) {
    const List chars = iterate(v);
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->str();
    return out;
  }
  List items = iterate(v);
  std::reverse(items.begin(), items.end());
  return items;
}

Value indent(const Value& v, Args& a) {
  Binder b("indent", a, {"width", "first", "blank"});
  const std::string pad =
      b.has(0) && b[0].is_string()
          ? b[0].str()
          : std::string(static_cast<size_t>(b.get(0, int64_t{4}).as_int()), ' ');
  const bool first = b.has(1) && truthy(b[1]), blank = b.has(2) && truthy(b[2]);
  // Jinja appends a newline first, then splits into lines (str.splitlines).
  const std::string s = to_str(v) + "\n";
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  return first ? pad + out : out;
}

// Jinja's title filter: the text splits into words and runs of white space, '-', '(', '{', '['
// or '<'; each word becomes word[0].upper() + word[1:].lower().
Value title(const Value& v, Args& a) {
  Binder("title", a, {});
  const std::string s = to_str(v);
  std::string out;
  size_t len = 0, word = std::string::npos;
  auto flush = [&](size_t end) {
    if (word == std::string::npos) return;
    size_t first = 0;
    uni::decode_at(s, word, &first);
    out += uni::upper(std::string_view(s).substr(word, first));
    out += uni::lower(std::string_view(s).substr(word + first, end - word - first));
    word = std::string::npos;
  };
  for (size_t i = 0; i < s.size(); i += len) {
    const uint32_t cp = uni::decode_at(s, i, &len);
    const bool sep =
        uni::is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (sep) {
      flush(i);
      out += std::string_view(s).substr(i, len);
    } else if (word == std::string::npos) {
      word = i;
    }
  }
  flush(s.size());
  return out;
}

Value round(const Value& v, Args& a) {
  Binder b("round", a, {"precision", "method"});
  if (!v.is_number()) value_error(fmt::format("round needs a number, got {}", type_name(v)));
  const int64_t p = b.get(0, int64_t{0}).as_int();
  const std::string m = b.has(1) ? to_str(b[1]) : "common";
  const double scale = std::pow(10.0, static_cast<double>(p));
  const double x = v.as_float() * scale;
  double r = 0;
  if (m == "common") {
    r = std::nearbyint(x);  // Python's round: halves to even
  } else if (m == "floor") {
    r = std::floor(x);
  } else if (m == "ceil") {
    r = std::ceil(x);
  } else {
    value_error("round: method must be 'common', 'ceil' or 'floor'");
  }
  return r / scale;
}

Value escape(const Value& v, Args& a) {
  Binder("escape", a, {});
  std::string out;
  for (const char c : to_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value sum(const Value& v, Args& a) {
  Binder b("sum", a, {"attribute", "start"});
  Value total = b.get(1, int64_t{0});
  for (const auto& x : iterate(v)) {
    const Value y = b.has(0) ? attr_path(x, b[0]) : x;
    if (!total.is_number() || !y.is_number()) value_error("sum needs numbers");
    total = total.is_float() || y.is_float() ? Value(total.as_float() + y.as_float())
                                             : Value(total.as_int() + y.as_int());
  }
  return total;
}

Value min_max(const Value& v, Args& a, bool max) {
  Binder b(max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const bool cs = b.has(0) && truthy(b[0]);
  const List items = iterate(v);
  if (items.empty()) return Undefined{"the sequence is empty"};
  const Value* best = &items[0];
  auto key = [&](const Value& x) { return sort_key(b.has(1) ? attr_path(x, b[1]) : x, cs); };
  for (const auto& x : items) {
    if (max ? less(key(*best), key(x)) : less(key(x), key(*best))) best = &x;
  }
  return *best;
}

const std::pair<std::string_view, FilterFn> kFilters[] = {
    {"abs",
     [](const Value& v, Args& a) -> Value {
       Binder("abs", a, {});
       if (v.is_float()) return std::fabs(v.as_float());
       if (v.is_int() || v.is_bool()) return v.as_int() < 0 ? -v.as_int() : v.as_int();
       value_error(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
     }},
    {"attr",
     [](const Value& v, Args& a) -> Value {
       Binder b("attr", a, {"name"});
       return get_attr(v, to_str(b[0]));
     }},
    {"capitalize",
     [](const Value& v, Args& a) -> Value {
       Binder("capitalize", a, {});
       return uni::capitalize(to_str(v));
     }},
    {"count", length},
    {"d", default_},
    {"default", default_},
    {"dictsort", dictsort},
    {"e", escape},
    {"escape", escape},
    {"first",
     [](const Value& v, Args& a) -> Value {
       Binder("first", a, {});
       return first_last(v, true);
     }},
    {"float", to_float},
    {"format",
     [](const Value& v, Args& a) -> Value {
       if (!a.kw.empty()) value_error("format: keyword arguments are not supported");
       return percent_format(to_str(v), Value(a.pos));
     }},
    {"indent", indent},
    {"int", to_int},
    {"items",
     [](const Value& v, Args& a) -> Value {
       Binder("items", a, {});
       if (v.is_undefined()) return List{};
       if (!v.is_dict()) value_error(fmt::format("items needs a dict, got {}", type_name(v)));
       return method(v, "items")->callable().fn(a);
     }},
    {"join", join},
    {"last",
     [](const Value& v, Args& a) -> Value {
       Binder("last", a, {});
       return first_last(v, false);
     }},
    {"length", length},
    {"list",
     [](const Value& v, Args& a) -> Value {
       Binder("list", a, {});
       return iterate(v);
     }},
    {"lower",
     [](const Value& v, Args& a) -> Value {
       Binder("lower", a, {});
       return uni::lower(to_str(v));
     }},
    {"map", map},
    {"max", [](const Value& v, Args& a) { return min_max(v, a, true); }},
    {"min", [](const Value& v, Args& a) { return min_max(v, a, false); }},
    {"reject", [](const Value& v, Args& a) { return select(v, a, false, false); }},
    {"rejectattr", [](const Value& v, Args& a) { return select(v, a, true, false); }},
    {"replace", replace},
    {"reverse", reverse},
    {"round", round},
    {"safe",
     [](const Value& v, Args& a) -> Value {
       Binder("safe", a, {});
       return v;
     }},
    {"select", [](const Value& v, Args& a) { return select(v, a, false, true); }},
    {"selectattr", [](const Value& v, Args& a) { return select(v, a, true, true); }},
    {"sort", sort},
    {"string",
     [](const Value& v, Args& a) -> Value {
       Binder("string", a, {});
       return to_str(v);
     }},
    {"sum", sum},
    {"title", title},
    {"tojson", tojson},
    {"trim",
     [](const Value& v, Args& a) -> Value {
       Binder b("trim", a, {"chars"});
       std::optional<std::string> chars;
       if (b.has(0) && !b[0].is_none()) chars = to_str(b[0]);
       return uni::strip(to_str(v), chars, true, true);
     }},
    {"unique", unique},
    {"upper",
     [](const Value& v, Args& a) -> Value {
       Binder("upper", a, {});
       return uni::upper(to_str(v));
     }},
};

}  // namespace

bool is_filter(std::string_view name) {
  return std::any_of(std::begin(kFilters), std::end(kFilters),
                     [&](const auto& f) { return f.first == name; });
}

Value apply_filter(std::string_view name, const Value& subject, Args& args) {
  for (const auto& [n, fn] : kFilters) {
    if (n == name) return fn(subject, args);
  }
  value_error(fmt::format("unknown filter '{}'", name));
}

}  // namespace exl3::jinja
