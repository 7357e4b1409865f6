// parse_hybrid_tr3_tail: the rank-sliced MoE metadata block of config.json (docs/moe-layouts.md,
// sections hybrid_tr3_tail and What fails closed). Every value is checked for type and meaning
// before anything is loaded: a misread TP, layer range or per-expert K would load the wrong bytes
// into the right places.
#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/moe/layout.hpp"

namespace exl3::moe {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kBlock = "hybrid_tr3_tail";
constexpr const char* kRequired[] = {"format",     "bits", "codebook",     "experts_per_layer",
                                     "moe_layers", "tp",   "tensor_schema"};

// A JSON integer that fits an int (bools and floats are not integers here).
std::optional<int> as_int(const json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT32_MAX)) return std::nullopt;
    return static_cast<int>(u);
  }
  const auto i = v.get<int64_t>();
  if (i < INT32_MIN || i > INT32_MAX) return std::nullopt;
  return static_cast<int>(i);
}

// Canonical decimal "0".."999999" (no sign, no leading zeros, no blanks), else -1.
int parse_layer_key(const std::string& s) {
  if (s.empty() || s.size() > 6 || (s.size() > 1 && s[0] == '0')) return -1;
  int v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

class Parser {
 public:
  Parser(const json& block, const fs::path& dir, const std::string& label)
      : b_(block), dir_(dir), label_(label) {}

  MoeLayout parse() {
    MoeLayout out;
    out.label = label_;
    check_required();
    check_format();
    check_codebook();
    out.num_experts = positive_int("experts_per_layer");
    out.tp = positive_int("tp");
    const auto [first, last] = layer_range();
    for (int l = first; l <= last; ++l) out.layers.push_back(l);
    layers_ = out.layers;
    num_experts_ = out.num_experts;
    check_schema();
    out.rotation = rotation_layout();
    check_legacy_hybrid(out.num_experts);
    read_bits(out);
    return out;
  }

 private:
  [[noreturn]] void bad(const std::string& key, const std::string& what,
                        const std::string& hint) const {
    fail("{}: key '{}.{}': {}{}{}", label_, kBlock, key, what,
         hint.empty() ? "" : "; hint: ", hint);
  }
  const json* get(const char* key) const {
    const auto it = b_.find(key);
    return it == b_.end() ? nullptr : &*it;
  }

  void check_required() const {
    std::vector<std::string> missing;
    for (const char* k : kRequired) {
      if (get(k) == nullptr) missing.emplace_back(k);
    }
    if (!missing.empty()) {
      fail(
          "{}: block '{}' is missing required key(s) {}; hint: rank-sliced metadata needs {} "
          "(refusing to guess any of them)",
          label_, kBlock, fmt::join(missing, ", "), fmt::join(kRequired, ", "));
    }
  }

  std::string string_value(const char* key) const {
    const json& v = *get(key);
    if (!v.is_string()) bad(key, fmt::format("expected a string, got {}", v.dump()), "");
    const auto s = v.get<std::string>();
    if (s.find_first_not_of(" \t\r\n") == std::string::npos) bad(key, "is blank", "");
    return s;
  }

  void check_format() const {
    const auto f = string_value("format");
    if (f != "exl3-trellis") {
      bad("format", fmt::format("'{}' is not 'exl3-trellis'", f),
          "only EXL3 trellis-coded expert tails are understood; other hybrid formats are refused");
    }
  }

  void check_codebook() const {
    const auto cb = string_value("codebook");
    if (cb != "mcg") {
      bad("codebook", fmt::format("'{}', but rank-sliced experts must use 'mcg'", cb),
          "the fused Trellis MoE decodes MCG only (MUL1 and 3INST are refused)");
    }
    if (const json* m = get("mcg_multiplier")) {
      const bool ok = m->is_number_unsigned() && m->get<uint64_t>() == kMcgMultiplier;
      if (!ok) {
        bad("mcg_multiplier",
            fmt::format("{}, expected {} (0xCBAC1FED)", m->dump(), kMcgMultiplier),
            "made with an unlocked experimental multiplier, which the kernels decode wrongly");
      }
    }
  }

  int positive_int(const char* key) const {
    const json& v = *get(key);
    const auto i = as_int(v);
    if (!i || *i <= 0) {
      bad(key, fmt::format("expected a positive integer, got {}", v.dump()),
          "write it as a JSON integer (no quotes, no decimal point)");
    }
    return *i;
  }

  std::pair<int, int> layer_range() const {
    const json& v = *get("moe_layers");
    const char* hint = "moe_layers is the inclusive range [first, last] of MoE layer indices";
    if (!v.is_array() || v.size() != 2) {
      bad("moe_layers", fmt::format("expected [first, last], got {}", v.dump()), hint);
    }
    const auto first = as_int(v[0]), last = as_int(v[1]);
    if (!first || !last || *first < 0 || *last < 0) {
      bad("moe_layers",
          fmt::format("{} must hold two non-negative integers (no bools or floats)", v.dump()),
          hint);
    }
    if (*first > *last) bad("moe_layers", fmt::format("{} is not ordered", v.dump()), hint);
    return {*first, *last};
  }

  void check_schema() const {
    const auto s = string_value("tensor_schema");
    if (s != kRankSlicedSchema) {
      bad("tensor_schema", fmt::format("'{}' is not the supported schema", s),
          fmt::format("expected exactly '{}'", kRankSlicedSchema));
    }
  }

  RotationLayout rotation_layout() const {
    RotationLayout layout = RotationLayout::kPerExpert;  // absent = legacy per_expert_v1
    if (get("rotation_layout") != nullptr) {
      const auto s = string_value("rotation_layout");
      if (s == "shared_h_v1") {
        layout = RotationLayout::kSharedH;
      } else if (s != "per_expert_v1") {
        bad("rotation_layout", fmt::format("unknown layout '{}'", s),
            "known layouts are per_expert_v1 and shared_h_v1");
      }
    }
    const bool schema = get("shared_h_tensor_schema") != nullptr;
    if (layout == RotationLayout::kSharedH && !schema) {
      bad("shared_h_tensor_schema", "is missing, but rotation_layout is shared_h_v1",
          fmt::format("shared_h_v1 and shared_h_tensor_schema '{}' must be declared together",
                      kSharedHSchema));
    }
    if (schema && layout != RotationLayout::kSharedH) {
      bad("shared_h_tensor_schema", "is declared, but rotation_layout is not shared_h_v1",
          "shared_h_v1 and shared_h_tensor_schema must be declared together");
    }
    if (schema) {
      const auto s = string_value("shared_h_tensor_schema");
      if (s != kSharedHSchema) {
        bad("shared_h_tensor_schema", fmt::format("'{}' is not the supported schema", s),
            fmt::format("expected exactly '{}'", kSharedHSchema));
      }
    }
    return layout;
  }

  // Older "hybrid" checkpoints kept some experts in NVFP4 and Trellis-coded only a tail.
  void check_legacy_hybrid(int experts) const {
    if (const json* t = get("tr3_tail_per_layer")) {
      const auto v = as_int(*t);
      if (!v || *v != experts) {
        bad("tr3_tail_per_layer",
            fmt::format("{}, but experts_per_layer is {}", t->dump(), experts),
            "experts kept in another format (a partial Trellis tail) are not supported");
      }
    }
    if (const json* n = get("nvfp4_keep_per_layer")) {
      const auto v = as_int(*n);
      if (!v || *v != 0) {
        bad("nvfp4_keep_per_layer", fmt::format("{}, expected 0", n->dump()),
            "experts kept in NVFP4 are not supported");
      }
    }
  }

  void read_bits(MoeLayout& out) const {
    const json& bits = *get("bits");
    if (bits.is_string()) {
      const auto s = string_value("bits");
      if (s != "mixed") {
        bad("bits", fmt::format("'{}' is neither a number nor \"mixed\"", s),
            "uniform checkpoints give the K as a number, mixed ones \"mixed\" with k_values and "
            "bits_per_expert");
      }
      read_mixed(out);
      return;
    }
    if (!bits.is_number() || bits.is_boolean()) {
      bad("bits", fmt::format("expected a number or \"mixed\", got {}", bits.dump()), "");
    }
    const double d = bits.get<double>();
    const int k = d >= 1.0 && d <= 8.0 ? static_cast<int>(d) : 0;
    if (static_cast<double>(k) != d ||
        std::find(std::begin(kUniformBits), std::end(kUniformBits), k) == std::end(kUniformBits)) {
      bad("bits", fmt::format("{} is not a supported uniform K (3, 4, 5, 6 or 8)", bits.dump()),
          "a fractional average belongs to a mixed checkpoint: bits \"mixed\" with k_values and "
          "bits_per_expert");
    }
    for (const char* k_key : {"k_values", "bits_per_expert"}) {
      if (get(k_key) != nullptr) {
        bad(k_key, fmt::format("is set, but bits is the uniform {}", k),
            "ambiguous: use bits \"mixed\" for per-expert K, or drop the key");
      }
    }
    out.mixed = false;
    out.k_values = {k};
    out.bits_source = "bits";
    for (const int l : out.layers) out.expert_bits[l].assign(static_cast<size_t>(num_experts_), k);
    if (get("trellis_bits_by_layer") != nullptr) read_bits_by_layer(out, k);
  }

  // The 169k variant's normalisation of uniform metadata: {"3": 3, ...} over every MoE layer.
  void read_bits_by_layer(MoeLayout& out, int k) const {
    const char* key = "trellis_bits_by_layer";
    const json& m = *get(key);
    if (!m.is_object()) bad(key, fmt::format("expected an object, got {}", m.dump()), "");
    std::set<int> seen;
    for (const auto& [name, value] : m.items()) {
      const int layer = parse_layer_key(name);
      if (layer < 0 || std::find(layers_.begin(), layers_.end(), layer) == layers_.end()) {
        bad(key, fmt::format("key '{}' is not a MoE layer of moe_layers", name),
            "keys are decimal layer indices covering every MoE layer exactly");
      }
      seen.insert(layer);
      const auto v = as_int(value);
      if (!v || std::find(std::begin(kUniformBits), std::end(kUniformBits), *v) ==
                    std::end(kUniformBits)) {
        bad(key,
            fmt::format("layer {}: {} is not a supported K (3, 4, 5, 6 or 8)", name, value.dump()),
            "");
      }
      if (*v != k) {
        bad(key, fmt::format("layer {}: K{} disagrees with bits {}", name, *v, k),
            "ambiguous: the per-layer map normalises the uniform bits and must agree with it");
      }
    }
    for (const int l : layers_) {
      if (seen.count(l) == 0) {
        bad(key, fmt::format("has no entry for MoE layer {}", l),
            "keys are decimal layer indices covering every MoE layer exactly");
      }
    }
    out.bits_source = key;
  }

  void read_mixed(MoeLayout& out) const {
    out.mixed = true;
    if (get("k_values") == nullptr || get("bits_per_expert") == nullptr) {
      bad(get("k_values") == nullptr ? "k_values" : "bits_per_expert",
          "is missing, but bits is \"mixed\"",
          "mixed checkpoints declare k_values ([3, 4]) and bits_per_expert (\"file.json:field\")");
    }
    if (get("trellis_bits_by_layer") != nullptr) {
      bad("trellis_bits_by_layer", "is set, but bits is \"mixed\"",
          "ambiguous: per-layer uniform K and per-expert K cannot both apply");
    }
    const json& kv = *get("k_values");
    if (!kv.is_array() || kv.size() < 2) {
      bad("k_values", fmt::format("expected two or more K values, got {}", kv.dump()),
          "a single K is a uniform checkpoint: give it as a number in bits");
    }
    std::set<int> ks;
    for (const auto& v : kv) {
      const auto k = as_int(v);
      if (!k || *k < kMixedMinBits || *k > kMixedMaxBits) {
        bad("k_values",
            fmt::format("{} holds {}, outside {}..{}", kv.dump(), v.dump(), kMixedMinBits,
                        kMixedMaxBits),
            "the mixed-tier kernels support K 3..6");
      }
      if (!ks.insert(*k).second) bad("k_values", fmt::format("{} repeats K{}", kv.dump(), *k), "");
    }
    out.k_values.assign(ks.begin(), ks.end());

    const json& bpe = *get("bits_per_expert");
    if (!bpe.is_string()) {
      bad("bits_per_expert",
          fmt::format("expected a \"file.json:field\" string, got {}", bpe.dump()), "");
    }
    const auto spec = bpe.get<std::string>();
    const size_t colon = spec.find(':');
    const std::string file = spec.substr(0, colon);
    const std::string field = colon == std::string::npos ? "" : spec.substr(colon + 1);
    if (colon == std::string::npos || spec.find(':', colon + 1) != std::string::npos ||
        !file.ends_with(".json") || file.size() <= 5 || field.empty() ||
        field.find_first_of(" \t") != std::string::npos ||
        file.find_first_of("/\\") != std::string::npos) {
      bad("bits_per_expert", fmt::format("'{}' is not of the form file.json:field", spec),
          "e.g. \"tier_bitmap.json:k\", naming a JSON file next to config.json and the field "
          "holding each layer's per-expert K");
    }
    read_tier_bitmap(out, dir_ / file, field);
    out.bits_source = spec;
  }

  void read_tier_bitmap(MoeLayout& out, const fs::path& path, const std::string& field) const {
    const std::string where = path.string();
    if (!fs::is_regular_file(path)) {
      fail(
          "{}: not found; hint: {}.bits_per_expert in {} names it, and it must sit next to "
          "config.json",
          where, kBlock, label_);
    }
    json m;
    try {
      m = json::parse(read_text_file(path));
    } catch (const json::exception& e) {
      fail("{}: invalid JSON ({}); hint: named by {}.bits_per_expert in {}", where, e.what(),
           kBlock, label_);
    }
    if (!m.is_object()) fail("{}: must be a JSON object keyed by MoE layer", where);
    const std::string cover = "keys are decimal MoE layer indices covering moe_layers exactly";
    std::set<int> used;
    for (const auto& [name, entry] : m.items()) {
      const int layer = parse_layer_key(name);
      if (layer < 0 || std::find(layers_.begin(), layers_.end(), layer) == layers_.end()) {
        fail("{}: key '{}' is not a MoE layer of {}.moe_layers; hint: {}", where, name, kBlock,
             cover);
      }
      out.expert_bits[layer] = layer_bits(where, name, entry, field, out.k_values);
      for (const int k : out.expert_bits[layer]) used.insert(k);
    }
    for (const int l : layers_) {
      if (out.expert_bits.count(l) == 0) {
        fail("{}: no entry for MoE layer {}; hint: {}", where, l, cover);
      }
    }
    for (const int k : out.k_values) {
      if (used.count(k) == 0) {
        fail(
            "{}: K{} is declared in {}.k_values but used by no expert; hint: declare exactly "
            "the K values in use",
            where, k, kBlock);
      }
    }
  }

  std::vector<int> layer_bits(const std::string& where, const std::string& layer, const json& entry,
                              const std::string& field, const std::vector<int>& declared) const {
    if (!entry.is_object()) {
      fail("{}: layer '{}': expected {{\"{}\": [...]}} or {{\"tail_tr3\": [...]}}, got {}", where,
           layer, field, entry.dump());
    }
    for (const auto& [key, v] : entry.items()) {
      if (key != field && key != "tail_tr3") {
        fail(
            "{}: layer '{}': unknown key '{}'; hint: an entry holds '{}' (per-expert K) or "
            "'tail_tr3' (all experts K3)",
            where, layer, key, field);
      }
    }
    const bool has_field = entry.contains(field), has_tail = entry.contains("tail_tr3");
    if (has_field == has_tail) {
      fail("{}: layer '{}': {} '{}' and 'tail_tr3'; hint: exactly one of them (ambiguous)", where,
           layer, has_field ? "holds both" : "holds neither", field);
    }
    const size_t e = static_cast<size_t>(num_experts_);
    if (has_tail) {
      // The uniform-K3 spelling (e.g. an MTP overlay): the list must name every expert once.
      const json& t = entry["tail_tr3"];
      std::vector<bool> seen(e, false);
      bool ok = t.is_array() && t.size() == e;
      for (size_t i = 0; ok && i < t.size(); ++i) {
        const auto id = as_int(t[i]);
        ok = id && *id >= 0 && static_cast<size_t>(*id) < e && !seen[static_cast<size_t>(*id)];
        if (ok) seen[static_cast<size_t>(*id)] = true;
      }
      if (!ok) {
        fail(
            "{}: layer '{}': 'tail_tr3' must list every expert id 0..{} exactly once; hint: a "
            "partial tail would leave experts without a format",
            where, layer, e - 1);
      }
      if (std::find(declared.begin(), declared.end(), 3) == declared.end()) {
        fail("{}: layer '{}': 'tail_tr3' means K3, which {}.k_values does not declare", where,
             layer, kBlock);
      }
      return std::vector<int>(e, 3);
    }
    const json& ks = entry[field];
    if (!ks.is_array() || ks.size() != e) {
      fail("{}: layer '{}': '{}' must be an array of {} K values (one per expert), got {}", where,
           layer, field, e, ks.is_array() ? fmt::format("{} entries", ks.size()) : ks.dump());
    }
    std::vector<int> out;
    for (size_t i = 0; i < e; ++i) {
      const auto k = as_int(ks[i]);
      if (!k || std::find(declared.begin(), declared.end(), *k) == declared.end()) {
        fail("{}: layer '{}': expert {} has K {}, which {}.k_values {} does not declare", where,
             layer, i, ks[i].dump(), kBlock, fmt::join(declared, ","));
      }
      out.push_back(*k);
    }
    return out;
  }

  const json& b_;
  fs::path dir_;
  std::string label_;
  std::vector<int> layers_;
  int num_experts_ = 0;
};

// The model's own expert count, when config.json gives one.
void check_model_experts(const json& config, const MoeLayout& layout, const std::string& label) {
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (as_int(*it) != layout.num_experts) {
      fail(
          "{}: key '{}' is {}, but {}.experts_per_layer is {}; hint: the metadata and the "
          "model disagree on the expert count (refusing to guess)",
          label, key, it->dump(), kBlock, layout.num_experts);
    }
    return;
  }
}

}  // namespace

std::optional<MoeLayout> parse_hybrid_tr3_tail(const nlohmann::json& config,
                                               const std::filesystem::path& config_dir,
                                               const std::string& label) {
  const auto it = config.find(kBlock);
  if (it == config.end()) return std::nullopt;
  if (!it->is_object()) {
    fail("{}: key '{}': expected an object, got {}; hint: remove the key or fill it in", label,
         kBlock, it->dump());
  }
  MoeLayout layout = Parser(*it, config_dir, label).parse();
  check_model_experts(config, layout, label);
  return layout;
}

std::optional<MoeLayout> read_hybrid_tr3_tail(const std::filesystem::path& checkpoint_dir) {
  const fs::path cfg = checkpoint_dir / "config.json";
  json j;
  try {
    j = json::parse(read_text_file(cfg));
  } catch (const json::exception& e) {
    fail("{}: invalid JSON ({})", cfg.string(), e.what());
  }
  if (!j.is_object()) fail("{}: must be a JSON object", cfg.string());
  return parse_hybrid_tr3_tail(j, checkpoint_dir, cfg.string());
}

}  // namespace exl3::moe
