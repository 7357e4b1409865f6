// The project's own bundled text (data/builtin_text.txt): a few KB of varied plain English, code,
// JSON, SQL and tables, written for exl3 (no third-party text). It is compiled into the library,
// so it works from any directory: `exl3 eval MODEL --text builtin` scores it, and calibrated
// quantization (`--calibration builtin`) feeds it through the model.
#pragma once

#include <string_view>

namespace exl3 {

// The name that selects the bundled text where a text file is expected ("builtin").
inline constexpr std::string_view kBuiltinTextName = "builtin";

// The bundled text (UTF-8, ~7 KB), exactly the bytes of data/builtin_text.txt at build time.
std::string_view builtin_text();

}  // namespace exl3
