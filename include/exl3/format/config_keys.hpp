// Typed reads of a Hugging Face JSON config (config.json, generation_config.json, ...), every
// error naming the file and the key. `null` counts as absent, as HF writes it for unset keys.
// The one reader of config values: the format layer's ModelConfig, the runtime's model
// description and the stop-token lookup all go through it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace exl3 {

// Parses JSON text that must be an object; `label` names the file in errors.
nlohmann::json parse_json_object(std::string_view text, const std::string& label);

class ConfigKeys {
 public:
  // `j` and `label` must outlive the reader.
  ConfigKeys(const nlohmann::json& j, const std::string& label) : j_(j), label_(label) {}

  // The value, or nullptr when absent or null.
  const nlohmann::json* get(const char* key) const;
  bool has(const char* key) const { return get(key) != nullptr; }
  // A non-negative integer; `def` when absent; required and > 0 when def is nullopt.
  int64_t integer(const char* key, std::optional<int64_t> def = std::nullopt) const;
  // A finite number > 0; `def` when absent; required when def is nullopt.
  double number(const char* key, std::optional<double> def = std::nullopt) const;
  bool boolean(const char* key, bool def) const;
  std::string string(const char* key, const std::string& def) const;
  // A token id or a list of them (0 .. 2^31 - 1); empty when absent.
  std::vector<int32_t> ids(const char* key) const;
  // A list of non-negative integers; empty when absent.
  std::vector<int64_t> int_list(const char* key) const;

  const std::string& label() const { return label_; }

 private:
  const nlohmann::json& j_;
  const std::string& label_;
};

}  // namespace exl3
