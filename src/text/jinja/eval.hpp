// Runs a parsed template over a context (see exl3/text/jinja.hpp for the contract).
#pragma once

#include <ctime>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ast.hpp"

namespace exl3::jinja {

std::string evaluate(const Program& program, const std::string& name,
                     const nlohmann::ordered_json& context, std::optional<std::time_t> now);

}  // namespace exl3::jinja
