// End-of-sequence ids of a model folder (see stop_tokens.hpp).
#include "exl3/text/stop_tokens.hpp"

#include <set>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3 {

std::vector<int32_t> generation_config_eos(const std::filesystem::path& dir) {
  const auto path = dir / "generation_config.json";
  std::vector<int32_t> out;
  if (!std::filesystem::exists(path)) return out;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON ({})", path.string(), e.what());
  }
  if (!j.is_object()) fail("{}: expected a JSON object", path.string());
  const auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return out;
  auto one = [&](const nlohmann::json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      fail("{}: key 'eos_token_id': expected a token id or a list of them, got {}", path.string(),
           it->dump());
    }
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  };
  if (it->is_array()) {
    for (const auto& v : *it) one(v);
  } else {
    one(*it);
  }
  return out;
}

std::vector<int32_t> model_stop_tokens(const std::filesystem::path& dir,
                                       std::span<const int32_t> config_eos,
                                       const Tokenizer& tokenizer) {
  std::set<int32_t> stops(config_eos.begin(), config_eos.end());
  for (const int32_t id : generation_config_eos(dir)) stops.insert(id);
  if (const auto eos = tokenizer.eos_id()) stops.insert(*eos);
  return {stops.begin(), stops.end()};
}

}  // namespace exl3
