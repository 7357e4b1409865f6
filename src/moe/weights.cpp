// MoeLayerWeights accessors and the per-layer, per-rank loader (see weights.hpp).
#include "exl3/moe/weights.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/tile.hpp"
#include "moe/name_scan.hpp"
#include "moe/tensor_checks.hpp"

namespace exl3::moe {

cpu::LinearView ProjWeights::view(trellis::Codebook cb) const {
  cpu::LinearView v;
  v.trellis = trellis;
  v.in_features = in_features;
  v.out_features = out_features;
  v.bits = bits;
  v.codebook = cb;
  v.suh = suh;
  v.svh = svh;
  return v;
}

int ExpertWeights::bits() const {
  return gate.bits == up.bits && up.bits == down.bits ? gate.bits : 0;
}

uint64_t MoeLayerWeights::owned_bytes() const {
  uint64_t n = rotations.gate_suh.size() + rotations.up_suh.size() + rotations.down_svh.size() +
               rotations.intermediate.size();
  for (const auto& c : trellis_copies) n += c.size();
  return n * sizeof(uint16_t);
}

uint64_t MoeLayerWeights::trellis_bytes() const {
  uint64_t n = 0;
  for (const auto& e : experts)
    n += e.gate.trellis.size() + e.up.trellis.size() + e.down.trellis.size();
  return n * sizeof(uint16_t);
}

std::vector<std::pair<int, int>> MoeLayerWeights::tier_signature() const {
  std::vector<int> bits;
  for (const auto& e : experts) bits.push_back(e.bits());
  return moe::tier_signature(bits);
}

namespace {

// Loads one layer; the state shared by all its projections lives here.
class LayerLoader {
 public:
  LayerLoader(const TensorStore& store, const MoeLayout& layout, int layer, int rank)
      : store_(store), layout_(layout), layer_(layer), rank_(rank) {
    w_.layer = layer;
    w_.rank = rank;
    w_.tp = layout.tp;
    w_.rotation = layout.rotation;
  }

  MoeLayerWeights load() {
    const auto& bits = layout_.bits_of(layer_);
    const int n = layout_.num_experts;
    const int r = layout_.rank_sliced() ? rank_ : -1;
    // Geometry from expert 0's gate (checked like every other trellis), then the tables.
    const TrellisShape g0 = check_trellis(
        trellis_ref(expert_prefix(layer_, 0, Proj::kGate, r, layout_.naming)), bits[0], 0, 0);
    w_.hidden = g0.in;
    w_.intermediate = g0.out;
    const size_t h = static_cast<size_t>(w_.hidden), i = static_cast<size_t>(w_.intermediate);
    auto& rot = w_.rotations;
    rot.h_rows = layout_.rotation == RotationLayout::kSharedH ? 1 : n;
    for (auto* t : {&rot.gate_suh, &rot.up_suh, &rot.down_svh})
      t->assign(static_cast<size_t>(rot.h_rows) * h, 0);
    rot.intermediate.assign(static_cast<size_t>(n) * 3 * i, 0);
    if (layout_.rotation == RotationLayout::kSharedH) {
      for (const Proj p : kProjs) load_shared_row(p);
    }
    w_.experts.resize(static_cast<size_t>(n));
    for (int e = 0; e < n; ++e) {
      auto& ex = w_.experts[static_cast<size_t>(e)];
      ex.gate = load_proj(e, Proj::kGate, bits[static_cast<size_t>(e)]);
      ex.up = load_proj(e, Proj::kUp, bits[static_cast<size_t>(e)]);
      ex.down = load_proj(e, Proj::kDown, bits[static_cast<size_t>(e)]);
    }
    return std::move(w_);
  }

 private:
  std::span<uint16_t> hidden_row(Proj p, int e) {
    auto& rot = w_.rotations;
    auto& t = p == Proj::kGate ? rot.gate_suh : (p == Proj::kUp ? rot.up_suh : rot.down_svh);
    const size_t row = rot.h_rows == 1 ? 0 : static_cast<size_t>(e);
    return std::span<uint16_t>(t).subspan(row * static_cast<size_t>(w_.hidden),
                                          static_cast<size_t>(w_.hidden));
  }
  std::span<uint16_t> intermediate_row(Proj p, int e) {
    const size_t i = static_cast<size_t>(w_.intermediate);
    const size_t slot = static_cast<size_t>(p);  // gate_svh | up_svh | down_suh
    return std::span<uint16_t>(w_.rotations.intermediate)
        .subspan((static_cast<size_t>(e) * 3 + slot) * i, i);
  }

