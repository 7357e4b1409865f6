// Helpers for the format tests: tensors built in memory, files written with SafetensorsWriter or
// byte by byte, and capturing the exl3::Error message of a call that must fail.
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "test_support.hpp"

namespace exl3::test {

struct TestTensor {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};
using TensorMap = std::map<std::string, TestTensor>;

inline size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (const int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// Every element set to `value` (its low dtype_size bytes, little-endian).
inline TestTensor filled(DType dtype, std::vector<int64_t> shape, uint64_t value = 0) {
  TestTensor t{dtype, std::move(shape), {}};
  const size_t es = dtype_size(dtype);
  t.data.resize(numel_of(t.shape) * es);
  for (size_t i = 0; i < t.data.size(); ++i)
    t.data[i] = static_cast<std::byte>((value >> (8 * (i % es))) & 0xFF);
  return t;
}

inline std::string serialize(const TensorMap& m,
                             const std::map<std::string, std::string>& meta = {}) {
  SafetensorsWriter w;
  for (const auto& [name, t] : m) w.add(name, t.dtype, t.shape, std::span<const std::byte>(t.data));
  for (const auto& [k, v] : meta) w.set_metadata(k, v);
  return w.serialize();
}

inline void write_tensors(const std::filesystem::path& p, const TensorMap& m) {
  SafetensorsWriter w;
  for (const auto& [name, t] : m) w.add(name, t.dtype, t.shape, std::span<const std::byte>(t.data));
  w.write(p);
}

// A file with a hand-written JSON header and `data_bytes` zero bytes after it.
inline std::string raw_file(const std::string& header, size_t data_bytes = 0) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(n & 0xFF);
  return out + header + std::string(data_bytes, '\0');
}

}  // namespace exl3::test
