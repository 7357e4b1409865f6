// The exl3-v1 manifest: strict schema validation, layer file checks and the extent planner (see
// exl3_manifest.hpp).
#include "exl3/format/exl3_manifest.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <set>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/file_io.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3 {
namespace {

using nlohmann::json;

constexpr std::string_view kHint = "hint: the manifest must be written by an exl3-v1 producer";

// A cursor into the manifest that knows its key path for messages.
struct Node {
  const json& j;
  std::string path;  // "geometry.num_slots"
  const std::string& label;

  [[noreturn]] void bad(std::string_view what) const {
    fail("{}: '{}' {}; {}", label, path, what, kHint);
  }
  Node at(std::string_view key) const {
    if (!j.contains(key)) fail("{}: required key '{}' is missing; {}", label, child(key), kHint);
    return {j.at(std::string(key)), child(key), label};
  }
  bool has(std::string_view key) const { return j.contains(key); }
  std::string child(std::string_view key) const {
    return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
  }
  // An object whose keys all come from `allowed` (unknown keys are rejected, not ignored).
  const Node& object(std::initializer_list<std::string_view> allowed) const {
    if (!j.is_object()) bad("must be an object");
    for (const auto& [k, v] : j.items()) {
      if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
        fail("{}: unknown key '{}' (known: {}); {}", label, child(k), fmt::join(allowed, ", "),
             "hint: exl3-v1 rejects keys it does not define rather than ignoring them");
      }
    }
    return *this;
  }
  std::string str() const {
    if (!j.is_string()) bad("must be a string");
    return j.get<std::string>();
  }
  bool boolean() const {
    if (!j.is_boolean()) bad("must be true or false");
    return j.get<bool>();
  }
  // An integer (bools and floats rejected) in [lo, hi].
  int64_t integer(int64_t lo, int64_t hi) const {
    if (!j.is_number_integer()) bad("must be an integer");
    const bool is_unsigned = j.is_number_unsigned();
    if (is_unsigned && j.get<uint64_t>() > static_cast<uint64_t>(hi)) {
      bad(fmt::format("is {}, outside {}..{}", j.get<uint64_t>(), lo, hi));
    }
    const auto v = is_unsigned ? static_cast<int64_t>(j.get<uint64_t>()) : j.get<int64_t>();
    if (v < lo || v > hi) bad(fmt::format("is {}, outside {}..{}", v, lo, hi));
    return v;
  }
  std::vector<Node> array() const {
    if (!j.is_array()) bad("must be an array");
    std::vector<Node> out;
    for (size_t i = 0; i < j.size(); ++i)
      out.push_back({j[i], fmt::format("{}[{}]", path, i), label});
    return out;
  }
};

constexpr int64_t kBig = int64_t{1} << 40;

Exl3SlotCodebook parse_codebook(const Node& n) {
  const auto s = n.str();
  if (s == "mcg") return Exl3SlotCodebook::kMcg;
  if (s == "lut_e4m3") return Exl3SlotCodebook::kLutE4m3;
  if (s == "lut_fp16") return Exl3SlotCodebook::kLutFp16;
  n.bad(fmt::format("is '{}'; expected mcg, lut_e4m3 or lut_fp16", s));
}

Exl3Geometry parse_geometry(const Node& g) {
  g.object({"num_experts", "hidden_size", "intermediate_size", "slot_channels", "num_slots",
            "moe_layer_indices"});
  Exl3Geometry out;
  out.num_experts = g.at("num_experts").integer(1, 1 << 20);
  out.hidden_size = g.at("hidden_size").integer(1, kBig);
  out.intermediate_size = g.at("intermediate_size").integer(1, kBig);
  out.slot_channels = g.at("slot_channels").integer(1, kBig);
  out.num_slots = g.at("num_slots").integer(1, kBig);
  if (out.slot_channels != 32)
    g.at("slot_channels")
        .bad(fmt::format("is {}; exl3-v1 slots are 32 channels", out.slot_channels));
  if (out.hidden_size % 128 != 0)
    g.at("hidden_size")
        .bad(fmt::format("is {}, not a multiple of 128 (Hadamard blocks)", out.hidden_size));
  if (out.intermediate_size % out.slot_channels != 0 ||
      out.num_slots != out.intermediate_size / out.slot_channels) {
    g.at("num_slots")
        .bad(fmt::format(
            "is {}, but intermediate_size {} / slot_channels {} gives {}", out.num_slots,
            out.intermediate_size, out.slot_channels,
            static_cast<double>(out.intermediate_size) / static_cast<double>(out.slot_channels)));
  }
  const Node layers = g.at("moe_layer_indices");
  for (const auto& e : layers.array()) {
    const int v = static_cast<int>(e.integer(0, 1 << 20));
    if (!out.moe_layer_indices.empty() && v <= out.moe_layer_indices.back()) {
      e.bad(fmt::format("is {}; layer indices must be ascending and distinct", v));
    }
    out.moe_layer_indices.push_back(v);
  }
  if (out.moe_layer_indices.empty()) layers.bad("lists no layer");
  return out;
}

