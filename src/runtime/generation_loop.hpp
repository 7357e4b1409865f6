// The pieces generate() and generate_speculative() share (internal; defined in generate.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "exl3/runtime/generate.hpp"

namespace exl3::runtime {

// Refuses, naming `what` ("generate", "speculative decoding"), an empty prompt and a negative
// max_new_tokens.
void check_generate_request(std::string_view what, std::span<const int32_t> prompt,
                            const GenerateOptions& opts);

// Takes one generated token into `r`: a stop token ends generation (stop_reason "stop_token",
// stop_token set, the token not added); any other is added and handed to on_token, whose false
// ends generation (stop_reason "callback"). Returns whether generation goes on.
bool emit_token(GenerateResult& r, int32_t tok, const GenerateOptions& opts,
                const std::function<bool(int32_t)>& on_token);

}  // namespace exl3::runtime
