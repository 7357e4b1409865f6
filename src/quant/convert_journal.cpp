// The resume journal of a conversion (see convert_internal.hpp for the format and guarantees).
#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "quant/convert_internal.hpp"

namespace exl3::quant::detail {

namespace {

// Keys whose values differ between two journal headers, for the error message.
std::vector<std::string> differences(const nlohmann::json& a, const nlohmann::json& b) {
  std::vector<std::string> out;
  for (const auto& [k, v] : a.items()) {
    if (k == "settings" && v.is_object() && b.contains(k) && b[k].is_object()) {
      for (const auto& [sk, sv] : v.items()) {
        const auto other = b[k].contains(sk) ? b[k][sk].dump() : std::string("(none)");
        if (other != sv.dump()) out.push_back(fmt::format("{} {} (now {})", sk, other, sv.dump()));
      }
    } else if (!b.contains(k) || b[k] != v) {
      out.push_back(k == "source_fingerprint" ? "source model" : k);
    }
  }
  return out;
}

}  // namespace

Journal Journal::open(const fs::path& partial_dir, const nlohmann::json& header, bool discard) {
  Journal j;
  j.dir_ = partial_dir;
  const fs::path file = partial_dir / kJournalFile;
  if (fs::exists(partial_dir) && discard) fs::remove_all(partial_dir);
  if (fs::exists(file)) {
    std::istringstream in(read_text_file(file));  // refuses a FIFO or folder instead of blocking
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
      nlohmann::json rec;
      try {
        rec = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        if (first)
          fail("{}: unreadable journal header; remove the folder or pass --overwrite",
               file.string());
        continue;  // a torn line from a crash while appending: that item is simply redone
      }
      if (first) {
        first = false;
        if (rec != header) {
          fail(
              "{}: holds an unfinished conversion with different settings ({}); re-run with the "
              "same settings to resume it, or pass --overwrite to discard it",
              partial_dir.string(), fmt::join(differences(header, rec), "; "));
        }
        continue;
      }
      if (!rec.is_object() || !rec.contains("unit")) continue;
      TensorReport r;
      r.name = rec.value("name", "");
      r.quantized = rec.value("quantized", false);
      r.bits = rec.value("bits", 0);
      r.proxy_err = rec.value("proxy_err", 0.0);
      r.seconds = rec.value("seconds", 0.0);
      r.mxfp8 = rec.value("mxfp8", false);
      r.rel_l2 = rec.value("rel_l2", 0.0);
      r.max_abs = rec.value("max_abs", 0.0);
      r.source_bytes = rec.value("source_bytes", uint64_t{0});
      r.stored_bytes = rec.value("stored_bytes", uint64_t{0});
      r.resumed = true;
      j.done_[rec["unit"].get<int64_t>()] = r;
    }
    if (first) fail("{}: empty journal; remove the folder or pass --overwrite", file.string());
    return j;
  }
  // A partial folder without a journal holds nothing we can trust: start it afresh.
  if (fs::exists(partial_dir)) fs::remove_all(partial_dir);
  fs::create_directories(partial_dir / "units");
  write_file_atomic(file, header.dump() + "\n");
  return j;
}

fs::path Journal::unit_file(int64_t index) const {
  return dir_ / "units" / fmt::format("{:06}.safetensors", index);
}

void Journal::append(int64_t index, const TensorReport& r) {
  nlohmann::json rec = {{"unit", index},  {"name", r.name},           {"quantized", r.quantized},
                        {"bits", r.bits}, {"proxy_err", r.proxy_err}, {"seconds", r.seconds}};
  if (r.mxfp8 || r.stored_bytes > 0) {  // dense linears: what the summary reports after a resume
    rec["mxfp8"] = r.mxfp8;
    rec["rel_l2"] = r.rel_l2;
    rec["max_abs"] = r.max_abs;
    rec["source_bytes"] = r.source_bytes;
    rec["stored_bytes"] = r.stored_bytes;
  }
  const std::string line = rec.dump() + "\n";
  const fs::path file = dir_ / kJournalFile;
  const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot append: {}", file.string(), std::strerror(errno));
  const ssize_t w = ::write(fd, line.data(), line.size());
  const int err = errno;
  const bool ok = w == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) fail("{}: append failed: {}", file.string(), std::strerror(err));
  TensorReport done = r;
  done_[index] = done;
}

}  // namespace exl3::quant::detail