Exl3Rates parse_rates(const Node& r) {
  Exl3Rates out;
  if (!r.j.is_object()) r.bad("must be an object");
  const auto structure = r.at("structure").str();
  if (structure == "uniform") {
    r.object({"structure", "bits"});
    out.structure = Exl3Rates::Structure::kUniform;
    out.bits = static_cast<int>(r.at("bits").integer(2, 6));
  } else if (structure == "per_expert_pair") {
    r.object({"structure", "pair_kinds"});
    out.structure = Exl3Rates::Structure::kPerExpertPair;
    static constexpr std::array<std::string_view, 5> kKinds = {"P22", "P33", "P24", "P43", "P44"};
    std::set<std::string> seen;
    for (const auto& k : r.at("pair_kinds").array()) {
      const auto s = k.str();
      if (std::find(kKinds.begin(), kKinds.end(), s) == kKinds.end()) {
        k.bad(fmt::format("is '{}'; pair kinds are {}", s, fmt::join(kKinds, ", ")));
      }
      if (!seen.insert(s).second) k.bad(fmt::format("repeats '{}'", s));
      out.pair_kinds.push_back(s);
    }
    if (out.pair_kinds.empty()) r.at("pair_kinds").bad("is empty");
  } else {
    r.at("structure").bad(fmt::format("is '{}'; expected uniform or per_expert_pair", structure));
  }
  return out;
}

int64_t block_size(const Node& n) {
  const int64_t v = n.integer(0, 1 << 20);
  if (v != 0 && (v & (v - 1)) != 0)
    n.bad(fmt::format("is {}; a Hadamard block is 0 (none) or a power of two", v));
  return v;
}

Exl3HadamardSpec parse_hadamard(const Node& h) {
  h.object({"intermediate_hadamard", "pre_block", "post_block", "per_expert_input_rotations"});
  Exl3HadamardSpec out;
  out.intermediate_hadamard = h.at("intermediate_hadamard").boolean();
  out.pre_block = block_size(h.at("pre_block"));
  out.post_block = block_size(h.at("post_block"));
  out.per_expert_input_rotations = h.at("per_expert_input_rotations").boolean();
  return out;
}

Exl3SlotLayout parse_layout(const Node& l, int64_t num_slots) {
  l.object({"row_alignment", "extent_alignment_slots", "extent_barriers"});
  Exl3SlotLayout out;
  out.row_alignment = l.at("row_alignment").integer(1, 1 << 20);
  out.extent_alignment_slots = l.at("extent_alignment_slots").integer(1, num_slots);
  for (const auto& b : l.at("extent_barriers").array()) {
    const int64_t v = b.integer(1, num_slots - 1);
    if (!out.extent_barriers.empty() && v <= out.extent_barriers.back()) {
      b.bad(fmt::format("is {}; barriers must be ascending and distinct", v));
    }
    out.extent_barriers.push_back(v);
  }
  return out;
}

