// SafetensorsFile: a read-only POSIX mapping of one validated safetensors file, plus the typed
// copies (copy_tensor, read_as_float / read_as_double) built on it.
#include <cerrno>
#include <cstring>

#include <sys/mman.h>

#include "exl3/error.hpp"
#include "exl3/format/file_io.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3 {
std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string label = path.string();
  // Refuses a FIFO / device / folder before open(2) could block on it; the mapping outlives the
  // descriptor.
  const RegularFile file = open_regular_file(path);

  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = file.size;
  if (f->size_ > 0) {
    // mmap of length 0 is an error, so tiny/empty files go straight to the header check below.
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, file.fd.get(), 0);
    if (p == MAP_FAILED)
      fail("{}: cannot mmap {} bytes: {}", label, f->size_, std::strerror(errno));
    f->map_ = static_cast<const std::byte*>(p);
    f->mapped_ = true;
  }
  f->header_ = parse_safetensors_header({f->map_, f->size_}, f->size_, label);
  f->build_index();
  return f;
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::from_bytes(std::vector<std::byte> bytes,
                                                                   const std::string& label) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = label;
  f->owned_ = std::move(bytes);
  f->map_ = f->owned_.data();
  f->size_ = f->owned_.size();
  f->header_ = parse_safetensors_header({f->map_, f->size_}, f->size_, label);
  f->build_index();
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapped_) ::munmap(const_cast<std::byte*>(map_), size_);
}

// Views point into header_.tensors, which never changes after open.
void SafetensorsFile::build_index() {
  index_.reserve(header_.tensors.size());
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

const TensorInfo& SafetensorsFile::at(std::string_view name) const {
  if (const TensorInfo* t = find(name)) return *t;
  fail("{}: tensor '{}': not in this file", path_.string(), name);
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& t) const {
  // Offsets were validated against the file size by parse_safetensors_header.
  return {map_ + header_.data_begin + t.begin, t.nbytes()};
}

template <typename T>
std::vector<T> copy_tensor(const TensorRef& ref) {
  const TensorInfo& t = *ref.info;
  if (sizeof(T) != dtype_size(t.dtype)) {
    fail("{}: tensor '{}': dtype {} has {}-byte elements, cannot copy as a {}-byte type",
         ref.path().string(), t.name, dtype_name(t.dtype), dtype_size(t.dtype), sizeof(T));
  }
  const auto b = ref.bytes();
  std::vector<T> out(b.size() / sizeof(T));
  if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());  // the mapping may be unaligned
  return out;
}

template std::vector<uint8_t> copy_tensor<uint8_t>(const TensorRef&);
template std::vector<int8_t> copy_tensor<int8_t>(const TensorRef&);
template std::vector<uint16_t> copy_tensor<uint16_t>(const TensorRef&);
template std::vector<int16_t> copy_tensor<int16_t>(const TensorRef&);
template std::vector<uint32_t> copy_tensor<uint32_t>(const TensorRef&);
template std::vector<int32_t> copy_tensor<int32_t>(const TensorRef&);
template std::vector<int64_t> copy_tensor<int64_t>(const TensorRef&);
template std::vector<float> copy_tensor<float>(const TensorRef&);
template std::vector<double> copy_tensor<double>(const TensorRef&);

namespace {

template <typename Out>
std::vector<Out> read_floating(const TensorRef& ref) {
  const TensorInfo& t = *ref.info;
  std::vector<Out> out;
  out.reserve(t.nbytes() / dtype_size(t.dtype));
  switch (t.dtype) {
    case DType::kF16:
      for (const uint16_t h : copy_tensor<uint16_t>(ref))
        out.push_back(static_cast<Out>(trellis::half_to_float(h)));
      return out;
    case DType::kBF16:
      for (const uint16_t h : copy_tensor<uint16_t>(ref))
        out.push_back(static_cast<Out>(trellis::bf16_to_float(h)));
      return out;
    case DType::kF32:
      for (const float v : copy_tensor<float>(ref)) out.push_back(static_cast<Out>(v));
      return out;
    case DType::kF64:
      for (const double v : copy_tensor<double>(ref)) out.push_back(static_cast<Out>(v));
      return out;
    default:
      fail("{}: tensor '{}': dtype {} is not a floating type (expected F16, BF16, F32 or F64)",
           ref.path().string(), t.name, dtype_name(t.dtype));
  }
}

}  // namespace

std::vector<float> read_as_float(const TensorRef& ref) {
  return read_floating<float>(ref);
}
std::vector<double> read_as_double(const TensorRef& ref) {
  return read_floating<double>(ref);
}

}  // namespace exl3
