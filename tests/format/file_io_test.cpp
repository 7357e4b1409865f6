// open_regular_file and the readers built on it: a FIFO, socket or folder where a file is expected
// is refused at once with "<path>: not a regular file (it is ...)", never read (a FIFO would block
// open(2) forever). Every call that could block runs under a watchdog: after kLimit it opens the
// FIFO for writing and closes it, which releases a blocked reader, and fails the test. And the
// output side: create_output_folder / remove_output_path / write_file_atomic name the path, the
// OS reason and a hint when a part of the path is a file or a folder is read-only.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/format/checkpoint.hpp"
#include "exl3/format/file_io.hpp"
#include "exl3/format/safetensors.hpp"
#include "format_test_util.hpp"
#include "test_support.hpp"

namespace exl3 {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr auto kLimit = std::chrono::seconds(10);

// The exl3::Error of fn(), which may try to read `fifo`; fails the test (and unblocks fn) when fn
// has not returned within kLimit.
std::string error_without_blocking(const fs::path& fifo, const std::function<void()>& fn) {
  auto done = std::async(std::launch::async, [&] { return error_of(fn); });
  if (done.wait_for(kLimit) != std::future_status::ready) {
    ADD_FAILURE() << "blocked for " << kLimit.count() << " s on " << fifo;
    // A reader blocked in open(2) lets a non-blocking writer in; closing it gives the reader EOF.
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  return done.get();
}

fs::path make_fifo(const fs::path& p) {
  EXPECT_EQ(::mkfifo(p.c_str(), 0644), 0) << p << ": " << std::strerror(errno);
  return p;
}

TEST(OpenRegularFile, RefusesFifoWithoutBlocking) {
  test::TempDir dir;
  const auto fifo = make_fifo(dir / "model.safetensors");
  for (const auto& fn : std::vector<std::function<void()>>{
           [&] { (void)open_regular_file(fifo); }, [&] { require_regular_file(fifo); },
           [&] { (void)read_text_file(fifo); }, [&] { (void)SafetensorsFile::open(fifo); },
           [&] { (void)TensorStore::open(fifo); },
           [&] { (void)TensorStore::open(dir.path()); },  // the folder's model.safetensors
       }) {
    EXPECT_THAT(error_without_blocking(fifo, fn),
                AllOf(HasSubstr(fifo.string()), HasSubstr("not a regular file"), HasSubstr("FIFO"),
                      HasSubstr("hint:")));
  }
}

TEST(OpenRegularFile, RefusesFolderAndSocket) {
  test::TempDir dir;
  const auto sub = dir / "config.json";
  fs::create_directories(sub);
  EXPECT_THAT(error_of([&] { (void)open_regular_file(sub); }),
              AllOf(HasSubstr(sub.string()), HasSubstr("not a regular file (it is a folder)"),
                    HasSubstr("hint:")));
  EXPECT_THAT(error_of([&] { (void)read_text_file(sub); }),
              HasSubstr("not a regular file (it is a folder)"));

  // A socket (sun_path is short: bind from inside the folder).
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const auto sock = dir / "s";
  if (sock.string().size() < sizeof addr.sun_path) {
    std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(::bind(s, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0)
        << std::strerror(errno);
    EXPECT_THAT(error_of([&] { (void)open_regular_file(sock); }),
                HasSubstr("not a regular file (it is a socket)"));
  }
  ::close(s);
}

TEST(OpenRegularFile, MissingFileAndRegularFile) {
  test::TempDir dir;
  EXPECT_THAT(error_of([&] { (void)open_regular_file(dir / "nope.json"); }),
              AllOf(HasSubstr((dir / "nope.json").string()), HasSubstr("No such file")));
  test::write_file(dir / "a.txt", "hello");
  const auto f = open_regular_file(dir / "a.txt");
  EXPECT_EQ(f.size, 5u);
  EXPECT_EQ(::fcntl(f.fd.get(), F_GETFL) & O_NONBLOCK, 0);  // handed back in blocking mode
  EXPECT_EQ(read_text_file(dir / "a.txt"), "hello");
  // A symbolic link to a regular file is followed.
  fs::create_symlink(dir / "a.txt", dir / "link.txt");
  EXPECT_EQ(read_text_file(dir / "link.txt"), "hello");
}

// config.json / quantization_config.json as FIFOs next to valid weights.
TEST(OpenRegularFile, CheckpointSideFilesAsFifos) {
  test::TempDir dir;
  test::TensorMap m;
  m["x"] = test::filled(DType::kF16, {2});
  test::write_tensors(dir / "model.safetensors", m);
  for (const char* name :
       {"config.json", "quantization_config.json", "model.safetensors.index.json"}) {
    const auto fifo = make_fifo(dir / name);
    EXPECT_THAT(error_without_blocking(fifo, [&] { (void)Checkpoint::open(dir.path()); }),
                AllOf(HasSubstr(fifo.string()), HasSubstr("not a regular file"), HasSubstr("FIFO")))
        << name;
    fs::remove(fifo);
  }
}

// Output folders: created with their parents; a part of the path that is a file, or a folder that
// cannot be written, is named with the reason and a hint (never a std::filesystem exception).
TEST(OutputFolder, CreatedOrRefusedClearly) {
  test::TempDir dir;
  create_output_folder(dir / "a" / "b");
  EXPECT_TRUE(fs::is_directory(dir / "a" / "b"));
  create_output_folder(dir / "a" / "b");  // already there: nothing to do

  test::write_file(dir / "f", "x");
  EXPECT_THAT(error_of([&] { create_output_folder(dir / "f" / "sub" / "deeper"); }),
              AllOf(HasSubstr("cannot create folder " + (dir / "f" / "sub" / "deeper").string()),
                    HasSubstr((dir / "f").string() + " is a regular file, not a folder"),
                    HasSubstr("hint:")));
  EXPECT_THAT(
      error_of([&] { create_output_folder(dir / "f"); }),
      AllOf(HasSubstr("it exists and is a regular file, not a folder"), HasSubstr("hint:")));
  // Files written under a file: the atomic writer names the path and what is in the way.
  EXPECT_THAT(
      error_of([&] { write_file_atomic(dir / "f" / "x.json", std::string_view("{}")); }),
      AllOf(HasSubstr("cannot create " + (dir / "f" / "x.json").string()),
            HasSubstr("Not a directory"),
            HasSubstr("hint: " + (dir / "f").string() + " is a regular file, not a folder")));
  remove_output_path(dir / "a");
  EXPECT_FALSE(fs::exists(dir / "a"));
  remove_output_path(dir / "a");  // already gone: nothing to do
}

TEST(OutputFolder, ReadOnlyFolderRefusedClearly) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root, which ignores permission bits; "
                    "OutputFolder.CreatedOrRefusedClearly covers the error paths for root";
  }
  test::TempDir dir;
  const auto ro = dir / "ro";
  fs::create_directories(ro / "inner");
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string create = error_of([&] { create_output_folder(ro / "out"); });
  const std::string write =
      error_of([&] { write_file_atomic(ro / "x.json", std::string_view("{}")); });
  const std::string remove = error_of([&] { remove_output_path(ro / "inner"); });
  fs::permissions(ro, fs::perms::owner_all);
  for (const auto& msg : {create, write, remove}) {
    EXPECT_THAT(msg, AllOf(HasSubstr(ro.string()), HasSubstr("Permission denied"),
                           HasSubstr("hint: pick a writable output folder")));
  }
}

}  // namespace
}  // namespace exl3
