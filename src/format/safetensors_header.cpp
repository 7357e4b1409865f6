// parse_safetensors_header: validation of the 8-byte length + JSON header of a safetensors file.
//
// The header is untrusted input. Everything a later read depends on (dtype, shape, byte ranges)
// is checked here once, so the rest of exl3 can index the mapping without further checks.
#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3 {
namespace {

using nlohmann::json;

// A safetensors header nests three levels deep (object -> entry -> shape array). Anything much
// deeper is hostile; refusing it before parsing keeps a 100 MiB "[[[[..." from costing a deep
// recursion anywhere in the JSON library.
constexpr int kMaxJsonDepth = 32;

bool nesting_too_deep(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// The JSON library quotes the offending input in its messages; escape it so an error about
// invalid UTF-8 is itself printable, valid UTF-8.
std::string printable(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7F) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      out += c;
    }
  }
  return out;
}

// A SAX pass that only records the first key repeated inside one object. (The JSON library's
// DOM parser silently keeps the last of two equal keys, and two entries for one tensor name are
// ambiguous. Its parser *callback* could see the keys too, but its end-of-object bookkeeping
// rescans the parent object, which made a 100k-tensor header take minutes to parse.)
class DuplicateKeyScan : public nlohmann::json_sax<json> {
 public:
  std::string duplicate;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (!open_.empty() && !open_.back().insert(k).second && duplicate.empty()) duplicate = k;
    return true;
  }
  bool end_object() override {
    if (!open_.empty()) open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  // Syntax errors are reported by the DOM parse that follows, with the library's message.
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  std::vector<std::set<std::string>> open_;
};

// Parses the JSON text, rejecting duplicate keys in any object.
json parse_json_strict(std::string_view text, const std::string& label) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail("{}: header: invalid JSON ({}); hint: the header must be UTF-8 JSON", label,
         printable(e.what()));
  }
  DuplicateKeyScan scan;
  json::sax_parse(text.begin(), text.end(), &scan);
  if (!scan.duplicate.empty())
    fail("{}: header: key '{}' appears twice in one object", label, scan.duplicate);
  return j;
}

std::string_view json_kind(const json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number_float()) return "a float";
  if (j.is_number()) return "an integer";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  return "an object";
}

// A non-negative integer that fits `limit`, or an exl3::Error naming what it was instead.
uint64_t non_negative_int(const json& j, uint64_t limit, const std::string& where) {
  if (j.is_number_unsigned()) {
    const auto v = j.get<uint64_t>();
    if (v > limit) fail("{}: {} is too large", where, v);
    return v;
  }
  if (j.is_number_integer()) fail("{}: {} is negative", where, j.get<int64_t>());
  fail("{}: expected a non-negative integer, got {} ({})", where, json_kind(j), j.dump());
}

TensorInfo parse_entry(const std::string& name, const json& entry, uint64_t data_size,
                       const std::string& label) {
  const std::string where = fmt::format("{}: tensor '{}'", label, name);
  if (!entry.is_object()) fail("{}: entry must be an object, got {}", where, json_kind(entry));
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail("{}: unexpected key '{}' (allowed: dtype, shape, data_offsets)", where, key);
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) fail("{}: missing key '{}'", where, key);
  }

  TensorInfo t;
  t.name = name;
  const json& dt = entry["dtype"];
  if (!dt.is_string()) fail("{}: dtype must be a string, got {}", where, json_kind(dt));
  const auto parsed = parse_dtype(dt.get_ref<const std::string&>());
  if (!parsed) {
    fail(
        "{}: unknown dtype '{}' (known: BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64, "
        "F8_E4M3, F8_E5M2)",
        where, dt.get_ref<const std::string&>());
  }
  t.dtype = *parsed;

  const json& shape = entry["shape"];
  if (!shape.is_array()) fail("{}: shape must be an array, got {}", where, json_kind(shape));
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const uint64_t d = non_negative_int(shape[i], static_cast<uint64_t>(INT64_MAX),
                                        fmt::format("{}: shape[{}]", where, i));
    t.shape.push_back(static_cast<int64_t>(d));
    // A product that overflows cannot match any real byte range; saturate and report below.
    if (__builtin_mul_overflow(numel, d, &numel)) numel = UINT64_MAX;
  }

  const json& offs = entry["data_offsets"];
  if (!offs.is_array() || offs.size() != 2) {
    fail("{}: data_offsets must be an array [begin, end], got {}", where, offs.dump());
  }
  t.begin = non_negative_int(offs[0], UINT64_MAX, where + ": data_offsets[0]");
  t.end = non_negative_int(offs[1], UINT64_MAX, where + ": data_offsets[1]");
  if (t.begin > t.end) fail("{}: data_offsets begin {} > end {}", where, t.begin, t.end);
  if (t.end > data_size) {
    fail(
        "{}: data_offsets end {} is past the end of the data section ({} bytes); hint: the file "
        "is truncated",
        where, t.end, data_size);
  }

  uint64_t nbytes = 0;
  const bool overflow =
      numel == UINT64_MAX ||
      __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &nbytes);
  if (overflow || nbytes != t.end - t.begin) {
    fail("{}: dtype {} with shape {} needs {} bytes but data_offsets [{}, {}] hold {}", where,
         dtype_name(t.dtype), shape.dump(),
         overflow ? std::string("more than 2^64") : std::to_string(nbytes), t.begin, t.end,
         t.end - t.begin);
  }
  return t;
}

