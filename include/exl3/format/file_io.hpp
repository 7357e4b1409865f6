// Opening input files safely.
//
// Every reader of a user-supplied file (safetensors shards, config.json, tokenizer.json,
// quantization_config.json, calibration / eval text, the quantize journal) goes through
// open_regular_file, so a FIFO, socket, device or folder where a file is expected is refused with
// "<path>: not a regular file (it is a FIFO)" instead of blocking forever in open(2) or read(2).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace exl3 {

// An owned POSIX file descriptor (closed on destruction).
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& o) noexcept : fd_(o.release()) {}
  FileDescriptor& operator=(FileDescriptor&& o) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Throws exl3::Error naming `path` unless it is a regular file (symbolic links are followed):
// "<path>: cannot open: No such file or directory" or "<path>: not a regular file (it is a
// FIFO); hint: ...". Only stat(2) is used, so it never blocks.
void require_regular_file(const std::filesystem::path& path);

struct RegularFile {
  FileDescriptor fd;  // open for reading, blocking mode
  uint64_t size = 0;
};

// Opens `path` read-only, refusing anything that is not a regular file without blocking: stat(2)
// first, then open(2) with O_NONBLOCK (a FIFO swapped in after the stat does not block either),
// then fstat(2) of the descriptor, which is what is actually read. Throws exl3::Error naming the
// path and the problem.
RegularFile open_regular_file(const std::filesystem::path& path);

}  // namespace exl3
