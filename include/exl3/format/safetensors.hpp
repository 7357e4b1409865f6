// Safetensors: zero-copy reader over mmap, sharded stores, and an atomic writer.
//
// File layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data
// section. The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data section) plus an optional "__metadata__" string->string map.
//
// The reader validates everything before handing out a byte: header length within the file and
// <= 100 MiB, valid UTF-8 JSON object, known dtypes, non-negative shapes, numel * dtype size ==
// end - begin, ranges inside the data section, no two tensors overlapping. Every error names the
// file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "exl3/format/dtype.hpp"

namespace exl3 {

inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;  // 100 MiB

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range inside the data section
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  int rank() const { return static_cast<int>(shape.size()); }
};

// The parsed, validated header of one safetensors file.
struct SafetensorsHeader {
  uint64_t header_len = 0;  // N
  uint64_t data_begin = 0;  // 8 + N
  std::vector<TensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
};

// Parses and validates a header from the first bytes of a file whose total size is `file_size`.
// `bytes` must hold at least the first min(file_size, 8 + N) bytes. `label` (usually the path)
// prefixes every error message. Throws exl3::Error.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> bytes, uint64_t file_size,
                                           const std::string& label);

// One memory-mapped safetensors file. Immutable after open; safe to share across threads.
class SafetensorsFile {
 public:
  // Maps the file read-only and validates its header. Throws exl3::Error.
  static std::shared_ptr<const SafetensorsFile> open(const std::filesystem::path& path);
  // Validates an in-memory file (owned copy); `label` stands in for the path in errors. Used by
  // the fuzzers and by tests that build stores without touching the disk.
  static std::shared_ptr<const SafetensorsFile> from_bytes(std::vector<std::byte> bytes,
                                                           const std::string& label);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t file_size() const { return size_; }

  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  // Throws exl3::Error naming the file when absent.
  const TensorInfo& at(std::string_view name) const;
  // The tensor's bytes inside the mapping (zero-copy; may be unaligned).
  std::span<const std::byte> bytes(const TensorInfo& t) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  SafetensorsHeader header_;
  const std::byte* map_ = nullptr;  // the mapping, or owned_.data() for in-memory files
  uint64_t size_ = 0;
  bool mapped_ = false;             // map_ came from mmap and must be unmapped
  std::vector<std::byte> owned_;
  void build_index();
  std::unordered_map<std::string_view, size_t> index_;
};

// A tensor located in one of a store's files.
struct TensorRef {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;

  std::span<const std::byte> bytes() const { return file->bytes(*info); }
  const std::string& name() const { return info->name; }
  const std::filesystem::path& path() const { return file->path(); }
};

// All tensors of a checkpoint: a single .safetensors file, a folder with model.safetensors, or a
// folder with model.safetensors.index.json naming the shards ({"weight_map": {name: file}}).
// Tensor names must be unique across shards; each weight_map entry must exist in the file it
// names; every shard named must exist.
class TensorStore {
 public:
  static TensorStore open(const std::filesystem::path& path);
  // A store over already opened files (names must be unique across them); `root` labels errors.
  static TensorStore from_files(std::vector<std::shared_ptr<const SafetensorsFile>> files,
                                const std::filesystem::path& root);

  const std::filesystem::path& root() const { return root_; }  // folder (or the file itself)
  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const { return files_; }
  // Sorted names of every tensor.
  const std::vector<std::string>& names() const { return names_; }
  // Tensor count and total data bytes.
  size_t size() const { return names_.size(); }
  uint64_t total_bytes() const;

  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // nullptr when absent.
  const TensorRef* find(std::string_view name) const;
  // Throws exl3::Error naming the checkpoint when absent.
  const TensorRef& at(std::string_view name) const;

 private:
  std::filesystem::path root_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, TensorRef> refs_;
};

// Copies a tensor's bytes into a typed vector (handles unaligned data). Checks that sizeof(T)
// equals the dtype size; throws exl3::Error naming file and tensor otherwise.
template <typename T>
std::vector<T> copy_tensor(const TensorRef& ref);

// Reads any floating dtype (F16, BF16, F32, F64) into fp32 / fp64 values.
std::vector<float> read_as_float(const TensorRef& ref);
std::vector<double> read_as_double(const TensorRef& ref);

// Builds a safetensors file in memory and writes it atomically (temp name in the same folder,
// fsync, rename, fsync of the folder). Data are 8-byte aligned (header padded with spaces).
class SafetensorsWriter {
 public:
  // Copies `data`; its size must equal numel * dtype_size. Names must be unique.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::span<const std::byte> data);
  template <typename T>
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::span<const T> data) {
    add(std::move(name), dtype, std::move(shape), std::as_bytes(data));
  }
  void set_metadata(std::string key, std::string value);

  size_t size() const { return entries_.size(); }
  uint64_t data_bytes() const { return data_.size(); }
  // The serialised file (header + data).
  std::string serialize() const;
  void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries_;
  std::vector<std::byte> data_;
  std::map<std::string, std::string> metadata_;
};

// Writes bytes to `path` atomically (temp file + fsync + rename). Used by the writer and for
// JSON side files.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
// Reads a whole (small, e.g. JSON) file; throws exl3::Error naming the path.
std::string read_text_file(const std::filesystem::path& path);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

}  // namespace exl3
