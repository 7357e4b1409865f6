// SafetensorsWriter, write_file_atomic and read_text_file.
//
// Layout follows HF safetensors: tensors are laid out by element size (largest first), then by
// name, with no gaps, so every tensor starts at a multiple of its element size; the JSON header is
// padded with spaces to a multiple of 8 so the data section itself is 8-byte aligned.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/file_io.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3 {
namespace fs = std::filesystem;

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::span<const std::byte> data) {
  if (name == "__metadata__") fail("safetensors writer: '__metadata__' is not a tensor name");
  for (const auto& e : entries_) {
    if (e.name == name) fail("safetensors writer: tensor '{}': added twice", name);
  }
  uint64_t numel = 1;
  for (const int64_t d : shape) {
    if (d < 0) fail("safetensors writer: tensor '{}': negative dim {}", name, d);
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      fail("safetensors writer: tensor '{}': shape overflows", name);
    }
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(dtype)), &nbytes) ||
      nbytes != data.size()) {
    fail("safetensors writer: tensor '{}': {} elements of {} need {} bytes, got {}", name, numel,
         dtype_name(dtype), nbytes, data.size());
  }
  const uint64_t begin = data_.size();
  data_.insert(data_.end(), data.begin(), data.end());
  entries_.push_back({std::move(name), dtype, std::move(shape), begin, data_.size()});
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::serialize() const {
  std::vector<size_t> order(entries_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t sa = dtype_size(entries_[a].dtype), sb = dtype_size(entries_[b].dtype);
    return sa != sb ? sa > sb : entries_[a].name < entries_[b].name;
  });

  // nlohmann::json objects are std::maps: keys come out sorted.
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const size_t i : order) {
    const Entry& e = entries_[i];
    const uint64_t n = e.end - e.begin;
    header[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors writer: cannot serialise header ({}); hint: names and metadata must be UTF-8",
         e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + text.size() + data_.size());
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out.push_back(static_cast<char>(n & 0xFF));
  out += text;
  for (const size_t i : order) {
    const Entry& e = entries_[i];
    out.append(reinterpret_cast<const char*>(data_.data()) + e.begin, e.end - e.begin);
  }
  return out;
}

void SafetensorsWriter::write(const fs::path& path) const {
  write_file_atomic(path, serialize());
}

namespace {

// Writes all of `bytes`, retrying on EINTR and short writes.
bool write_all(int fd, const std::byte* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const fs::path tmp = dir / fmt::format(".{}.tmp.{}", path.filename().string(), ::getpid());

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    fail("cannot create {}: {} (writing the temp file {}); hint: {}", path.string(),
         std::strerror(err), tmp.filename().string(), output_error_hint(dir, err));
  }
  // On any failure: remember errno, drop the temp file, report the step that failed.
  auto abort_with = [&](const char* step, int err, bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(tmp.c_str());
    fail("{}: {} failed: {}; hint: {}", path.string(), step, std::strerror(err),
         output_error_hint(dir, err));
  };
  if (!write_all(fd, bytes.data(), bytes.size())) abort_with("write", errno, true);
  if (::fsync(fd) != 0) abort_with("fsync", errno, true);
  if (::close(fd) != 0) abort_with("close", errno, false);
  if (::rename(tmp.c_str(), path.c_str()) != 0) abort_with("rename", errno, false);

  // Make the rename itself durable.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    fail("{}: cannot open folder {} to fsync: {}", path.string(), dir.string(),
         std::strerror(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0)
    fail("{}: fsync of folder {} failed: {}", path.string(), dir.string(), std::strerror(err));
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  write_file_atomic(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

std::string read_text_file(const std::filesystem::path& path) {
  const RegularFile f = open_regular_file(path);  // never blocks on a FIFO or device
  std::string text;
  text.reserve(static_cast<size_t>(f.size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd.get(), buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("{}: read error: {}", path.string(), std::strerror(errno));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace exl3
