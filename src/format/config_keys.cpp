// Typed config reads (see config_keys.hpp).
#include "exl3/format/config_keys.hpp"

#include <climits>
#include <cmath>

#include "exl3/error.hpp"

namespace exl3 {

using nlohmann::json;

json parse_json_object(std::string_view text, const std::string& label) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail("{}: invalid JSON ({})", label, e.what());
  }
  if (!j.is_object()) fail("{}: must be a JSON object", label);
  return j;
}

const json* ConfigKeys::get(const char* key) const {
  const auto it = j_.find(key);
  return (it == j_.end() || it->is_null()) ? nullptr : &*it;
}

int64_t ConfigKeys::integer(const char* key, std::optional<int64_t> def) const {
  const json* v = get(key);
  if (v == nullptr) {
    if (def) return *def;
    fail("{}: key '{}' is missing (a positive integer is required)", label_, key);
  }
  if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX) ||
      v->get<int64_t>() < 0) {
    fail("{}: key '{}': expected a non-negative integer, got {}", label_, key, v->dump());
  }
  const int64_t i = v->get<int64_t>();
  if (!def && i == 0) fail("{}: key '{}' is 0; a positive integer is required", label_, key);
  return i;
}

double ConfigKeys::number(const char* key, std::optional<double> def) const {
  const json* v = get(key);
  if (v == nullptr) {
    if (def) return *def;
    fail("{}: key '{}' is missing (a positive number is required)", label_, key);
  }
  if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() <= 0.0) {
    fail("{}: key '{}': expected a positive number, got {}", label_, key, v->dump());
  }
  return v->get<double>();
}

bool ConfigKeys::boolean(const char* key, bool def) const {
  const json* v = get(key);
  if (v == nullptr) return def;
  if (!v->is_boolean())
    fail("{}: key '{}': expected true or false, got {}", label_, key, v->dump());
  return v->get<bool>();
}

std::string ConfigKeys::string(const char* key, const std::string& def) const {
  const json* v = get(key);
  if (v == nullptr) return def;
  if (!v->is_string()) fail("{}: key '{}': expected a string, got {}", label_, key, v->dump());
  return v->get<std::string>();
}

std::vector<int32_t> ConfigKeys::ids(const char* key) const {
  const json* v = get(key);
  std::vector<int32_t> out;
  if (v == nullptr) return out;
  auto one = [&](const json& e) {
    if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > INT32_MAX) ||
        e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX) {
      fail("{}: key '{}': expected a token id or a list of them, got {}", label_, key, v->dump());
    }
    out.push_back(static_cast<int32_t>(e.get<int64_t>()));
  };
  if (v->is_array()) {
    for (const auto& e : *v) one(e);
  } else {
    one(*v);
  }
  return out;
}

std::vector<int64_t> ConfigKeys::int_list(const char* key) const {
  const json* v = get(key);
  std::vector<int64_t> out;
  if (v == nullptr) return out;
  if (!v->is_array())
    fail("{}: key '{}': expected a list of integers, got {}", label_, key, v->dump());
  for (const auto& e : *v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0) {
      fail("{}: key '{}': expected a list of non-negative integers, got {}", label_, key,
           v->dump());
    }
    out.push_back(e.get<int64_t>());
  }
  return out;
}

}  // namespace exl3