bool is_hex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::map<int, Exl3LayerEntry> parse_layers(const Node& n, const Exl3Geometry& g) {
  if (!n.j.is_object()) n.bad("must be an object mapping layer index -> {file, sha256}");
  std::map<int, Exl3LayerEntry> out;
  std::set<std::string> files;
  for (const auto& [key, value] : n.j.items()) {
    const Node e{value, n.child(key), n.label};
    const bool decimal =
        !key.empty() && key.size() <= 7 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        (key == "0" || key[0] != '0');
    if (!decimal) e.bad("is not a decimal layer index");
    const int layer = std::stoi(key);
    if (!std::binary_search(g.moe_layer_indices.begin(), g.moe_layer_indices.end(), layer)) {
      e.bad(fmt::format("is not listed in geometry.moe_layer_indices"));
    }
    e.object({"file", "sha256"});
    Exl3LayerEntry le{e.at("file").str(), e.at("sha256").str()};
    if (le.file.empty() || le.file.find('/') != std::string::npos ||
        le.file.find('\\') != std::string::npos || le.file == "." || le.file == ".." ||
        !le.file.ends_with(".safetensors")) {
      e.at("file").bad(fmt::format(
          "is '{}'; expected a bare '*.safetensors' name inside the manifest's folder", le.file));
    }
    if (!files.insert(le.file).second)
      e.at("file").bad(fmt::format("'{}' is used by two layers", le.file));
    if (!is_hex64(le.sha256)) e.at("sha256").bad("is not 64 lowercase hex digits");
    out.emplace(layer, std::move(le));
  }
  for (const int l : g.moe_layer_indices) {
    if (!out.contains(l)) {
      fail("{}: 'layers' has no entry for MoE layer {} (geometry.moe_layer_indices lists it); {}",
           n.label, l, kHint);
    }
  }
  return out;
}

struct EvpCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      fail("sha256: OpenSSL initialisation failed");
  }
  void update(const void* p, size_t n) {
    if (EVP_DigestUpdate(ctx_.get(), p, n) != 1) fail("sha256: OpenSSL digest update failed");
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md, &len) != 1) fail("sha256: OpenSSL digest final failed");
    std::string out;
    for (unsigned i = 0; i < len; ++i) out += fmt::format("{:02x}", md[i]);
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, EvpCtxFree> ctx_;
};

}  // namespace

std::string_view exl3_slot_codebook_name(Exl3SlotCodebook c) {
  switch (c) {
    case Exl3SlotCodebook::kMcg:
      return "mcg";
    case Exl3SlotCodebook::kLutE4m3:
      return "lut_e4m3";
    case Exl3SlotCodebook::kLutFp16:
      return "lut_fp16";
  }
  return "?";
}

std::string Exl3Manifest::geometry_json() const {
  const json j = {{"num_experts", geometry.num_experts},
                  {"hidden_size", geometry.hidden_size},
                  {"intermediate_size", geometry.intermediate_size},
                  {"slot_channels", geometry.slot_channels},
                  {"num_slots", geometry.num_slots},
                  {"moe_layer_indices", geometry.moe_layer_indices}};
  return j.dump();
}

Exl3Manifest parse_exl3_manifest(std::string_view json_text, const std::string& label) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({}); {}", label, e.what(), kHint);
  }
  const Node root{j, "", label};
  root.object({"kind", "schema", "codebook", "codebook_seed", "geometry", "rates", "hadamard",
               "layout", "layers"});
  if (const auto kind = root.at("kind").str(); kind != "exl3-manifest") {
    root.at("kind").bad(fmt::format("is '{}', expected 'exl3-manifest'", kind));
  }
  if (const auto schema = root.at("schema").str(); schema != kExl3Schema) {
    root.at("schema").bad(
        fmt::format("is '{}'; this reader understands '{}' only", schema, kExl3Schema));
  }
  Exl3Manifest m;
  m.label = label;
  m.codebook = parse_codebook(root.at("codebook"));
  if (m.codebook == Exl3SlotCodebook::kMcg) {
    const auto seed =
        static_cast<uint64_t>(root.at("codebook_seed").integer(0, int64_t{0xFFFFFFFF}));
    if (seed != kExl3McgSeed) {
      root.at("codebook_seed")
          .bad(fmt::format("is {:#x}; the MCG codebook's multiplier is {:#x}", seed, kExl3McgSeed));
    }
    m.codebook_seed = seed;
  } else if (root.has("codebook_seed")) {
    root.at("codebook_seed")
        .bad(fmt::format("is given for codebook '{}'; only mcg takes a seed",
                         exl3_slot_codebook_name(m.codebook)));
  }
  m.geometry = parse_geometry(root.at("geometry"));
  m.rates = parse_rates(root.at("rates"));
  m.hadamard = parse_hadamard(root.at("hadamard"));
  m.layout = parse_layout(root.at("layout"), m.geometry.num_slots);
  m.layers = parse_layers(root.at("layers"), m.geometry);
  return m;
}

