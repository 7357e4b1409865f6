// Shared by the tokenizer tests: where the golden data lives.
#pragma once

#include <filesystem>

namespace exl3::test {

// tests/text/data in the source tree (golden ids, the trained qwen2_style / llama3_style
// tokenizers).
inline std::filesystem::path tokenizer_data_dir() {
  return std::filesystem::path(EXL3_SOURCE_DIR) / "tests" / "text" / "data";
}

}  // namespace exl3::test