std::map<std::string, std::string> parse_metadata(const json& meta, const std::string& label) {
  if (!meta.is_object()) {
    fail("{}: header: __metadata__ must be an object of string -> string, got {}", label,
         json_kind(meta));
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) {
      fail("{}: header: __metadata__ '{}' must be a string, got {}", label, key, json_kind(value));
    }
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// Sorting by begin leaves any overlap between neighbours; empty tensors occupy no bytes.
void check_no_overlap(std::vector<const TensorInfo*> ts, const std::string& label) {
  std::erase_if(ts, [](const TensorInfo* t) { return t->begin == t->end; });
  std::sort(ts.begin(), ts.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  for (size_t i = 1; i < ts.size(); ++i) {
    if (ts[i - 1]->end > ts[i]->begin) {
      fail("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", label,
           ts[i]->name, ts[i]->begin, ts[i]->end, ts[i - 1]->name, ts[i - 1]->begin,
           ts[i - 1]->end);
    }
  }
}

}  // namespace

int64_t TensorInfo::numel() const {
  // A zero dim makes the product 0 even when the other dims would overflow; without one, the
  // product is bounded by the validated byte size.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> bytes, uint64_t file_size,
                                           const std::string& label) {
  if (file_size < 8 || bytes.size() < 8) {
    fail(
        "{}: header: file is {} bytes, shorter than the 8-byte header length; hint: not a "
        "safetensors file, or truncated",
        label, std::min<uint64_t>(file_size, bytes.size()));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  if (n > kMaxSafetensorsHeader) {
    fail("{}: header: header length {} exceeds the 100 MiB limit; hint: not a safetensors file",
         label, n);
  }
  if (n > file_size - 8) {
    fail(
        "{}: header: header length {} runs past the end of the {}-byte file; hint: the file is "
        "truncated",
        label, n, file_size);
  }
  if (bytes.size() < 8 + n) {
    fail("{}: header: only {} of the {} header bytes were provided", label, bytes.size(), 8 + n);
  }

  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  if (nesting_too_deep(text)) {
    fail("{}: header: JSON nested deeper than {} levels; hint: not a safetensors header", label,
         kMaxJsonDepth);
  }
  const json j = parse_json_strict(text, label);
  if (!j.is_object()) fail("{}: header: must be a JSON object, got {}", label, json_kind(j));

  SafetensorsHeader h;
  h.header_len = n;
  h.data_begin = 8 + n;
  const uint64_t data_size = file_size - h.data_begin;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      h.metadata = parse_metadata(value, label);
    } else {
      h.tensors.push_back(parse_entry(key, value, data_size, label));
    }
  }
  // json objects iterate in key order already; sort anyway so the contract does not depend on it.
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });

  std::vector<const TensorInfo*> ptrs;
  ptrs.reserve(h.tensors.size());
  for (const auto& t : h.tensors) ptrs.push_back(&t);
  check_no_overlap(std::move(ptrs), label);
  return h;
}

}  // namespace exl3
