// libFuzzer target: an arbitrary in-memory safetensors file through the whole read path —
// header validation, store, EXL3 discovery, and loading every linear and floating tensor found.
// Any outcome other than success or exl3::Error is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> bytes(size);
  if (size > 0) std::memcpy(bytes.data(), data, size);
  try {
    const auto file = exl3::SafetensorsFile::from_bytes(std::move(bytes), "fuzz.safetensors");
    const auto store = exl3::TensorStore::from_files({file}, "fuzz");
    const auto found = exl3::discover_tensors(store);
    for (const auto& info : found.linears) {
      const auto d = exl3::Exl3LinearData::load(store, info);
      // Touch the ends of every buffer so ASan sees any size mistake.
      const auto tr = d.trellis();
      if (tr.size() !=
          static_cast<size_t>(info.in_features / 16 * (info.out_features / 16) * 16 * info.bits))
        std::abort();
      volatile uint16_t sink = tr.front() ^ tr.back() ^ d.suh().back() ^ d.svh().back();
      (void)sink;
      if (d.suh().size() != static_cast<size_t>(info.in_features)) std::abort();
    }
    for (const auto& p : found.plain) {
      try {
        (void)exl3::read_as_double(store.at(p.name));
      } catch (const exl3::Error&) {  // non-floating dtypes are refused by design
      }
    }
  } catch (const exl3::Error&) {
  }
  return 0;
}
