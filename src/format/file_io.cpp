// open_regular_file, require_regular_file and create_output_folder (see file_io.hpp).
#include "exl3/format/file_io.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exl3/error.hpp"

namespace exl3 {
namespace fs = std::filesystem;

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a file";
}

[[noreturn]] void fail_not_regular(const fs::path& path, mode_t mode) {
  const bool dir = S_ISDIR(mode);
  fail("{}: not a regular file (it is {}); hint: {}", path.string(), kind_of(mode),
       dir ? "name the file inside the folder, or remove the folder that stands in its place"
           : "exl3 reads only regular files (a FIFO or device would block or change under it); "
             "replace it with the real file");
}

}  // namespace

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

void require_regular_file(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail_not_regular(path, st.st_mode);
}

RegularFile open_regular_file(const fs::path& path) {
  require_regular_file(path);
  // O_NONBLOCK: should the path have become a FIFO since the stat, open(2) still returns at once.
  RegularFile f;
  f.fd = FileDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (f.fd.get() < 0) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd.get(), &st) != 0)
    fail("{}: cannot stat: {}", path.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail_not_regular(path, st.st_mode);
  const int flags = ::fcntl(f.fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(f.fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    fail("{}: cannot set blocking mode: {}", path.string(), std::strerror(errno));
  }
  f.size = static_cast<uint64_t>(st.st_size);
  return f;
}

}  // namespace exl3
