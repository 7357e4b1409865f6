#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exl3/error.hpp"

namespace exl3::test {

std::optional<std::filesystem::path> conformance_dir() {
  if (const char* env = std::getenv("EXL3_CONFORMANCE_DIR"); env != nullptr && *env != '\0') {
    std::filesystem::path p(env);
    if (std::filesystem::is_directory(p)) return p;
    return std::nullopt;
  }
  const auto p = std::filesystem::path(EXL3_SOURCE_DIR) / ".." / "shared" / "conformance";
  if (std::filesystem::is_directory(p / "tensors")) return std::filesystem::weakly_canonical(p);
  return std::nullopt;
}

std::filesystem::path model_data_dir() {
  const char* env = std::getenv("EXL3_SOURCE_DIR");
  const std::filesystem::path root =
      env != nullptr && *env != '\0' ? std::filesystem::path(env) : EXL3_SOURCE_DIR;
  return root / "tests" / "model" / "data";
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-exl3 exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected an exl3::Error, nothing was thrown";
  return {};
}

bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  const auto base = std::filesystem::path(EXL3_BINARY_DIR) / "test-tmp";
  std::filesystem::create_directories(base);
  path_ = base / fmt::format("t{}_{}", ::getpid(), counter++);
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("EXL3_TEST_SEED"); env != nullptr && *env != '\0') {
      return static_cast<uint64_t>(std::strtoull(env, nullptr, 10));
    }
    const auto now = std::chrono::high_resolution_clock::now().time_since_epoch().count();
    return static_cast<uint64_t>(now) ^ (static_cast<uint64_t>(::getpid()) << 32);
  }();
  static std::once_flag printed;
  std::call_once(printed, [] { std::cerr << "[exl3 test] EXL3_TEST_SEED=" << seed << "\n"; });
  return seed;
}

std::mt19937_64 make_rng() {
  static std::atomic<uint64_t> stream{0};
  return std::mt19937_64(test_seed() + 0x9E3779B97F4A7C15ull * (stream++ + 1));
}

namespace {
template <typename A, typename B>
double rel_l2_impl(std::span<const A> a, std::span<const B> b) {
  if (a.size() != b.size()) throw std::invalid_argument("rel_l2: size mismatch");
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}
}  // namespace

double rel_l2(std::span<const double> a, std::span<const double> b) {
  return rel_l2_impl(a, b);
}
double rel_l2(std::span<const float> a, std::span<const double> b) {
  return rel_l2_impl(a, b);
}
double rel_l2(std::span<const float> a, std::span<const float> b) {
  return rel_l2_impl(a, b);
}

void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot write " + p.string());
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CliRun run_cli(const std::string& args, const std::string& env, bool with_stderr) {
  const char* override_path = std::getenv("EXL3_CLI");
  const std::string bin =
      override_path != nullptr && *override_path != '\0' ? override_path : EXL3_CLI_PATH;
  const std::string cmd =
      fmt::format("{} '{}' {} {}", env, bin, args, with_stderr ? "2>&1" : "2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string shell_quote(const std::filesystem::path& p) {
  return "'" + p.string() + "'";
}

}  // namespace exl3::test
