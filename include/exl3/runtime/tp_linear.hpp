// One rank's slice of a linear layer, cut by a TpLinearPlan (tp_plan.hpp).
//
// EXL3: y = had128(had128(x * suh) @ W_hat) * svh + b works block by block on both sides, so
//   column slice  [c0, c1) of the outputs: the tiles of columns c0/16 .. c1/16 of every tile row
//                 (copied: they are strided), svh[c0:c1], bias[c0:c1]; suh whole;
//   row slice     [r0, r1) of the inputs: tile rows r0/16 .. r1/16 (a contiguous view), suh[r0:r1],
//                 svh whole; the output is a partial sum, and only rank 0 adds the bias.
// Cuts are at 128-channel block boundaries (the plan guarantees it), except the stored padding
// of a linear whose real size is not a multiple of 128: the input is zero-padded and the output
// trimmed as the unsliced Linear does. Unquantized linears are sliced into fp32 copies.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "exl3/cpu/linear.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/model/tp_plan.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/runtime/linear.hpp"

namespace exl3::runtime {
// The runtime runs the model layer's descriptions and plans: their names are its vocabulary.
using namespace exl3::model;  // NOLINT(google-build-using-namespace)

// An EXL3 linear's slice: a view over the parent's tensors, with its own tile copy (column
// slices) and bias. Move-only (the view points into the owned vectors).
struct Exl3Slice {
  cpu::LinearView view;
  std::vector<uint16_t> trellis;  // column slices only
  std::vector<float> bias;

  Exl3Slice() = default;
  Exl3Slice(Exl3Slice&&) = default;
  Exl3Slice& operator=(Exl3Slice&&) = default;
  Exl3Slice(const Exl3Slice&) = delete;
  Exl3Slice& operator=(const Exl3Slice&) = delete;
};

// The stored channels [begin, end) (multiples of 16 inside the stored dims) along the split
// axis of `full`. Row slices keep the bias only when `with_bias`. The parent's tensors must
// outlive the slice.
Exl3Slice slice_exl3(const cpu::LinearView& full, TpSplit split, int64_t begin, int64_t end,
                     bool with_bias);

// The routed experts of one MoE layer cut to the intermediate channels `ext` (whole 128-channel
// blocks) of every expert: what rank `rank` of `tp` runs from a plain (TP 1) checkpoint. Gate/up
// are column slices, down a row slice (its output is a partial sum); the rotation tables are cut
// to match (hidden-side rows kept, shared-H included). Owns everything it points to except the
// checkpoint mappings, which it keeps alive.
moe::MoeLayerWeights slice_moe_layer(const moe::MoeLayerWeights& full, Extent ext, int rank,
                                     int tp);

class RankLinear {
 public:
  // Every rank's slice of the linear `plan` names (loaded once, sliced per rank).
  static std::vector<RankLinear> slice_all(const Checkpoint& ckpt, const TpLinearPlan& plan);
  // Rank `rank`'s slice alone (a device rank that loads only its own part).
  static RankLinear slice(const Checkpoint& ckpt, const TpLinearPlan& plan, int rank);
  // The column slices of an unquantized matrix [out, in] (the tied embedding as lm_head).
  static std::vector<RankLinear> slice_dense(const DenseMatrix& w,
                                             const std::vector<Extent>& ranks);

  int64_t in_features() const { return in_; }  // local (real) features
  int64_t out_features() const { return out_; }
  // y[m, out_features()] = this rank's part of x[m, in_features()] @ W^T (+ its bias). A row
  // slice's output is a partial sum; an empty row slice writes its bias (rank 0) or zeros.
  void forward(const float* x, int64_t m, float* y) const;

  // What a device backend uploads: the EXL3 slice (stored dims, padded past the real ones where
  // the linear is), or the unquantized fp32 slice with its bias; both null for an empty slice.
  const Exl3Slice* exl3() const { return exl3_.get(); }
  const DenseMatrix* dense() const { return dense_.get(); }
  std::span<const float> bias() const { return bias_; }

 private:
  struct Source;  // the linear's tensors, loaded once for any number of cuts
  static Source load_source(const Checkpoint& ckpt, const TpLinearPlan& plan);
  static RankLinear cut(const Source& src, const TpLinearPlan& plan, size_t rank);

  int64_t in_ = 0, out_ = 0;
  std::shared_ptr<const Exl3LinearData> parent_;  // keeps the viewed tensors alive
  std::shared_ptr<const Exl3Slice> exl3_;
  std::shared_ptr<const DenseMatrix> dense_;
  std::vector<float> bias_;  // dense slices, and the bias of an empty row slice
};

}  // namespace exl3::runtime