  const TensorRef& trellis_ref(const std::string& prefix) const {
    const TensorRef* t = store_.find(prefix + ".trellis");
    if (t == nullptr) {
      fail(
          "{}: tensor '{}.trellis' is missing (MoE layer {}, rank {}); hint: an incomplete "
          "download, or a checkpoint for another TP or expert count",
          store_.root().string(), prefix, layer_, rank_);
    }
    return *t;
  }

  void note_read(const TensorRef& ref) { w_.tensors_read.push_back(ref.name()); }

  void copy_vector(const TensorRef& ref, int64_t length, const char* what,
                   std::span<uint16_t> dst) {
    check_fp16_vector(ref, length, what);
    const auto bytes = ref.bytes();
    std::memcpy(dst.data(), bytes.data(), bytes.size());
    note_read(ref);
  }

  // Under shared_h_v1: one hidden-side row per projection for every expert of this rank.
  void load_shared_row(Proj p) {
    const std::string name = shared_h_name(layer_, p, rank_);
    const TensorRef* ref = store_.find(name);
    if (ref == nullptr) {
      fail(
          "{}: tensor '{}' is missing; hint: shared_h_v1 stores the {} {} once per layer and "
          "rank there",
          store_.root().string(), name, proj_name(p), hidden_side_field(p));
    }
    copy_vector(*ref, w_.hidden, "a shared-H row (length H)", hidden_row(p, 0));
  }

  std::span<const uint16_t> trellis_span(const TensorRef& ref) {
    note_read(ref);
    const auto bytes = ref.bytes();
    const size_t words = bytes.size() / sizeof(uint16_t);
    if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint16_t) != 0) {
      w_.trellis_copies.push_back(copy_tensor<uint16_t>(ref));
      return w_.trellis_copies.back();
    }
    // Zero-copy: keep the mapping alive as long as the view.
    for (const auto& f : store_.files()) {
      if (f.get() == ref.file &&
          std::find(w_.mapped_files.begin(), w_.mapped_files.end(), f) == w_.mapped_files.end()) {
        w_.mapped_files.push_back(f);
      }
    }
    return {reinterpret_cast<const uint16_t*>(bytes.data()), words};
  }

  // The fp16 vector `field` of a plain expert: `.suh`/`.svh`, or legacy packed signs `.su`/`.sv`.
  void plain_vector(const std::string& prefix, const char* field, int64_t length,
                    std::span<uint16_t> dst) {
    if (const TensorRef* ref = store_.find(prefix + "." + field)) {
      copy_vector(*ref, length, field, dst);
      return;
    }
    const std::string legacy = field[1] == 'u' ? "su" : "sv";
    const TensorRef* ref = store_.find(prefix + "." + legacy);
    if (ref == nullptr) {
      fail("{}: EXL3 expert '{}' has no '{}' (or legacy '{}')", store_.root().string(), prefix,
           field, legacy);
    }
    check_legacy_signs(*ref, length);
    const auto packed = copy_tensor<uint16_t>(*ref);
    for (int64_t c = 0; c < length; ++c)
      dst[static_cast<size_t>(c)] = trellis::legacy_sign_bits(packed.data(), c);
    note_read(*ref);
  }

  ProjWeights load_proj(int e, Proj p, int declared_bits) {
    const bool sliced = layout_.rank_sliced();
    const std::string prefix = expert_prefix(layer_, e, p, sliced ? rank_ : -1, layout_.naming);
    const bool down = p == Proj::kDown;
    const int64_t in = down ? w_.intermediate : w_.hidden, out = down ? w_.hidden : w_.intermediate;
    const TensorRef& tr = trellis_ref(prefix);
    const TrellisShape s = check_trellis(tr, declared_bits, in, out);
    ProjWeights pw;
    pw.bits = s.bits;
    pw.in_features = in;
    pw.out_features = out;
    pw.trellis = trellis_span(tr);
    check_codebook(prefix);

    // Hidden side: the shared row (loaded once), or the expert's own; intermediate side: own.
    const std::span<uint16_t> hid = hidden_row(p, e), mid = intermediate_row(p, e);
    const std::string hid_field(hidden_side_field(p)), mid_field(intermediate_side_field(p));
    if (!sliced) {
      plain_vector(prefix, hid_field.c_str(), w_.hidden, hid);
      plain_vector(prefix, mid_field.c_str(), w_.intermediate, mid);
    } else {
      if (layout_.rotation == RotationLayout::kPerExpert) {
        copy_vector(member(prefix, hid_field), w_.hidden, hid_field.c_str(), hid);
      }
      copy_vector(member(prefix, mid_field), w_.intermediate, mid_field.c_str(), mid);
    }
    pw.suh = down ? std::span<const uint16_t>(mid) : std::span<const uint16_t>(hid);
    pw.svh = down ? std::span<const uint16_t>(hid) : std::span<const uint16_t>(mid);
    return pw;
  }

