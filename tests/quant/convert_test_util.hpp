// Helpers shared by the conversion tests (convert_test.cpp, dense_format_test.cpp): error
// expectations and in-place edits of a synthetic source model.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3::test {

// Expects fn() to throw exl3::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exl3::Error thrown; expected one mentioning '" << parts.front() << "'";
  } catch (const exl3::Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// Rewrites dir/model.safetensors through `edit` (return false to drop a tensor).
using ModelEdit =
    std::function<bool(const std::string&, exl3::DType&, std::vector<int64_t>&, std::vector<std::byte>&)>;
inline void rewrite_model(const std::filesystem::path& dir, const ModelEdit& edit) {
  exl3::SafetensorsWriter w;
  {
    const auto store = exl3::TensorStore::open(dir);
    for (const auto& name : store.names()) {
      const auto& ref = store.at(name);
      exl3::DType dt = ref.info->dtype;
      std::vector<int64_t> shape = ref.info->shape;
      std::vector<std::byte> data(ref.bytes().begin(), ref.bytes().end());
      if (edit(name, dt, shape, data)) w.add(name, dt, shape, std::span<const std::byte>(data));
    }
  }
  w.write(dir / "model.safetensors");
}

}  // namespace exl3::test
