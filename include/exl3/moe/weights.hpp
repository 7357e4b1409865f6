// The routed experts of one MoE layer on one rank, loaded from a checkpoint into a plain host
// description a device module can upload as is.
//
// Trellises stay zero-copy views into the checkpoint's mappings (the struct keeps the mapped
// files alive); the fp16 rotation vectors are copied into the prepared tables a fused kernel
// reads (docs/moe-layouts.md, Prepared rotation tables):
//   gate_suh, up_suh, down_svh   [h_rows, H]   hidden side; h_rows = 1 under shared_h_v1 (one
//                                              physical row every expert points to), else E
//   intermediate                 [E, 3*I_loc]  gate_svh | up_svh | down_suh of each expert
// Every expert's ProjWeights spans point into those tables, so shared_h_v1 costs one row per
// projection, not E (owned_bytes() proves it).
//
// load_moe_layer reads only the local rank's tensors and checks, failing closed
// (docs/moe-layouts.md, What fails closed: Loading): checkpoint TP / expert count against the
// runtime's, every tensor name of the layer against the layout's schema (undeclared shared-H
// rows, a wrong field on a shared row, hidden-side vectors under an expert id under shared_h_v1,
// stray ranks or experts, expert biases), trellis I16 rank 3 of width 16*K with K in 1..8 and
// equal to the declared K, K/N multiples of 128, suh/svh F16 rank 1 of the matching length and
// finite, and the codebook marker (mcg required for rank-sliced checkpoints; never both mcg and
// mul1; exact sentinels); from a Checkpoint also config.json's hidden_size, moe_intermediate_size
// and hidden_act (SiLU).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "exl3/cpu/linear.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3 {
class Checkpoint;
class SafetensorsFile;
class TensorStore;
}  // namespace exl3

namespace exl3::moe {

// One projection of one expert on one rank.
struct ProjWeights {
  std::span<const uint16_t> trellis;  // int16 bits [in/16, out/16, 16*bits]
  int bits = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  std::span<const uint16_t> suh;  // fp16 bits [in]
  std::span<const uint16_t> svh;  // fp16 bits [out]

  cpu::LinearView view(trellis::Codebook cb) const;
};

struct ExpertWeights {
  ProjWeights gate, up, down;  // gate/up: [H -> I_loc], down: [I_loc -> H]

  // The expert's K when its three projections agree, else 0.
  int bits() const;
};

// The prepared fp16 rotation tables (see the header comment).
struct RotationTables {
  int64_t h_rows = 0;
  std::vector<uint16_t> gate_suh, up_suh, down_svh;  // [h_rows, H]
  std::vector<uint16_t> intermediate;                // [E, 3*I_loc]
};

struct MoeLayerWeights {
  int layer = -1;
  int rank = 0;
  int tp = 1;
  RotationLayout rotation = RotationLayout::kPlain;
  trellis::Codebook codebook = trellis::Codebook::kMcg;
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I_loc = I / tp (this rank's slice)
  std::vector<ExpertWeights> experts;
  RotationTables rotations;
  std::vector<std::string> tensors_read;  // every tensor whose bytes were read, in order

  MoeLayerWeights() = default;
  MoeLayerWeights(MoeLayerWeights&&) = default;  // spans survive: vector moves keep buffers
  MoeLayerWeights& operator=(MoeLayerWeights&&) = default;
  MoeLayerWeights(const MoeLayerWeights&) = delete;
  MoeLayerWeights& operator=(const MoeLayerWeights&) = delete;

  int num_experts() const { return static_cast<int>(experts.size()); }
  // Bytes this struct owns (rotation tables + any trellis copied because it was unaligned);
  // the zero-copy trellis views are not counted.
  uint64_t owned_bytes() const;
  // Bytes of trellis data the expert views cover (owned or mapped).
  uint64_t trellis_bytes() const;
  // ((K, experts), ...) over experts() (K = 0 for a plain expert whose projections differ).
  std::vector<std::pair<int, int>> tier_signature() const;

  // Internal storage the spans point into.
  std::vector<std::shared_ptr<const SafetensorsFile>> mapped_files;
  std::vector<std::vector<uint16_t>> trellis_copies;
};

// Loads MoE layer `layer` for `rank` of a checkpoint whose layout read_moe_layout describes.
// runtime_tp / runtime_experts are what the runtime was configured with; they must equal the
// checkpoint's. Throws exl3::Error naming the file and tensor at fault.
MoeLayerWeights load_moe_layer(const Checkpoint& ckpt, int layer, int rank, int runtime_tp,
                               int runtime_experts);
// The same over a bare tensor store and an already parsed layout: nothing but the local rank's
// tensors is read (used when per-rank processes open only their shard, and by tests).
// expert_biases: the model's experts have biases (gpt-oss), so plain experts' `.bias` tensors
// are expected rather than refused; the caller reads them (they are not part of this struct).
MoeLayerWeights load_moe_layer(const TensorStore& store, const MoeLayout& layout, int layer,
                               int rank, int runtime_tp, int runtime_experts,
                               bool expert_biases = false);

}  // namespace exl3::moe