  const TensorRef& member(const std::string& prefix, const std::string& field) const {
    const TensorRef* ref = store_.find(prefix + "." + field);
    if (ref == nullptr) {
      fail("{}: tensor '{}.{}' is missing (MoE layer {}, rank {}, layout {})",
           store_.root().string(), prefix, field, layer_, rank_,
           rotation_layout_name(layout_.rotation));
    }
    return *ref;
  }

  // Rank-sliced experts must carry the MCG marker the metadata declares; plain ones may use any
  // codebook, but one per layer (a fused kernel decodes one).
  void check_codebook(const std::string& prefix) {
    const TensorRef* mcg = store_.find(prefix + ".mcg");
    const TensorRef* mul1 = store_.find(prefix + ".mul1");
    const trellis::Codebook cb = check_markers(prefix, mcg, mul1, store_.root().string());
    if (layout_.rank_sliced() && cb != trellis::Codebook::kMcg) {
      fail(
          "{}: EXL3 expert '{}' has {}, but {} declares codebook mcg; hint: without the "
          "'.mcg' marker the trellis would decode as {}",
          store_.root().string(), prefix, mul1 != nullptr ? "a '.mul1' marker" : "no '.mcg' marker",
          layout_.label, trellis::codebook_name(cb));
    }
    if (!codebook_seen_) {
      w_.codebook = cb;
      codebook_seen_ = true;
    } else if (cb != w_.codebook) {
      fail(
          "{}: EXL3 expert '{}' uses codebook {}, but other experts of layer {} use {}; hint: "
          "one codebook per MoE layer",
          store_.root().string(), prefix, trellis::codebook_name(cb), layer_,
          trellis::codebook_name(w_.codebook));
    }
    if (mcg != nullptr) note_read(*mcg);
    if (mul1 != nullptr) note_read(*mul1);
  }

  const TensorStore& store_;
  const MoeLayout& layout_;
  int layer_, rank_;
  bool codebook_seen_ = false;
  MoeLayerWeights w_;
};

void check_runtime(const MoeLayout& layout, int layer, int rank, int runtime_tp,
                   int runtime_experts) {
  if (layout.tp != runtime_tp) {
    fail("{}: checkpoint is sliced for TP {}, but the runtime uses TP {}; hint: {}", layout.label,
         layout.tp, runtime_tp,
         layout.rank_sliced() ? "run with the checkpoint's TP (rank slices cannot be regrouped)"
                              : "plain experts load on one rank (TP 1)");
  }
  if (layout.num_experts != runtime_experts) {
    fail(
        "{}: checkpoint has {} experts per layer, but the runtime expects {}; hint: expert "
        "maps, EPLB and expert parallelism are not supported",
        layout.label, layout.num_experts, runtime_experts);
  }
  if (rank < 0 || rank >= layout.tp) {
    fail("{}: rank {} is outside 0..{} (TP {})", layout.label, rank, layout.tp - 1, layout.tp);
  }
  (void)layout.bits_of(layer);  // throws for a non-MoE layer
}

}  // namespace

MoeLayerWeights load_moe_layer(const TensorStore& store, const MoeLayout& layout, int layer,
                               int rank, int runtime_tp, int runtime_experts, bool expert_biases) {
  check_runtime(layout, layer, rank, runtime_tp, runtime_experts);
  check_layer_names(store, layout, layer, expert_biases);
  return LayerLoader(store, layout, layer, rank).load();
}

MoeLayerWeights load_moe_layer(const Checkpoint& ckpt, int layer, int rank, int runtime_tp,
                               int runtime_experts) {
  const auto layout = read_moe_layout(ckpt);
  if (!layout) {
    fail(
        "{}: no MoE experts (neither a hybrid_tr3_tail block in config.json nor "
        "'model.layers.{{L}}.mlp.experts.{{E}}.{{proj}}' or "
        "'model.layers.{{L}}.block_sparse_moe.experts.{{E}}.{{w1,w3,w2}}' EXL3 linears)",
        ckpt.path().string());
  }
  MoeLayerWeights w =
      load_moe_layer(ckpt.store(), *layout, layer, rank, runtime_tp, runtime_experts);
  if (ckpt.config()) check_model_config(*ckpt.config(), w, layout->label);
  return w;
}

}  // namespace exl3::moe
