// EXL3 checkpoint model: config.json, quantization_config.json, and discovery of every EXL3
// linear, unquantized tensor and MoE expert from the stored tensors (docs/format.md, Tensors per
// linear, What discovery validates and Checkpoint files).
//
// A linear is EXL3 when its prefix has `trellis` + (`suh` | `su`) + (`svh` | `sv`); K comes from
// the trellis width, in/out features from its shape, the codebook from the `mcg` / `mul1` marker.
// Discovery validates every linear fully (dtypes, shapes, marker values, finite suh/svh) and
// fails closed with an error naming the file and tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3 {

enum class Rotation : uint8_t { kSuhSvh, kSuSv };  // fp16 scales, or legacy packed signs
std::string_view rotation_name(Rotation r);       // "suh_svh" | "su_sv"

// MoE expert identity parsed from `...layers.{L}.mlp.experts.{E}.{proj}` style prefixes.
struct ExpertKey {
  int layer = -1;         // -1 when the prefix has no `layers.{L}` component
  int expert = -1;
  std::string proj;       // "gate_proj", "up_proj", "down_proj", "w1", ...
};

struct Exl3LinearInfo {
  std::string prefix;       // e.g. "model.layers.3.self_attn.q_proj"
  int64_t in_features = 0;  // stored (padded) dims; multiples of 128
  int64_t out_features = 0;
  int bits = 0;             // K, 1..8
  trellis::Codebook codebook = trellis::Codebook::k3Inst;
  Rotation rotation = Rotation::kSuhSvh;
  bool has_bias = false;
  uint64_t bytes = 0;       // all tensors stored for this linear
  std::optional<ExpertKey> expert;

  // Stored bits per weight including scales and bias: 8 * bytes / (in * out).
  double bits_per_weight() const;
};

// A tensor that is not part of an EXL3 linear.
struct PlainTensorInfo {
  std::string name;
  DType dtype = DType::kF16;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  std::string role;  // "embedding" | "norm" | "router" | "linear" | "bias" | "other"
};

// The parts of config.json exl3 understands. Absent keys stay 0 / empty.
struct ModelConfig {
  std::string architecture;  // architectures[0]
  std::string model_type;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t num_experts = 0;          // num_experts | num_local_experts | n_routed_experts
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_shared_experts = 0;
  double rms_norm_eps = 0.0;
  bool tie_word_embeddings = false;
  nlohmann::json quantization_config;  // null when absent
  nlohmann::json raw;                  // the whole config.json
};

// Parses config.json text; `label` names the file in errors.
ModelConfig parse_model_config(std::string_view json_text, const std::string& label);

// Summary of the MoE experts found for one layer.
struct MoeLayerInfo {
  int layer = -1;
  int num_experts = 0;                        // distinct expert indices seen
  std::vector<std::pair<int, int>> bits_histogram;  // (K, number of expert linears)
};

class Checkpoint {
 public:
  // PATH is a checkpoint folder or a single .safetensors file. Throws exl3::Error.
  static Checkpoint open(const std::filesystem::path& path);
  // A checkpoint over an already opened store (e.g. a source model's files overlaid with freshly
  // quantized linears); `path` labels errors. Discovery runs as in open().
  static Checkpoint from_store(TensorStore store, std::optional<ModelConfig> config,
                               const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const TensorStore& store() const { return store_; }
  const std::optional<ModelConfig>& config() const { return config_; }
  // quantization_config.json contents when present (null otherwise).
  const nlohmann::json& quantization_config_file() const { return qconfig_file_; }

  const std::vector<Exl3LinearInfo>& linears() const { return linears_; }  // sorted by prefix
  const std::vector<PlainTensorInfo>& plain_tensors() const { return plain_; }
  const std::vector<MoeLayerInfo>& moe_layers() const { return moe_layers_; }

  const Exl3LinearInfo* find_linear(std::string_view prefix) const;
  // Throws exl3::Error listing a few known prefixes when absent.
  const Exl3LinearInfo& linear(std::string_view prefix) const;

 private:
  std::filesystem::path path_;
  TensorStore store_;
  std::optional<ModelConfig> config_;
  nlohmann::json qconfig_file_;
  std::vector<Exl3LinearInfo> linears_;
  std::vector<PlainTensorInfo> plain_;
  std::vector<MoeLayerInfo> moe_layers_;
};

// Rank-sliced MoE checkpoints with the shared_h_v1 rotation layout (docs/moe-layouts.md, Rotation
// vectors) store the hidden-side vector of every expert projection once per layer and rank:
// `<...>.experts.{E}.{gate_proj|up_proj}.rank{r}` takes `suh` from
// `<...>.experts.shared_h.{proj}.rank{r}.suh`, and `down_proj` takes `svh` from `....svh`.
// Discovery and Exl3LinearData borrow that row when the expert has none of its own; whether the
// checkpoint declares shared_h_v1 is checked by the MoE loader (it needs config.json).
struct SharedHRow {
  std::string field;  // "suh" | "svh"
  std::string name;   // the shared row's tensor name
};
// nullopt unless `prefix` is a rank-sliced gate/up/down expert projection.
std::optional<SharedHRow> shared_h_row(std::string_view prefix);

// Discovers and validates the EXL3 linears and plain tensors of a store (no config needed).
// Exposed separately for the fuzzer and tests.
struct DiscoveryResult {
  std::vector<Exl3LinearInfo> linears;
  std::vector<PlainTensorInfo> plain;
  std::vector<MoeLayerInfo> moe_layers;
};
DiscoveryResult discover_tensors(const TensorStore& store);

// The host-memory tensors of one EXL3 linear, ready for decode. Small vectors are copied and
// converted (legacy su/sv expanded to +-1 fp16); the trellis is zero-copy when 2-byte aligned.
class Exl3LinearData {
 public:
  static Exl3LinearData load(const Checkpoint& ckpt, std::string_view prefix);
  static Exl3LinearData load(const TensorStore& store, const Exl3LinearInfo& info);

  const Exl3LinearInfo& info() const { return info_; }
  std::span<const uint16_t> trellis() const;  // [in/16, out/16, 16K] int16 bits
  const std::vector<uint16_t>& suh() const { return suh_; }  // fp16 bits, length in
  const std::vector<uint16_t>& svh() const { return svh_; }  // fp16 bits, length out
  const std::vector<float>& bias() const { return bias_; }   // empty when absent

 private:
  Exl3LinearInfo info_;
  const uint16_t* trellis_view_ = nullptr;  // into the mapping, when aligned
  std::vector<uint16_t> trellis_copy_;
  std::vector<uint16_t> suh_, svh_;
  std::vector<float> bias_;
};

}  // namespace exl3
