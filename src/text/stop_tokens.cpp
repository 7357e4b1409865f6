// End-of-sequence ids of a model folder (see stop_tokens.hpp).
#include "exl3/text/stop_tokens.hpp"

#include <set>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/config_keys.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3 {

std::vector<int32_t> generation_config_eos(const std::filesystem::path& dir) {
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return {};
  const std::string label = path.string();
  const auto j = parse_json_object(read_text_file(path), label);
  return ConfigKeys(j, label).ids("eos_token_id");
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
