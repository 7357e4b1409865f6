// The resume journal of a conversion (see convert_internal.hpp for the format and guarantees).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/format/file_io.hpp"
#include "quant/convert_internal.hpp"
#include "quant/stream_writer.hpp"

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

std::string recovery_hint(const fs::path& partial_dir) {
  return fmt::format(
      "the resume journal of the unfinished conversion is damaged; pass --overwrite to discard "
      "it and convert from the start, or remove {}",
      partial_dir.string());
}

// The staged file of unit `index`, relative to the partial folder (what entries record).
std::string unit_name(int64_t index) {
  return fmt::format("units/{:06}.safetensors", index);
}

// One finished-item line (line_no of `file`): it must parse, name an item of this plan, and its
// staged file must exist with the recorded size and a readable safetensors header.
std::pair<int64_t, TensorReport> parse_entry(const std::string& line, int64_t line_no,
                                             const fs::path& file, const fs::path& partial_dir,
                                             const std::vector<std::string>& item_names) {
  const std::string shown = line.size() > 80 ? line.substr(0, 77) + "..." : line;
  auto bad = [&](const std::string& problem) {
    fail("{}: line {}: {}; the line reads: {}; hint: {}", file.string(), line_no, problem, shown,
         recovery_hint(partial_dir));
  };
  nlohmann::json rec;
  try {
    rec = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    bad("not a JSON record (a damaged or cut-off line)");
  }
  if (!rec.is_object()) bad("not a JSON object");
  const auto n = static_cast<int64_t>(item_names.size());
  if (!rec.contains("unit") || !rec["unit"].is_number_integer() || rec["unit"].get<int64_t>() < 0 ||
      rec["unit"].get<int64_t>() >= n) {
    bad(fmt::format("'unit' must be an item index 0..{} of this conversion", n - 1));
  }
  const int64_t unit = rec["unit"].get<int64_t>();
  const std::string& expected = item_names[static_cast<size_t>(unit)];
  if (!rec.contains("name") || !rec["name"].is_string()) bad("'name' is missing or not a string");
  if (rec["name"].get<std::string>() != expected) {
    bad(fmt::format("unit {} is recorded as '{}', but this conversion's item {} is '{}'", unit,
                    rec["name"].get<std::string>(), unit, expected));
  }
  TensorReport r;
  try {
    r.name = expected;
    r.quantized = rec.value("quantized", false);
    r.bits = rec.value("bits", 0);
    r.proxy_err = rec.value("proxy_err", 0.0);
    r.seconds = rec.value("seconds", 0.0);
    r.mxfp8 = rec.value("mxfp8", false);
    r.rel_l2 = rec.value("rel_l2", 0.0);
    r.max_abs = rec.value("max_abs", 0.0);
    r.source_bytes = rec.value("source_bytes", uint64_t{0});
    r.stored_bytes = rec.value("stored_bytes", uint64_t{0});
  } catch (const nlohmann::json::exception& e) {
    bad(fmt::format("a field has the wrong type ({})", e.what()));
  }
  r.resumed = true;

  // The staged file. Journals written before "file" and "bytes" were recorded are still read:
  // their files are checked for existence and a readable header only.
  if (rec.contains("file") && rec["file"] != unit_name(unit)) {
    bad(fmt::format("'file' must be \"{}\" for unit {}", unit_name(unit), unit));
  }
  const fs::path staged = partial_dir / unit_name(unit);
  std::error_code ec;
  const auto status = fs::status(staged, ec);
  if (!fs::exists(status))
    bad(fmt::format("the staged file {} of '{}' is missing", staged.string(), expected));
  if (!fs::is_regular_file(status))
    bad(fmt::format("the staged file {} is not a regular file", staged.string()));
  if (rec.contains("bytes")) {
    if (!rec["bytes"].is_number_unsigned()) bad("'bytes' must be a byte count");
    const uint64_t want = rec["bytes"].get<uint64_t>();
    const uint64_t have = fs::file_size(staged, ec);
    if (ec || have != want) {
      bad(fmt::format("the staged file {} of '{}' is {} bytes, the journal recorded {}",
                      staged.string(), expected,
                      ec ? std::string("unreadable") : std::to_string(have), want));
    }
  }
  try {
    (void)read_staged_header(staged);
  } catch (const Error& e) {
    std::string why = e.what();
    why.resize(std::min(why.size(), why.find("; hint:")));  // the recovery hint below replaces it
    bad(fmt::format("the staged file of '{}' is damaged: {}", expected, why));
  }
  return {unit, r};
}

}  // namespace

Journal Journal::open(const fs::path& partial_dir, const nlohmann::json& header, bool discard,
                      const std::vector<std::string>& item_names) {
  Journal j;
  j.dir_ = partial_dir;
  const fs::path file = partial_dir / kJournalFile;
  if (discard) remove_output_path(partial_dir);
  if (fs::exists(file)) {
    // Refuses a FIFO or folder instead of blocking on it.
    const std::string text = read_text_file(file);
    // A last line without its newline was torn by a crash while appending: that item is simply
    // redone. It is cut off, so the next append starts on a line of its own.
    const size_t complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (complete < text.size() && ::truncate(file.c_str(), static_cast<off_t>(complete)) != 0) {
      fail("{}: cannot cut off the torn last line: {}; hint: {}", file.string(),
           std::strerror(errno), recovery_hint(partial_dir));
    }
    std::istringstream in(text.substr(0, complete));
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line_no == 1) {
        nlohmann::json rec;
        try {
          rec = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
          fail("{}: line 1: unreadable journal header; hint: {}", file.string(),
               recovery_hint(partial_dir));
        }
        if (rec != header) {
          fail(
              "{}: holds an unfinished conversion with different settings ({}); re-run with the "
              "same settings to resume it, or pass --overwrite to discard it",
              partial_dir.string(), fmt::join(differences(header, rec), "; "));
        }
        continue;
      }
      const auto [unit, report] = parse_entry(line, line_no, file, partial_dir, item_names);
      j.done_[unit] = report;
    }
    if (line_no == 0)
      fail("{}: empty journal; hint: {}", file.string(), recovery_hint(partial_dir));
    return j;
  }
  // A partial folder without a journal holds nothing we can trust: start it afresh.
  remove_output_path(partial_dir);
  create_output_folder(partial_dir / "units");
  write_file_atomic(file, header.dump() + "\n");
  return j;
}

fs::path Journal::unit_file(int64_t index) const {
  return dir_ / unit_name(index);
}

void Journal::append(int64_t index, const TensorReport& r) {
  // The staged file and its size, so a resume can tell a damaged or swapped file from a good one.
  std::error_code ec;
  const uint64_t bytes = fs::file_size(unit_file(index), ec);
  if (ec) fail("{}: cannot stat the staged file: {}", unit_file(index).string(), ec.message());
  nlohmann::json rec = {{"unit", index},
                        {"name", r.name},
                        {"file", unit_name(index)},
                        {"bytes", bytes},
                        {"quantized", r.quantized},
                        {"bits", r.bits},
                        {"proxy_err", r.proxy_err},
                        {"seconds", r.seconds}};
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
