// Shared helpers for the exl3 test suite.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace exl3::test {

// `<repo>/../shared/conformance`, or $EXL3_CONFORMANCE_DIR. Returns nullopt when missing.
std::optional<std::filesystem::path> conformance_dir();

// Skips the current test loudly when the conformance data is missing, and fails it under CI=true
// (CI must never pass by skipping the golden vectors). Use as: EXL3_REQUIRE_CONFORMANCE(dir);
#define EXL3_REQUIRE_CONFORMANCE(var)                                                           \
  auto var##_opt = ::exl3::test::conformance_dir();                                             \
  if (!var##_opt) {                                                                             \
    if (::exl3::test::running_in_ci()) {                                                        \
      FAIL() << "conformance data missing (expected <repo>/../shared/conformance) under CI";    \
    }                                                                                           \
    GTEST_SKIP() << "*** conformance data missing: <repo>/../shared/conformance not found ***"; \
  }                                                                                             \
  const std::filesystem::path var = *var##_opt

bool running_in_ci();

// The message of the exl3::Error `fn` throws; records a failure when it throws nothing or throws
// something else.
std::string error_of(const std::function<void()>& fn);

// The repository's tests/model/data (reference checkpoints): $EXL3_SOURCE_DIR/tests/model/data
// when set (a copy of the tree on another machine, e.g. the GPU host), else the source tree this
// build came from.
std::filesystem::path model_data_dir();

// A fresh temporary directory under the build tree, removed at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Seeded RNG. Tests draw a fresh seed from the clock unless EXL3_TEST_SEED is set, and print it
// on failure, so coverage grows across runs while failures stay reproducible.
uint64_t test_seed();
std::mt19937_64 make_rng();

// Relative L2 distance ||a - b|| / ||b||.
double rel_l2(std::span<const double> a, std::span<const double> b);
double rel_l2(std::span<const float> a, std::span<const double> b);
double rel_l2(std::span<const float> a, std::span<const float> b);

void write_file(const std::filesystem::path& p, const std::string& bytes);

// The `exl3` binary under test: $EXL3_CLI when set (e.g. a copy on another machine), else the
// one this build produced.
struct CliRun {
  int code;         // exit status (-1 when it did not exit normally)
  std::string out;  // stdout, plus stderr unless with_stderr is false
};
// Runs `exl3 ARGS` through the shell; `env` is prefixed as is (e.g. "VAR=1").
CliRun run_cli(const std::string& args, const std::string& env = "", bool with_stderr = true);
// Single-quotes a path for the shell.
std::string shell_quote(const std::filesystem::path& p);
std::string read_file(const std::filesystem::path& p);

}  // namespace exl3::test
