// The end-of-sequence ids generation stops at, gathered from everywhere a Hugging Face model
// folder declares them: config.json's eos_token_id (the caller passes it:
// runtime::ModelSpec::eos_token_ids), generation_config.json's eos_token_id (a number or a list;
// often the only place a chat model lists its end-of-turn token) and the tokenizer's eos_token.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "exl3/text/tokenizer.hpp"

namespace exl3 {

// eos_token_id of `dir`/generation_config.json (empty when the file or the key is absent).
// Throws exl3::Error naming the file for invalid JSON or a value that is not a token id.
std::vector<int32_t> generation_config_eos(const std::filesystem::path& dir);

// The union of the three sources above, sorted, without duplicates.
// `config_eos`: config.json's eos_token_id, e.g. runtime::ModelSpec::eos_token_ids.
std::vector<int32_t> model_stop_tokens(const std::filesystem::path& dir,
                                       std::span<const int32_t> config_eos,
                                       const Tokenizer& tokenizer);

}  // namespace exl3
