// Python semantics of template values: truth, equality, ordering, str(), repr() and json.dumps.
#include "value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

namespace exl3::jinja {

void value_error(std::string message) {
  throw ValueError{std::move(message)};
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(std::string key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(v));
}

int64_t Value::as_int() const {
  if (is_bool()) return static_cast<int64_t>(std::get<bool>(data));
  if (!is_int()) value_error(fmt::format("an integer is required, got {}", type_name(*this)));
  return std::get<int64_t>(data);
}

double Value::as_float() const {
  if (is_float()) return std::get<double>(data);
  if (!is_int() && !is_bool())
    value_error(fmt::format("a number is required, got {}", type_name(*this)));
  return static_cast<double>(as_int());
}

Value make_dict(std::vector<std::pair<std::string, Value>> items) {
  auto d = std::make_shared<Dict>();
  d->items = std::move(items);
  return Value(std::move(d));
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > 256) value_error("the template's input is nested more than 256 levels deep");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return nullptr;
    case nlohmann::ordered_json::value_t::boolean:
      return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer:
      return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return static_cast<double>(u);
      return static_cast<int64_t>(u);
    }
    case nlohmann::ordered_json::value_t::number_float:
      return j.get<double>();
    case nlohmann::ordered_json::value_t::string:
      return j.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e, depth + 1));
      return l;
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      for (const auto& [k, v] : j.items()) items.emplace_back(k, from_json(v, depth + 1));
      return make_dict(std::move(items));
    }
    default:
      value_error(fmt::format("a {} value cannot be passed to a template", j.type_name()));
  }
}

std::string type_name(const Value& v) {
  if (v.is_undefined()) return "undefined";
  if (v.is_none()) return "NoneType";
  if (v.is_bool()) return "bool";
  if (v.is_int()) return "int";
  if (v.is_float()) return "float";
  if (v.is_string()) return "str";
  if (v.is_list()) return "list";
  if (v.is_dict()) return v.dict().is_namespace ? "Namespace" : "dict";
  return "function";
}

bool truthy(const Value& v) {
  if (v.is_undefined() || v.is_none()) return false;
  if (v.is_bool() || v.is_int()) return v.as_int() != 0;
  if (v.is_float()) return v.as_float() != 0.0;
  if (v.is_string()) return !v.str().empty();
  if (v.is_list()) return !v.list().empty();
  if (v.is_dict()) return v.dict().is_namespace || !v.dict().items.empty();
  return true;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() == b.str();
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list(), &y = b.list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!equal(x[i], y[i])) return false;
    }
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const auto &x = a.dict(), &y = b.dict();
    if (&x == &y) return true;
    if (x.is_namespace || y.is_namespace || x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* w = y.find(k);
      if (!w || !equal(v, *w)) return false;
    }
    return true;
  }
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_callable() && b.is_callable()) return &a.callable() == &b.callable();
  return false;
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  // UTF-8 byte order is code-point order, which is Python's str order.
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  value_error(fmt::format("'<' is not supported between instances of '{}' and '{}'", type_name(a),
                          type_name(b)));
}

namespace {

// Python's float repr: the shortest digits that round-trip, positional for exponents in
// [-4, 16), else scientific with a signed two-digit exponent.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      const auto int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  return out;
}

std::string str_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out + q;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (u < 0x20) {
          out += fmt::format("\\u{:04x}", u);
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void json_dump(const Value& v, const JsonStyle& st, int depth, std::string& out) {
  const bool pretty = st.indent >= 0 || !st.indent_text.empty();
  const std::string item_sep = !st.item_sep.empty() ? st.item_sep : pretty ? "," : ", ";
  const std::string key_sep = !st.key_sep.empty() ? st.key_sep : ": ";
  const std::string unit = !st.indent_text.empty()
                               ? st.indent_text
                               : std::string(static_cast<size_t>(std::max(st.indent, 0)), ' ');
  auto newline = [&](int d) {
    out += '\n';
    for (int i = 0; i < d; ++i) out += unit;
  };
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_int() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_float();
    out += std::isnan(d)   ? "NaN"
           : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity")
                           : float_repr(d);
  } else if (v.is_string()) {
    json_string(v.str(), out);
  } else if (v.is_list()) {
    const auto& l = v.list();
    if (l.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i > 0) out += item_sep;
      if (pretty) newline(depth + 1);
      json_dump(l[i], st, depth + 1, out);
    }
    if (pretty) newline(depth);
    out += ']';
  } else if (v.is_dict() && !v.dict().is_namespace) {
    auto items = v.dict().items;
    if (items.empty()) {
      out += "{}";
      return;
    }
    if (st.sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += item_sep;
      if (pretty) newline(depth + 1);
      json_string(items[i].first, out);
      out += key_sep;
      json_dump(items[i].second, st, depth + 1, out);
    }
    if (pretty) newline(depth);
    out += '}';
  } else {
    value_error(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

}  // namespace

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_string()) return v.str();
  return repr(v);
}

std::string repr(const Value& v) {
  if (v.is_undefined()) return "Undefined";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_int() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_float());
  if (v.is_string()) return str_repr(v.str());
  if (v.is_list()) {
    std::string out = v.is_tuple ? "(" : "[";
    for (size_t i = 0; i < v.list().size(); ++i) {
      if (i > 0) out += ", ";
      out += repr(v.list()[i]);
    }
    if (v.is_tuple && v.list().size() == 1) out += ",";
    return out + (v.is_tuple ? ")" : "]");
  }
  if (v.is_dict()) {
    const auto& d = v.dict();
    std::string out = d.is_namespace ? "<Namespace {" : "{";
    for (size_t i = 0; i < d.items.size(); ++i) {
      if (i > 0) out += ", ";
      out += str_repr(d.items[i].first) + ": " + repr(d.items[i].second);
    }
    return out + (d.is_namespace ? "}>" : "}");
  }
  return "<function " + v.callable().name + ">";
}

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_dump(v, style, 0, out);
  return out;
}

}  // namespace exl3::jinja
