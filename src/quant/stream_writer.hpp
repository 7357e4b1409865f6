// A safetensors writer that streams tensor data to disk instead of building the file in memory,
// so a converter can write multi-GiB shards (and copy multi-GiB embeddings) with a few MiB of
// buffer. The layout is byte-identical to exl3::SafetensorsWriter's: tensors ordered by element
// size (largest first) then name, the JSON header (keys sorted) padded with spaces to 8 bytes.
// The file is written to a temp name, fsynced and renamed into place, so it is never half there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "exl3/format/dtype.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3::quant::detail {

// Receives the next bytes of the tensor being written.
using ByteSink = std::function<void(std::span<const std::byte>)>;

struct StreamEntry {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  // Must hand exactly nbytes to the sink, in order, in any number of pieces.
  std::function<void(const ByteSink&)> produce;
};

// Entry whose data is an in-memory span (copied out while writing; must outlive the call).
StreamEntry span_entry(std::string name, DType dtype, std::vector<int64_t> shape,
                       std::span<const std::byte> data);

// Writes the file atomically; throws exl3::Error naming the path and tensor on failure.
void write_safetensors_streaming(const std::filesystem::path& path, std::vector<StreamEntry> entries,
                                 const std::map<std::string, std::string>& metadata);

// The header of a safetensors file read with pread (no mmap, so reading it adds nothing to RSS).
struct StagedFile {
  std::filesystem::path path;
  SafetensorsHeader header;
};
StagedFile read_staged_header(const std::filesystem::path& path);

// Entry that copies one tensor of a staged file with pread in bounded chunks.
StreamEntry staged_entry(const StagedFile& file, const TensorInfo& tensor);

// Drops the pages of a read-only file mapping that a streaming pass has finished with, so a
// long conversion's RSS does not grow with the source model (the kernel re-reads on demand).
void release_pages(std::span<const std::byte> bytes);

}  // namespace exl3::quant::detail
