// Streaming safetensors writer and pread-based staged-file reader (see stream_writer.hpp).
#include "quant/stream_writer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/file_io.hpp"

namespace exl3::quant::detail {

namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = size_t{4} << 20;  // bounded buffer for all copying

// Closes a descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pread_all(int fd, std::byte* out, size_t n, uint64_t offset, const fs::path& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail("{}: read failed at offset {}: {}", path.string(), offset,
           r == 0 ? "unexpected end of file" : std::strerror(errno));
    out += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

// Buffered writer to a descriptor; every write failure is reported with the file name.
class BufferedFile {
 public:
  BufferedFile(int fd, const fs::path& label) : fd_(fd), label_(label) { buf_.reserve(kChunk); }

  void write(std::span<const std::byte> data) {
    while (!data.empty()) {
      const size_t n = std::min(data.size(), kChunk - buf_.size());
      buf_.insert(buf_.end(), data.begin(), data.begin() + static_cast<ptrdiff_t>(n));
      data = data.subspan(n);
      if (buf_.size() == kChunk) flush();
    }
  }

  void flush() {
    const std::byte* p = buf_.data();
    size_t n = buf_.size();
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail("{}: write failed: {}", label_.string(), std::strerror(errno));
      p += w;
      n -= static_cast<size_t>(w);
    }
    buf_.clear();
  }

 private:
  int fd_;
  fs::path label_;
  std::vector<std::byte> buf_;
};

void fsync_dir(const fs::path& dir, const fs::path& label) {
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0 || ::fsync(d.fd) != 0) {
    fail("{}: fsync of folder {} failed: {}", label.string(), dir.string(), std::strerror(errno));
  }
}

}  // namespace

StreamEntry span_entry(std::string name, DType dtype, std::vector<int64_t> shape,
                       std::span<const std::byte> data) {
  StreamEntry e;
  e.name = std::move(name);
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.nbytes = data.size();
  e.produce = [data](const ByteSink& sink) { sink(data); };
  return e;
}

void write_safetensors_streaming(const fs::path& path, std::vector<StreamEntry> entries,
                                 const std::map<std::string, std::string>& metadata) {
  std::sort(entries.begin(), entries.end(), [](const StreamEntry& a, const StreamEntry& b) {
    const size_t sa = dtype_size(a.dtype), sb = dtype_size(b.dtype);
    return sa != sb ? sa > sb : a.name < b.name;
  });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& e : entries) {
    uint64_t numel = 1;
    for (const int64_t d : e.shape) numel *= static_cast<uint64_t>(d);
    if (numel * dtype_size(e.dtype) != e.nbytes) {
      fail("{}: tensor '{}': {} elements of {} do not fill {} bytes", path.string(), e.name, numel,
           dtype_name(e.dtype), e.nbytes);
    }
    if (header.contains(e.name)) fail("{}: tensor '{}' added twice", path.string(), e.name);
    header[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const fs::path tmp = dir / fmt::format(".{}.tmp.{}", path.filename().string(), ::getpid());
  Fd fd{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (fd.fd < 0) {
    const int err = errno;
    fail("cannot create {}: {} (writing the temp file {}); hint: {}", path.string(),
         std::strerror(err), tmp.filename().string(), output_error_hint(dir, err));
  }
  try {
    BufferedFile out(fd.fd, path);
    std::byte len[8];
    uint64_t n = text.size();
    for (auto& b : len) {
      b = static_cast<std::byte>(n & 0xFF);
      n >>= 8;
    }
    out.write(len);
    out.write(std::as_bytes(std::span<const char>(text.data(), text.size())));
    for (const auto& e : entries) {
      uint64_t got = 0;
      e.produce([&](std::span<const std::byte> piece) {
        got += piece.size();
        if (got > e.nbytes)
          fail("{}: tensor '{}': producer wrote too many bytes", path.string(), e.name);
        out.write(piece);
      });
      if (got != e.nbytes) {
        fail("{}: tensor '{}': producer wrote {} of {} bytes", path.string(), e.name, got,
             e.nbytes);
      }
    }
    out.flush();
    if (::fsync(fd.fd) != 0) fail("{}: fsync failed: {}", path.string(), std::strerror(errno));
    const int raw = fd.fd;
    fd.fd = -1;
    if (::close(raw) != 0) fail("{}: close failed: {}", path.string(), std::strerror(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      fail("{}: rename from {} failed: {}", path.string(), tmp.string(), std::strerror(errno));
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(dir, path);
}

StagedFile read_staged_header(const fs::path& path) {
  const RegularFile file = open_regular_file(path);
  const int fd = file.fd.get();
  const uint64_t size = file.size;
  if (size < 8) fail("{}: too small for a safetensors file", path.string());
  std::byte len[8];
  pread_all(fd, len, 8, 0, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint64_t>(len[i]);
  if (n > kMaxSafetensorsHeader || n + 8 > size) {
    fail("{}: header length {} does not fit the file", path.string(), n);
  }
  std::vector<std::byte> head(static_cast<size_t>(n + 8));
  pread_all(fd, head.data(), head.size(), 0, path);
  return {path, parse_safetensors_header(head, size, path.string())};
}

StreamEntry staged_entry(const StagedFile& file, const TensorInfo& t) {
  StreamEntry e;
  e.name = t.name;
  e.dtype = t.dtype;
  e.shape = t.shape;
  e.nbytes = t.nbytes();
  const uint64_t begin = file.header.data_begin + t.begin;
  const fs::path path = file.path;
  const uint64_t nbytes = t.nbytes();
  e.produce = [path, begin, nbytes](const ByteSink& sink) {
    const RegularFile in = open_regular_file(path);
    std::vector<std::byte> buf(static_cast<size_t>(std::min<uint64_t>(nbytes, kChunk)));
    for (uint64_t done = 0; done < nbytes;) {
      const auto n = static_cast<size_t>(std::min<uint64_t>(nbytes - done, kChunk));
      pread_all(in.fd.get(), buf.data(), n, begin + done, path);
      sink(std::span<const std::byte>(buf.data(), n));
      done += n;
    }
  };
  return e;
}

void release_pages(std::span<const std::byte> bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto lo = reinterpret_cast<uintptr_t>(bytes.data());
  const uintptr_t hi = lo + bytes.size();
  lo = (lo + page - 1) / page * page;  // whole pages inside the span only
  const uintptr_t end = hi / page * page;
  // MADV_PAGEOUT (Linux >= 5.4) reclaims without changing contents, so it is safe even on memory
  // that is not a file mapping (an in-memory store). Advice only: failure changes just the RSS.
#ifdef MADV_PAGEOUT
  if (end > lo) ::madvise(reinterpret_cast<void*>(lo), end - lo, MADV_PAGEOUT);
#else
  (void)lo;
  (void)end;
#endif
}

}  // namespace exl3::quant::detail
