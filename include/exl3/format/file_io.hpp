// Opening input files safely, and creating output folders with errors a user can act on.
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

// The hint for a failure (errno `err`) to create or write a file in output folder `dir`, e.g.
// "pick a writable output folder" for EACCES / EROFS.
std::string output_error_hint(const std::filesystem::path& dir, int err);

// Creates `dir` and its missing parents (nothing when it is already a folder). Throws exl3::Error
// naming the path and the OS reason with a hint instead of std::filesystem::filesystem_error, e.g.
// "cannot create folder /x/y: Permission denied; hint: pick a writable output folder", or, when a
// part of the path is a file, "cannot create folder /x/f/y: /x/f is a regular file, not a folder".
void create_output_folder(const std::filesystem::path& dir);

// Removes `path` (a folder with its contents; nothing when it does not exist), throwing
// exl3::Error naming the path and the OS reason with a hint on failure.
void remove_output_path(const std::filesystem::path& path);

}  // namespace exl3
