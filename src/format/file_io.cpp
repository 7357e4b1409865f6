// Input files opened safely (open_regular_file, require_regular_file) and output paths created or
// removed with errors a user can act on (create_output_folder, remove_output_path,
// output_error_hint); see file_io.hpp.
#include "exl3/format/file_io.hpp"

#include <cerrno>
#include <cstring>
#include <system_error>

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

// The longest prefix of `path` that exists (empty when no part of a relative path does).
fs::path deepest_existing(fs::path path) {
  struct stat st {};
  while (!path.empty() && ::lstat(path.c_str(), &st) != 0) {
    const fs::path parent = path.parent_path();
    if (parent == path) break;
    path = parent;
  }
  return path;
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

std::string output_error_hint(const fs::path& dir, int err) {
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS:
      return "pick a writable output folder";
    case ENOENT:
      return fmt::format("the folder {} does not exist; create it or pick another output path",
                         dir.string());
    case ENOTDIR: {
      struct stat st {};
      const fs::path in_the_way = deepest_existing(dir);
      if (!in_the_way.empty() && ::stat(in_the_way.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
        return fmt::format("{} is {}, not a folder; pick another output path", in_the_way.string(),
                           kind_of(st.st_mode));
      }
      return fmt::format("a part of {} is not a folder; pick another output path", dir.string());
    }
    case ENOSPC:
    case EDQUOT:
      return "free some disk space, or pick an output folder on another disk";
    default:
      return fmt::format("check that the folder {} exists and is writable", dir.string());
  }
}

void create_output_folder(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec && fs::is_directory(dir, ec)) return;
  // Name the part of the path that is in the way: the deepest component that exists.
  const fs::path existing = deepest_existing(dir);
  struct stat st {};
  if (!existing.empty() && ::stat(existing.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    if (existing == dir) {
      fail(
          "cannot create folder {}: it exists and is {}, not a folder; hint: pick another output "
          "folder",
          dir.string(), kind_of(st.st_mode));
    }
    fail(
        "cannot create folder {}: {} is {}, not a folder; hint: pick an output path whose parent "
        "folders exist or can be created",
        dir.string(), existing.string(), kind_of(st.st_mode));
  }
  const int err = ec ? ec.value() : ENOTDIR;
  fail("cannot create folder {}: {}; hint: {}", dir.string(), std::strerror(err),
       output_error_hint(dir.parent_path().empty() ? fs::path(".") : dir.parent_path(), err));
}

void remove_output_path(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) {
    const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
    fail("cannot remove {}: {}; hint: {}", path.string(), ec.message(),
         output_error_hint(dir, ec.value()));
  }
}

}  // namespace exl3
