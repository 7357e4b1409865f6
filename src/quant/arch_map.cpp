// Architecture map: which source tensors of a Hugging Face model become EXL3 linears, how they are
// grouped for the bit allocation, and what is copied through. The key templates are the ones
// exllamav3's architecture definitions use for the supported models (docs/format.md, Checkpoint
// files).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/format/architectures.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/quant/convert.hpp"
#include "exl3/trellis/bitstream.hpp"

namespace exl3::quant {

namespace {

using ArchInfo = ArchitectureInfo;  // the supported-architecture table (format layer)

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    parts.push_back(s.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

int parse_index(std::string_view s) {
  int v = -1;
  if (s.empty() || s.size() > 9) return -1;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() ? v : -1;
}

// Natural order: digit runs compare as numbers, so layers.2 sorts before layers.10.
bool natural_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const auto da = a.substr(i, ie - i), db = b.substr(j, je - j);
      const auto ta = da.substr(std::min(da.find_first_not_of('0'), da.size()));
      const auto tb = db.substr(std::min(db.find_first_not_of('0'), db.size()));
      if (ta.size() != tb.size()) return ta.size() < tb.size();
      if (ta != tb) return ta < tb;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// Output order: embeddings, then layer by layer (norm + attention before the MLP), then any
// other top-level tensor, lm_head last -- the module order exllamav3 writes.
struct OrderKey {
  int section = 2;
  int layer = 0;
  int in_layer = 0;
};

OrderKey order_key(std::string_view name) {
  const auto parts = split_dots(name);
  if (parts[0] == "lm_head") return {3, 0, 0};
  if (parts.size() >= 2 && parts[0] == "model" && parts[1] == "embed_tokens") return {0, 0, 0};
  if (parts.size() >= 4 && parts[0] == "model" && parts[1] == "layers") {
    const int l = parse_index(parts[2]);
    if (l >= 0) {
      int r = 2;
      if (parts[3] == "input_layernorm")
        r = 0;
      else if (parts[3] == "self_attn" || parts[3] == "linear_attn")
        r = 1;
      else if (parts[3] == "mlp" || parts[3] == "block_sparse_moe")
        r = 3;
      return {1, l, r};
    }
  }
  return {2, 0, 0};
}

bool is_float(DType t) {
  return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32 || t == DType::kF64;
}

int64_t pad128(int64_t n) {
  return (n + 127) / 128 * 128;
}

// What a recognised linear weight name says about its place in the model.
struct LinearKey {
  int layer = -1;
  int expert = -1;         // routed expert index
  bool shared = false;     // GLM shared expert
  bool delta_net = false;  // a gated DeltaNet projection (linear_attn)
  std::string proj;        // q_proj, ..., down_proj
  std::string prefix;      // the name without ".weight"
};

const std::set<std::string_view> kAttnProj = {"q_proj", "k_proj", "v_proj", "o_proj"};
// Multi-head latent attention's quantized projections, as exllamav3 converts them: kv_b_proj is
// carried unquantized (attention folds it into the query and the output per head, so it is a
// batched product rather than a linear), like the DSA indexer's weights.
const std::set<std::string_view> kMlaProj = {"q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                                             "o_proj"};
const std::set<std::string_view> kMlpProj = {"gate_proj", "up_proj", "down_proj"};
// A gated DeltaNet layer's quantized projections (Qwen3-Next's; Qwen3.5's split ones). in_proj_ba
// (Qwen3.5: in_proj_b, in_proj_a), one or two values per value head feeding the decay and the
// write strength, stays unquantized: a few hundred KiB per layer.
const std::set<std::string_view> kDeltaNetProj = {"in_proj_qkvz", "out_proj"};
const std::set<std::string_view> kSplitDeltaNetProj = {"in_proj_qkv", "in_proj_z", "out_proj"};
const std::set<std::string_view>& delta_net_projections(const model::GatedDeltaNetSpec& d) {
  return d.split_inputs ? kSplitDeltaNetProj : kDeltaNetProj;
}

class Planner {
 public:
  Planner(const ModelConfig& cfg, const TensorStore& store, const ArchInfo& arch,
          const std::map<std::string, DenseFormat>& formats)
      : cfg_(cfg),
        store_(store),
        arch_(arch),
        formats_(formats),
        label_(store.root().string()),
        spec_(model::describe_model(cfg, (store.root() / "config.json").string())) {}

  ConversionPlan run(double bits, int head_bits);

 private:
  std::optional<LinearKey> parse_linear(const std::string& name) const;
  // Layer l's MoE description, or nullptr for a dense layer (or an index past the decoder).
  const model::MoeSpec* moe_of(int l) const;
  // Layer l's gated DeltaNet description, or nullptr when its attention is softmax attention.
  const model::GatedDeltaNetSpec* delta_net_of(int l) const;
  // Whether layer l's attention is MLA (the architecture's flag past the decoder: MTP layers).
  bool layer_is_mla(int l) const;
  // The name of layer l's MLP block under model.layers.l ("mlp", "block_sparse_moe").
  std::string_view mlp_block(int l) const;
  void add_linear(const LinearKey& key, const TensorRef& w);
  // transformers' fused experts of MoE layer l (gpt-oss), as one linear per expert and projection.
  void add_fused_experts(int l, const model::MoeSpec& m);
  void add_plain(const TensorRef& t);
  void check_structure() const;
  bool layer_is_moe(int l) const;
  void add_head(int head_bits);
  void allocate(double bits, int head_bits, ConversionPlan& plan);

  const ModelConfig& cfg_;
  const TensorStore& store_;
  const ArchInfo& arch_;
  const std::map<std::string, DenseFormat>& formats_;  // dense linears kept out of EXL3
  std::string label_;
  model::ModelSpec spec_;  // the layers' attention and MLP kinds, read once by the model layer
  std::vector<PlanItem> items_;
  std::set<std::string> consumed_;  // source tensors already mapped (biases of linears)
  // Structure bookkeeping for the completeness check.
  std::map<int, std::set<std::string>> attn_, dense_, shared_;
  std::map<int, std::map<int, std::set<std::string>>> experts_;
};

std::optional<LinearKey> Planner::parse_linear(const std::string& name) const {
  const auto p = split_dots(name);
  if (p.size() < 2 || p.back() != "weight") return std::nullopt;
  LinearKey k;
  k.prefix = name.substr(0, name.size() - 7);
  if (p.size() == 2 && p[0] == "lm_head") {
    k.proj = "lm_head";
    return k;
  }
  if (p.size() < 6 || p[0] != "model" || p[1] != "layers") return std::nullopt;
  k.layer = parse_index(p[2]);
  if (k.layer < 0) return std::nullopt;
  if (p.size() == 6 && p[3] == "self_attn" &&
      (layer_is_mla(k.layer) ? kMlaProj.contains(p[4]) : kAttnProj.contains(p[4]))) {
    k.proj = std::string(p[4]);
    return k;
  }
  if (const model::GatedDeltaNetSpec* d = delta_net_of(k.layer);
      d != nullptr && p.size() == 6 && p[3] == "linear_attn" &&
      delta_net_projections(*d).contains(p[4])) {
    k.proj = std::string(p[4]);
    k.delta_net = true;
    return k;
  }
  // Routed experts under the family's own names (Mixtral: block_sparse_moe.experts.E.w1/w3/w2),
  // recorded under the canonical gate_proj / up_proj / down_proj.
  if (const model::MoeSpec* m = moe_of(k.layer);
      m != nullptr && m->block != "mlp" && p.size() == 8 && p[3] == m->block && p[4] == "experts") {
    for (size_t i = 0; i < 3; ++i) {
      if (p[6] != m->expert_proj[i]) continue;
      k.expert = parse_index(p[5]);
      if (k.expert < 0) return std::nullopt;
      k.proj = i == 0 ? "gate_proj" : (i == 1 ? "up_proj" : "down_proj");
      return k;
    }
    return std::nullopt;
  }
  if (p[3] != mlp_block(k.layer)) return std::nullopt;
  if (p.size() == 6 && kMlpProj.contains(p[4])) {
    k.proj = std::string(p[4]);
    return k;
  }
  // Qwen3-Next names its one (gated) shared expert `shared_expert`.
  if (p.size() == 7 && p[4] == "shared_expert" && kMlpProj.contains(p[5])) {
    const model::MoeSpec* m = moe_of(k.layer);
    if (m == nullptr || !m->shared || !m->shared->prefix.ends_with(".shared_expert"))
      return std::nullopt;
    k.shared = true;
    k.proj = std::string(p[5]);
    return k;
  }
  if (p.size() == 7 && p[4] == "shared_experts" && kMlpProj.contains(p[5])) {
    if (!arch_.shared_experts) {
      fail("{}: tensor '{}': shared experts are not part of {} (unsupported layout)", label_, name,
           arch_.hf_name);
    }
    k.shared = true;
    k.proj = std::string(p[5]);
    return k;
  }
  if (p.size() == 8 && p[4] == "experts" && kMlpProj.contains(p[6])) {
    k.expert = parse_index(p[5]);
    if (k.expert < 0) return std::nullopt;
    if (!arch_.moe) {
      fail("{}: tensor '{}': routed experts in a dense {} model (unsupported layout)", label_, name,
           arch_.hf_name);
    }
    k.proj = std::string(p[6]);
    return k;
  }
  return std::nullopt;
}

void Planner::add_linear(const LinearKey& key, const TensorRef& w) {
  const auto& info = *w.info;
  if (!is_float(info.dtype)) {
    fail(
        "{}: tensor '{}': dtype {} is not supported for a linear weight (expected BF16, F16 or "
        "F32; dequantize FP8/MXFP4 sources first)",
        w.path().string(), info.name, dtype_name(info.dtype));
  }
  if (info.rank() != 2 || info.shape[0] <= 0 || info.shape[1] <= 0) {
    fail(
        "{}: tensor '{}': shape [{}] cannot be handled (a linear weight must be 2-D [out, in] "
        "with positive dims)",
        w.path().string(), info.name, fmt::join(info.shape, ", "));
  }
  PlanItem it;
  it.kind = PlanItem::Kind::kExl3Linear;
  it.name = key.proj == "lm_head" ? "lm_head" : key.prefix;
  it.source = info.name;
  it.out_features = info.shape[0];
  it.in_features = info.shape[1];
  it.layer = key.layer;
  if (const TensorRef* b = store_.find(key.prefix + ".bias")) {
    const auto& bi = *b->info;
    if (!is_float(bi.dtype) || bi.rank() != 1 || bi.shape[0] != it.out_features) {
      fail("{}: tensor '{}': bias must be a float vector of {} (out_features), got {} [{}]",
           b->path().string(), bi.name, it.out_features, dtype_name(bi.dtype),
           fmt::join(bi.shape, ", "));
    }
    it.bias = bi.name;
    consumed_.insert(bi.name);
  }
  if (key.proj == "lm_head") {
    it.role = LinearRole::kHead;
  } else if (key.layer >= cfg_.num_hidden_layers) {
    it.role = LinearRole::kMtp;
    it.group = it.name;
  } else {
    it.role = LinearRole::kDecoder;
    const std::string lp = fmt::format("model.layers.{}.", key.layer);
    const bool gate_up = key.proj == "gate_proj" || key.proj == "up_proj";
    if (key.delta_net) {
      attn_[key.layer].insert(key.proj);
      it.group = lp + (key.proj == "out_proj" ? "linear_attn.out" : "linear_attn.in");
    } else if (kAttnProj.contains(key.proj) || kMlaProj.contains(key.proj)) {
      // MLA: q (or its LoRA pair) and kv_a read the layer input like q/k/v do.
      attn_[key.layer].insert(key.proj);
      it.group = lp + (key.proj == "o_proj" ? "self_attn.o" : "self_attn.qkv");
    } else if (key.shared) {
      shared_[key.layer].insert(key.proj);
      it.group = lp + (gate_up ? "mlp.shared_experts.gate_up" : "mlp.shared_experts.down");
    } else if (key.expert >= 0) {
      // The MoE layouts read experts as whole 128-channel blocks, unpadded: a narrower expert
      // would convert into a checkpoint no runtime loads. (Experts with biases or another
      // activation run as linears, which are padded.)
      const model::MoeSpec* moe = moe_of(key.layer);
      const bool blocks = moe == nullptr || moe->plain_experts();
      if (blocks && (it.in_features % 128 != 0 || it.out_features % 128 != 0)) {
        fail(
            "{}: tensor '{}': routed expert [{}, {}] is not a multiple of 128 on both sides; EXL3 "
            "experts are stored unpadded (hidden_size and moe_intermediate_size must be multiples "
            "of 128)",
            w.path().string(), info.name, it.out_features, it.in_features);
      }
      experts_[key.layer][key.expert].insert(key.proj);
      it.group = lp + (gate_up ? "mlp.experts.gate_up" : "mlp.experts.down");
    } else {
      dense_[key.layer].insert(key.proj);
      it.group = lp + (gate_up ? "mlp.gate_up" : "mlp.down");
    }
    if (const auto f = formats_.find(it.name); f != formats_.end()) {
      it.kind = PlanItem::Kind::kDenseLinear;  // --dense-format: outside the bit budget
      it.dense_format = f->second;
    }
  }
  items_.push_back(std::move(it));
}

void Planner::add_fused_experts(int l, const model::MoeSpec& m) {
  const std::string p = m.prefix + ".experts.";
  const int64_t hidden = spec_.hidden_size, inter = m.intermediate;
  const std::string lp = fmt::format("model.layers.{}.", l);
  struct Part {
    const char* proj;
    const char* tensor;
    int64_t in;
    FusedColumns cols;
  };
  // gate_up_proj interleaves the gate (even columns) and up (odd columns) channels.
  const Part parts[] = {{"gate_proj", "gate_up_proj", hidden, {0, 2, 0, inter}},
                        {"up_proj", "gate_up_proj", hidden, {1, 2, 0, inter}},
                        {"down_proj", "down_proj", inter, {0, 1, 0, hidden}}};
  for (const Part& part : parts) {
    const FusedExpertTensor t =
        fused_expert_tensor(store_, p + part.tensor, m.num_experts, part.in);
    if (t.columns != part.cols.stride * part.cols.count) {
      fail("{}: tensor '{}' has {} columns, expected {} (intermediate_size {}, hidden_size {})",
           label_, t.name, t.columns, part.cols.stride * part.cols.count, inter, hidden);
    }
    const std::string bias = p + part.tensor + "_bias";
    if (!store_.contains(bias)) fail("{}: missing weights: tensor '{}' not found", label_, bias);
    // MXFP4 experts are dequantized here, so neither their blocks nor scales are copied.
    for (const TensorRef* r : {t.dense, t.blocks, t.scales})
      if (r != nullptr) consumed_.insert(r->name());
    consumed_.insert(bias);
    for (int64_t e = 0; e < m.num_experts; ++e) {
      const std::string name = fmt::format("{}{}.{}", p, e, part.proj);
      if (formats_.contains(name)) {
        fail("{}: --dense-format cannot keep '{}': it is cut from the fused tensor '{}'", label_,
             name, t.name);
      }
      PlanItem it;
      it.kind = PlanItem::Kind::kExl3Linear;
      it.name = name;
      it.source = t.name;
      it.bias = bias;
      it.fused_expert = e;
      it.fused_columns = part.cols;
      it.in_features = part.in;
      it.out_features = part.cols.count;
      it.layer = l;
      it.role = LinearRole::kDecoder;
      // These experts run as biased linears, never through the MoE layouts' 128-channel blocks,
      // so they are padded like any linear (gpt-oss's 2880 channels are not a multiple of 128).
      const bool gate_up = part.cols.stride == 2;
      it.group = lp + (gate_up ? "mlp.experts.gate_up" : "mlp.experts.down");
      experts_[l][static_cast<int>(e)].insert(part.proj);
      items_.push_back(std::move(it));
    }
  }
}

void Planner::add_plain(const TensorRef& t) {
  const auto& info = *t.info;
  const std::string& n = info.name;
  // Fused projections (Phi-3 qkv_proj / gate_up_proj, transformers' 3-D fused experts) would need
  // splitting, which none of the supported architectures' checkpoints use.
  if (n.find(".mlp.experts.") != std::string::npos && info.rank() == 3) {
    fail(
        "{}: tensor '{}': fused 3-D expert tensor [{}] cannot be handled (expected per-expert "
        "'mlp.experts.E.{{gate,up,down}}_proj.weight' keys)",
        t.path().string(), n, fmt::join(info.shape, ", "));
  }
  if (n.ends_with("qkv_proj.weight") || n.ends_with("gate_up_proj.weight")) {
    fail(
        "{}: tensor '{}': fused projection cannot be handled for {} (expected separate "
        "q/k/v and gate/up projections)",
        t.path().string(), n, arch_.hf_name);
  }
  PlanItem it;
  it.kind = PlanItem::Kind::kPlain;
  it.name = n;
  it.source = n;
  const auto parts = split_dots(n);
  const bool router = n.ends_with("mlp.gate.weight") || n.ends_with("mlp.router.weight") ||
                      n.ends_with("mlp.router.bias") ||
                      n.ends_with("block_sparse_moe.gate.weight") ||
                      n.ends_with("e_score_correction_bias");
  if (std::find(parts.begin(), parts.end(), "embed_tokens") != parts.end())
    it.role_name = "embedding";
  else if (router)
    it.role_name = "router";
  else if (n.find("norm") != std::string::npos)
    it.role_name = "norm";
  else if (n.ends_with(".bias"))
    it.role_name = "bias";
  else if (info.rank() == 2)
    it.role_name = "linear";
  else
    it.role_name = "other";
  // exllamav3 keeps bf16/fp16 as stored, loads fp32 as fp16, and stores routers in fp16.
  it.out_dtype = info.dtype;
  if (is_float(info.dtype) && (router || info.dtype == DType::kF32 || info.dtype == DType::kF64)) {
    it.out_dtype = DType::kF16;
  }
  items_.push_back(std::move(it));
}

const model::MoeSpec* Planner::moe_of(int l) const {
  if (l < 0 || static_cast<size_t>(l) >= spec_.layers.size()) return nullptr;
  return std::get_if<model::MoeSpec>(&spec_.layers[static_cast<size_t>(l)].mlp);
}

bool Planner::layer_is_mla(int l) const {
  if (l < 0 || static_cast<size_t>(l) >= spec_.layers.size()) return arch_.mla;
  return std::holds_alternative<model::MlaAttentionSpec>(
      spec_.layers[static_cast<size_t>(l)].attention);
}

std::string_view Planner::mlp_block(int l) const {
  if (l < 0 || static_cast<size_t>(l) >= spec_.layers.size()) return "mlp";
  const auto& layer = spec_.layers[static_cast<size_t>(l)];
  if (const auto* m = std::get_if<model::MoeSpec>(&layer.mlp)) return m->block;
  const std::string& prefix = std::get<model::DenseMlpSpec>(layer.mlp).prefix;
  return std::string_view(prefix).substr(layer.prefix.size() + 1);
}

const model::GatedDeltaNetSpec* Planner::delta_net_of(int l) const {
  if (l < 0 || static_cast<size_t>(l) >= spec_.layers.size()) return nullptr;
  return std::get_if<model::GatedDeltaNetSpec>(&spec_.layers[static_cast<size_t>(l)].attention);
}

bool Planner::layer_is_moe(int l) const {
  return std::holds_alternative<model::MoeSpec>(spec_.layers.at(static_cast<size_t>(l)).mlp);
}

void Planner::check_structure() const {
  const std::string lbl = label_;
  auto missing = [&](const std::string& name) {
    fail("{}: missing weights: tensor '{}' not found (the {} layout needs it)", lbl, name,
         arch_.hf_name);
  };
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    const std::string lp = fmt::format("model.layers.{}.", l);
    std::vector<std::string_view> projections(kAttnProj.begin(), kAttnProj.end());
    std::string attn_part = "self_attn.";
    if (const model::GatedDeltaNetSpec* d = delta_net_of(l); d != nullptr && d->kimi) {
      // KDA: q/k/v/o_proj quantized like attention's; its convolutions, gates and norm kept.
      for (const char* t : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight", "A_log",
                            "dt_bias", "b_proj.weight", "f_a_proj.weight", "f_b_proj.weight",
                            "g_a_proj.weight", "g_b_proj.weight", "o_norm.weight"}) {
        if (!store_.contains(d->prefix + "." + t)) missing(d->prefix + "." + t);
      }
    } else if (d != nullptr) {
      projections.assign(delta_net_projections(*d).begin(), delta_net_projections(*d).end());
      attn_part = "linear_attn.";
      std::vector<std::string> kept = {"conv1d.weight", "A_log", "dt_bias", "norm.weight"};
      if (d->split_inputs) {
        kept.insert(kept.end(), {"in_proj_b.weight", "in_proj_a.weight"});
      } else {
        kept.push_back("in_proj_ba.weight");
      }
      for (const auto& t : kept)
        if (!store_.contains(d->prefix + "." + t)) missing(d->prefix + "." + t);
    } else if (const auto* mla = std::get_if<model::MlaAttentionSpec>(
                   &spec_.layers.at(static_cast<size_t>(l)).attention)) {
      projections = {"kv_a_proj_with_mqa", "o_proj"};
      if (mla->q_lora_rank > 0) {
        projections.insert(projections.end(), {"q_a_proj", "q_b_proj"});
      } else {
        projections.push_back("q_proj");
      }
      if (!store_.contains(lp + "self_attn.kv_b_proj.weight"))
        missing(lp + "self_attn.kv_b_proj.weight");
    }
    for (const auto& p : projections) {
      if (!attn_.contains(l) || !attn_.at(l).contains(std::string(p))) {
        missing(lp + attn_part + std::string(p) + ".weight");
      }
    }
    const bool moe = arch_.moe && layer_is_moe(l);
    if (!moe) {
      if (experts_.contains(l)) {
        fail("{}: layer {} has routed experts but {} expects a dense MLP there", lbl, l,
             arch_.hf_name);
      }
      for (const auto& p : kMlpProj) {
        if (!dense_.contains(l) || !dense_.at(l).contains(std::string(p))) {
          missing(lp + std::string(mlp_block(l)) + "." + std::string(p) + ".weight");
        }
      }
      continue;
    }
    if (dense_.contains(l)) {
      fail("{}: layer {} has a dense MLP but {} expects routed experts there", lbl, l,
           arch_.hf_name);
    }
    const model::MoeSpec& ms = *moe_of(l);
    const std::string router = lp + ms.block + "." + ms.router_name + ".weight";
    if (!store_.contains(router)) missing(router);
    for (int e = 0; e < cfg_.num_experts; ++e) {
      size_t i = 0;
      for (const auto& p : {"gate_proj", "up_proj", "down_proj"}) {
        if (!experts_.contains(l) || !experts_.at(l).contains(e) ||
            !experts_.at(l).at(e).contains(std::string(p))) {
          missing(fmt::format("{}{}.experts.{}.{}.weight", lp, ms.block, e, ms.expert_proj[i]));
        }
        ++i;
      }
    }
    if (experts_.contains(l) && experts_.at(l).rbegin()->first >= cfg_.num_experts) {
      fail("{}: layer {}: expert {} found but config.json declares {} experts", lbl, l,
           experts_.at(l).rbegin()->first, cfg_.num_experts);
    }
    if (const auto& sh = ms.shared) {
      for (const auto& p : kMlpProj) {
        if (!shared_.contains(l) || !shared_.at(l).contains(std::string(p))) {
          missing(sh->prefix + "." + std::string(p) + ".weight");
        }
      }
    }
  }
  if (!store_.contains("model.embed_tokens.weight")) missing("model.embed_tokens.weight");
}

void Planner::add_head(int head_bits) {
  const TensorRef* head = store_.find("lm_head.weight");
  bool tied = false;
  if (head == nullptr) {
    if (!cfg_.tie_word_embeddings) {
      fail(
          "{}: missing weights: tensor 'lm_head.weight' not found and config.json has no "
          "tie_word_embeddings",
          label_);
    }
    head = &store_.at("model.embed_tokens.weight");
    tied = true;
  }
  if (head_bits == kHeadBitsUnquantized) {
    // An unquantized head is a plain `lm_head.weight`; a tied one is simply the embedding, which
    // the runtime falls back to when no lm_head tensors exist (docs/format.md, Checkpoint files).
    if (!tied) add_plain(*head);
    return;
  }
  LinearKey k;
  k.proj = "lm_head";
  k.prefix = "lm_head";
  add_linear(k, *head);
  if (tied) items_.back().name = "lm_head";
}

void Planner::allocate(double bits, int head_bits, ConversionPlan& plan) {
  std::vector<AllocGroup> groups;
  std::map<std::string, size_t> index;
  static const std::map<std::string_view, int> kRank = {
      {"self_attn.qkv", 0},          {"self_attn.o", 1},      {"linear_attn.in", 0},
      {"linear_attn.out", 1},        {"mlp.gate_up", 2},      {"mlp.down", 3},
      {"mlp.experts.gate_up", 4},    {"mlp.experts.down", 5}, {"mlp.shared_experts.gate_up", 6},
      {"mlp.shared_experts.down", 7}};
  for (const auto& it : items_) {
    if (it.kind != PlanItem::Kind::kExl3Linear || it.role != LinearRole::kDecoder) continue;
    auto [pos, fresh] = index.try_emplace(it.group, groups.size());
    if (fresh) {
      const std::string lp = fmt::format("model.layers.{}.", it.layer);
      groups.push_back(
          {it.group, it.layer, kRank.at(std::string_view(it.group).substr(lp.size())), 0});
    }
    groups[pos->second].weights += pad128(it.in_features) * pad128(it.out_features);
  }
  const bool any_dense = std::any_of(items_.begin(), items_.end(), [](const PlanItem& it) {
    return it.kind == PlanItem::Kind::kDenseLinear;
  });
  if (groups.empty() && !any_dense)
    fail("{}: no decoder linears found for {}", label_, arch_.hf_name);
  // Every decoder linear may be dense (--dense-format on a dense model): no EXL3 budget then.
  const auto k = groups.empty()
                     ? std::vector<int>{}
                     : allocate_bits(groups, static_cast<int>(cfg_.num_hidden_layers), bits);
  long double num = 0, den = 0;
  for (auto& it : items_) {
    if (it.kind != PlanItem::Kind::kExl3Linear) continue;
    if (it.role == LinearRole::kHead)
      it.bits = head_bits;
    else if (it.role == LinearRole::kMtp)
      it.bits = kMtpBits;
    else {
      it.bits = k[index.at(it.group)];
      const auto w = static_cast<long double>(pad128(it.in_features) * pad128(it.out_features));
      num += w * it.bits;
      den += w;
    }
  }
  plan.bits_achieved = den > 0 ? static_cast<double>(num / den) : 0.0;
}

ConversionPlan Planner::run(double bits, int head_bits) {
  for (const auto& layer : spec_.layers) {
    const auto* m = std::get_if<model::MoeSpec>(&layer.mlp);
    if (m == nullptr) continue;
    if (has_fused_expert_tensor(store_, m->prefix + ".experts.gate_up_proj"))
      add_fused_experts(layer.index, *m);
  }
  for (const auto& name : store_.names()) {
    const TensorRef& t = store_.at(name);
    if (name == "lm_head.weight") continue;  // handled with head_bits below
    if (const auto key = parse_linear(name)) {
      add_linear(*key, t);
    }
  }
  for (const auto& name : store_.names()) {
    if (name == "lm_head.weight" || consumed_.contains(name)) continue;
    const TensorRef& t = store_.at(name);
    if (!parse_linear(name)) add_plain(t);
  }
  check_structure();
  add_head(head_bits);

  ConversionPlan plan;
  plan.architecture = arch_.hf_name;
  plan.num_layers = cfg_.num_hidden_layers;
  plan.tied_head = !store_.contains("lm_head.weight");
  plan.bits_target = bits;
  plan.head_bits = head_bits;
  allocate(bits, head_bits, plan);
  std::stable_sort(items_.begin(), items_.end(), [](const PlanItem& a, const PlanItem& b) {
    const OrderKey ka = order_key(a.name), kb = order_key(b.name);
    if (ka.section != kb.section) return ka.section < kb.section;
    if (ka.layer != kb.layer) return ka.layer < kb.layer;
    if (ka.in_layer != kb.in_layer) return ka.in_layer < kb.in_layer;
    return natural_less(a.name, b.name);
  });
  plan.items = std::move(items_);
  return plan;
}

}  // namespace

ConversionPlan plan_conversion(const ModelConfig& config, const TensorStore& store, double bits,
                               int head_bits, const std::map<std::string, DenseFormat>& dense) {
  if (!std::isfinite(bits) || bits < trellis::kMinBits || bits > trellis::kMaxBits) {
    fail("quantize: --bits {} outside {}..{}", bits, trellis::kMinBits, trellis::kMaxBits);
  }
  if (!trellis::valid_bits(head_bits) && head_bits != kHeadBitsUnquantized) {
    fail("quantize: --head-bits {} must be in 1..8, or 16 to keep lm_head unquantized", head_bits);
  }
  const ArchInfo* arch = find_architecture(config.architecture);
  if (arch == nullptr) {
    fail("{}: architecture '{}' is not supported for conversion (supported: {})",
         store.root().string(), config.architecture, supported_architecture_names());
  }
  if (config.num_hidden_layers <= 0) {
    fail("{}: config.json: num_hidden_layers must be positive", store.root().string());
  }
  if (arch->moe && config.num_experts <= 0) {
    fail("{}: config.json: {} needs num_experts (or num_local_experts / n_routed_experts)",
         store.root().string(), arch->hf_name);
  }
  return Planner(config, store, *arch, dense).run(bits, head_bits);
}

}  // namespace exl3::quant
