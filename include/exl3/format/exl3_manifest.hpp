// The `exl3-v1` slot container (docs/moe-layouts.md, exl3-v1 slot containers): a TP-independent
// store of MoE expert weights, one `exl3-manifest.json` plus one `exl3-layer-<NNNNN>.safetensors`
// per MoE layer, the intermediate axis cut into 32-channel slots; and the extent planner that
// deals those slots to tensor-parallel ranks.
//
// The manifest is validated strictly: every object rejects keys it does not know, every value is
// type- and range-checked, and read_exl3_manifest checks each layer file's sha256 and that its
// safetensors metadata echoes the manifest (schema, codebook, layer, geometry). Errors name the
// file, the key and the problem, and end with a hint.
//
// Extent rule (plan_exl3_extent): exactly one barrier, at num_slots / 2, splits the slots into
// two halves of whole `extent_alignment_slots` blocks (4 slots = 128 channels = one Hadamard
// block). The first ceil(tp/2) planning positions share the first half, the others the second;
// blocks are dealt as evenly as possible (the first positions get the remainder). A rank's
// position rotates per layer, position = (rank - layer * step) mod tp with step 2 at TP 10 and 1
// otherwise, so the unequal extents even out over the layers. No extent crosses the barrier.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace exl3 {

inline constexpr std::string_view kExl3ManifestFile = "exl3-manifest.json";
inline constexpr std::string_view kExl3Schema = "exl3-v1";
inline constexpr uint64_t kExl3McgSeed = 0xCBAC1FEDu;
inline constexpr int kExl3MinTp = 2, kExl3MaxTp = 24;

enum class Exl3SlotCodebook : uint8_t { kMcg, kLutE4m3, kLutFp16 };
std::string_view exl3_slot_codebook_name(Exl3SlotCodebook c);  // "mcg" | "lut_e4m3" | "lut_fp16"

struct Exl3Geometry {
  int64_t num_experts = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t slot_channels = 0;  // always 32
  int64_t num_slots = 0;      // intermediate_size / slot_channels
  std::vector<int> moe_layer_indices;  // ascending, distinct
};

struct Exl3Rates {
  enum class Structure : uint8_t { kUniform, kPerExpertPair };
  Structure structure = Structure::kUniform;
  int bits = 0;                         // uniform: 2..6
  std::vector<std::string> pair_kinds;  // per_expert_pair: a subset of P22 P33 P24 P43 P44
};

struct Exl3HadamardSpec {
  bool intermediate_hadamard = false;
  int64_t pre_block = 0;   // 0 or a power of two
  int64_t post_block = 0;
  bool per_expert_input_rotations = false;
};

struct Exl3SlotLayout {
  int64_t row_alignment = 0;           // bytes, positive
  int64_t extent_alignment_slots = 0;  // slots per dealt block, positive
  std::vector<int64_t> extent_barriers;
};

struct Exl3LayerEntry {
  std::string file;    // a bare file name inside the manifest's folder
  std::string sha256;  // 64 lowercase hex digits
};

struct Exl3Manifest {
  Exl3SlotCodebook codebook = Exl3SlotCodebook::kMcg;
  std::optional<uint64_t> codebook_seed;  // present iff mcg (0xCBAC1FED)
  Exl3Geometry geometry;
  Exl3Rates rates;
  Exl3HadamardSpec hadamard;
  Exl3SlotLayout layout;
  std::map<int, Exl3LayerEntry> layers;  // one per moe_layer_indices entry
  std::filesystem::path dir;             // where the layer files are (empty when parsed from text)
  std::string label;                     // what errors name

  // The geometry as the JSON text layer files echo in their `geometry` metadata (compact dump
  // of the manifest's geometry object, keys sorted).
  std::string geometry_json() const;
};

// Parses and validates manifest text (no file is opened). `label` names it in errors.
Exl3Manifest parse_exl3_manifest(std::string_view json_text, const std::string& label);
// Reads `<dir>/exl3-manifest.json` and checks every listed layer file: present, sha256 equal to
// the manifest's, and safetensors metadata `schema`, `codebook`, `layer`, `geometry` echoing it.
Exl3Manifest read_exl3_manifest(const std::filesystem::path& dir);

// Lowercase hex sha256 of a file's bytes (streamed; OpenSSL libcrypto).
std::string sha256_file_hex(const std::filesystem::path& path);
std::string sha256_hex(std::string_view bytes);

// One rank's share of a layer's intermediate slots: slots [first_slot, first_slot + slot_count).
struct Exl3Extent {
  int64_t first_slot = 0;
  int64_t slot_count = 0;
  int64_t slot_channels = 32;

  int64_t first_channel() const { return first_slot * slot_channels; }
  int64_t channels() const { return slot_count * slot_channels; }  // the local intermediate
  bool operator==(const Exl3Extent&) const = default;
};

// The extent of `rank` at MoE layer `layer` for `tp` ranks (see the header comment). Throws
// exl3::Error when tp is outside 2..24, the rank outside 0..tp-1, the layer not in the
// manifest, or the layout does not declare exactly one barrier at num_slots / 2 with halves
// divisible by extent_alignment_slots.
Exl3Extent plan_exl3_extent(const Exl3Manifest& manifest, int layer, int tp, int rank);

}  // namespace exl3
