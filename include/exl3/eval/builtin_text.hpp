// The project's own bundled texts, written for exl3 (no third-party text), compiled into the
// library so they work from any directory:
// - data/builtin_text.txt (~7 KB of varied plain English, code, JSON, SQL and tables): what
//   `exl3 eval MODEL --text builtin` scores;
// - data/calibration_text.txt (~50 KB): what calibrated quantization (`exl3 quantize
//   --calibration builtin`) feeds through the model. Narrative and dialogue, explanations and
//   guides, code in a dozen languages, fifteen natural languages, mathematics, chat turns and
//   tables, interleaved block by block so that the leading rows a calibration takes already mix
//   them. It shares no text with the evaluation text, so a calibrated model is never scored on
//   its own calibration data.
#pragma once

#include <string_view>

namespace exl3 {

// The name that selects a bundled text where a text file is expected ("builtin").
inline constexpr std::string_view kBuiltinTextName = "builtin";

// The bundled evaluation text (UTF-8), exactly the bytes of data/builtin_text.txt at build time.
std::string_view builtin_text();

// The bundled calibration text (UTF-8), exactly the bytes of data/calibration_text.txt.
std::string_view builtin_calibration_text();

}  // namespace exl3
