// Writes the seed corpora for the fuzz targets: small valid safetensors files that reach deep
// into the parsers (every dtype, metadata, each EXL3 linear variant).
// Usage: make_fuzz_seeds <corpus-root>; writes <root>/fuzz_safetensors_header/*.safetensors and
// <root>/fuzz_checkpoint_discovery/*.safetensors. The committed fuzz/corpus/ came from this.
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/codebook.hpp"

namespace {

using exl3::DType;

std::vector<std::byte> filled(DType d, size_t numel, uint64_t value) {
  const size_t es = exl3::dtype_size(d);
  std::vector<std::byte> b(numel * es);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<std::byte>((value >> (8 * (i % es))) & 0xFF);
  return b;
}

void add(exl3::SafetensorsWriter& w, const std::string& name, DType d, std::vector<int64_t> shape,
         uint64_t value) {
  size_t n = 1;
  for (const int64_t s : shape) n *= static_cast<size_t>(s);
  const auto b = filled(d, n, value);
  w.add(name, d, std::move(shape), std::span<const std::byte>(b));
}

// Smallest legal linear: in = out = 128, K = 1 (trellis [8, 8, 16]).
void add_linear(exl3::SafetensorsWriter& w, const std::string& p, const char* marker, bool legacy,
                bool bias) {
  add(w, p + ".trellis", DType::kI16, {8, 8, 16}, 0xA5C3);
  if (legacy) {
    add(w, p + ".su", DType::kI16, {8}, 0x00F0);
    add(w, p + ".sv", DType::kI16, {8}, 0x0F0F);
  } else {
    add(w, p + ".suh", DType::kF16, {128}, 0x3C00);
    add(w, p + ".svh", DType::kF16, {128}, 0xB800);
  }
  if (std::string(marker) == "mcg")
    add(w, p + ".mcg", DType::kI32, {}, static_cast<uint32_t>(exl3::trellis::kMcgMarker));
  if (std::string(marker) == "mul1")
    add(w, p + ".mul1", DType::kI32, {}, static_cast<uint32_t>(exl3::trellis::kMul1Marker));
  if (bias) add(w, p + ".bias", DType::kF32, {128}, 0x3F800000);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-root>\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  const fs::path root(argv[1]);
  const fs::path hdr = root / "fuzz_safetensors_header", disc = root / "fuzz_checkpoint_discovery";
  fs::create_directories(hdr);
  fs::create_directories(disc);
  try {
    {
      exl3::SafetensorsWriter w;
      exl3::write_file_atomic(hdr / "empty.safetensors", w.serialize());
    }
    {
      exl3::SafetensorsWriter w;
      w.set_metadata("format", "pt");
      const DType all[] = {DType::kBool, DType::kU8,  DType::kI8,     DType::kI16,
                           DType::kI32,  DType::kI64, DType::kF16,    DType::kBF16,
                           DType::kF32,  DType::kF64, DType::kF8E4M3, DType::kF8E5M2};
      int i = 0;
      for (const DType d : all) add(w, "t" + std::to_string(i++), d, {2, 1}, 0x11);
      add(w, "zero", DType::kF32, {0, 4}, 0);
      add(w, "scalar", DType::kI32, {}, 7);
      exl3::write_file_atomic(hdr / "all_dtypes.safetensors", w.serialize());
    }
    const struct {
      const char* file;
      const char* marker;
      bool legacy, bias;
    } linears[] = {{"mcg", "mcg", false, false},
                   {"mul1_bias", "mul1", false, true},
                   {"legacy_3inst", "", true, false}};
    for (const auto& l : linears) {
      exl3::SafetensorsWriter w;
      add_linear(w, "model.layers.0.mlp.experts.1.up_proj", l.marker, l.legacy, l.bias);
      add(w, "model.embed_tokens.weight", DType::kBF16, {4, 2}, 0x3F80);
      add(w, "model.layers.0.mlp.gate.weight", DType::kF16, {2, 2}, 0x3C00);
      add(w, "model.norm.weight", DType::kBF16, {2}, 0x3F80);
      exl3::write_file_atomic(disc / (std::string(l.file) + ".safetensors"), w.serialize());
    }
  } catch (const exl3::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