Exl3Manifest read_exl3_manifest(const std::filesystem::path& dir) {
  const auto path = dir / kExl3ManifestFile;
  Exl3Manifest m = parse_exl3_manifest(read_text_file(path), path.string());
  m.dir = dir;
  for (const auto& [layer, entry] : m.layers) {
    const auto file = dir / entry.file;
    if (!std::filesystem::is_regular_file(file)) {
      fail(
          "{}: layer {} file '{}' is missing; hint: copy every exl3-layer-*.safetensors the "
          "manifest lists",
          path.string(), layer, file.string());
    }
    const auto digest = sha256_file_hex(file);
    if (digest != entry.sha256) {
      fail(
          "{}: sha256 {} does not match the manifest's {} for layer {}; hint: the file is corrupt "
          "or "
          "from another conversion, download it again",
          file.string(), digest, entry.sha256, layer);
    }
    const auto st = SafetensorsFile::open(file);
    const auto& meta = st->metadata();
    const std::pair<std::string_view, std::string> expect[] = {
        {"schema", std::string(kExl3Schema)},
        {"codebook", std::string(exl3_slot_codebook_name(m.codebook))},
        {"layer", std::to_string(layer)},
        {"geometry", m.geometry_json()}};
    for (const auto& [key, want] : expect) {
      const auto it = meta.find(std::string(key));
      if (it == meta.end() || it->second != want) {
        fail(
            "{}: safetensors metadata '{}' is {}, expected '{}' (echoing {}); hint: the layer file "
            "does "
            "not belong to this manifest",
            file.string(), key,
            it == meta.end() ? std::string("missing") : fmt::format("'{}'", it->second), want,
            path.string());
      }
    }
  }
  return m;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.hex();
}

std::string sha256_file_hex(const std::filesystem::path& path) {
  const RegularFile f = open_regular_file(path);  // never blocks on a FIFO or device
  Sha256 h;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(f.fd.get(), buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("{}: read error while hashing: {}", path.string(), std::strerror(errno));
    }
    h.update(buf.data(), static_cast<size_t>(n));
  }
  return h.hex();
}

Exl3Extent plan_exl3_extent(const Exl3Manifest& m, int layer, int tp, int rank) {
  if (tp < kExl3MinTp || tp > kExl3MaxTp) {
    fail("{}: exl3-v1 extent planning supports TP {}..{}, not {}", m.label, kExl3MinTp, kExl3MaxTp,
         tp);
  }
  if (rank < 0 || rank >= tp)
    fail("{}: rank {} is outside 0..{} for TP {}", m.label, rank, tp - 1, tp);
  if (!m.layers.contains(layer)) {
    fail("{}: layer {} is not an MoE layer of this manifest (layers {})", m.label, layer,
         fmt::join(m.geometry.moe_layer_indices, ", "));
  }
  const int64_t slots = m.geometry.num_slots, align = m.layout.extent_alignment_slots;
  const auto& barriers = m.layout.extent_barriers;
  if (barriers.size() != 1 || barriers[0] * 2 != slots || (slots / 2) % align != 0) {
    fail(
        "{}: extent planning requires one barrier between aligned halves: layout.extent_barriers "
        "must be [{}] "
        "and {} slots per half divisible by extent_alignment_slots {} (got barriers [{}])",
        m.label, slots / 2, slots / 2, align, fmt::join(barriers, ", "));
  }
  const int64_t half_blocks = slots / 2 / align;
  const int step = tp == 10 ? 2 : 1;
  const int64_t pos =
      ((static_cast<int64_t>(rank) - static_cast<int64_t>(layer) * step) % tp + tp) % tp;
  const int64_t first_ranks = (tp + 1) / 2;
  const bool second = pos >= first_ranks;
  const int64_t sharers = second ? tp - first_ranks : first_ranks;
  const int64_t i = second ? pos - first_ranks : pos;
  const int64_t q = half_blocks / sharers, r = half_blocks % sharers;
  const int64_t first_block = i * q + std::min(i, r);
  const int64_t count = q + (i < r ? 1 : 0);
  Exl3Extent e;
  e.slot_channels = m.geometry.slot_channels;
  e.first_slot = (second ? slots / 2 : 0) + first_block * align;
  e.slot_count = count * align;
  return e;
}

}  // namespace exl3
