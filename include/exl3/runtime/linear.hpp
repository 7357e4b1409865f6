// Weights as the runtime holds them: one Linear interface over EXL3 and unquantized linears, and
// dense matrices for embeddings and routers. Checkpoint data stay where they are mapped
// (zero-copy when aligned); the owning Checkpoint must outlive these objects.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "exl3/cpu/linear.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/dtype.hpp"
#include "exl3/mxfp8/weight.hpp"
#include "exl3/runtime/overlay.hpp"

namespace exl3::runtime {

// A 2-D float tensor [rows, cols] stored as F32, F16 or BF16 (HF orientation for linears:
// [out, in]). Rows are converted to fp32 when read.
class DenseMatrix {
 public:
  // Throws exl3::Error naming the checkpoint and tensor when absent, not 2-D or not a float
  // type; `rows` / `cols` (when > 0) must match.
  static DenseMatrix load(const TensorStore& store, const std::string& name, int64_t rows = 0,
                          int64_t cols = 0);
  // A matrix over owned fp32 values (tests).
  static DenseMatrix from_f32(std::vector<float> values, int64_t rows, int64_t cols,
                              std::string name = "matrix");

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  DType dtype() const { return dtype_; }
  const std::string& name() const { return name_; }
  // out[cols] = row r as fp32.
  void row(int64_t r, float* out) const;
  // Every element as fp32, row-major [rows, cols] (device uploads of slices).
  std::vector<float> to_f32() const;
  // y[m, rows] = x[m, cols] @ W^T (+ bias[rows] when not empty); fp32 accumulation, parallel
  // over rows.
  void matmul_t(const float* x, int64_t m, float* y, std::span<const float> bias = {}) const;

 private:
  std::string name_;
  DType dtype_ = DType::kF32;
  int64_t rows_ = 0, cols_ = 0;
  const std::byte* data_ = nullptr;  // into the mapping or owned_
  std::vector<std::byte> owned_;
};

// A float tensor of exactly `shape` (an entry <= 0 takes any size there) read as fp32. Throws
// exl3::Error naming the tensor.
std::vector<float> load_float_tensor(const TensorStore& store, const std::string& name,
                                     std::span<const int64_t> shape);
// A vector tensor read as fp32 (norm weights, biases, router correction bias). `len` > 0 must
// match. Throws exl3::Error naming the tensor.
std::vector<float> load_vector(const TensorStore& store, const std::string& name, int64_t len);
// An RMSNorm weight as both engines' norms multiply by it: with `unit_offset` (Gemma's 1 + w) the
// offset is added in fp32 once at load, so the norm itself stays x * rsqrt(mean(x^2) + eps) * w.
std::vector<float> load_norm_vector(const TensorStore& store, const std::string& name, int64_t len,
                                    bool unit_offset);

// One linear layer y = x W^T + b, EXL3 (trellis), unquantized or MXFP8, behind one interface.
class Linear {
 public:
  // EXL3 when `<prefix>.trellis` exists (its stored dims may be padded past in/out: the input is
  // zero-padded and the output trimmed), else `<prefix>.weight` [out, in] in F32/F16/BF16 with
  // an optional `<prefix>.bias` [out]; MXFP8 when the checkpoint stores `<prefix>.weight_scale`
  // (exl3/mxfp8/weight.hpp). `overlay` kMxfp8 converts an unquantized weight to MXFP8 here (the
  // source stays in the mapping, unreferenced); `report`, when given, receives what was
  // converted or kept unquantized. Throws exl3::Error naming the checkpoint and prefix.
  static Linear load(const Checkpoint& ckpt, const std::string& prefix, int64_t in, int64_t out,
                     const OverlayDecision& overlay = {}, OverlayReport* report = nullptr);
  // An unquantized linear over a matrix (e.g. the tied embedding as lm_head).
  static Linear dense(DenseMatrix w, std::vector<float> bias = {});

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool quantized() const { return exl3_ != nullptr; }
  // The MXFP8 weight when this linear is MXFP8 (stored or overlaid), else nullptr.
  const mxfp8::Weight* mxfp8_weight() const { return mx_.get(); }
  const std::string& name() const { return name_; }
  // Bits per weight of the stored form (K for EXL3, 8.25 for MXFP8, 16 / 32 for unquantized).
  double bits() const;

  // y[m, out] = x[m, in] (fp32).
  void forward(const float* x, int64_t m, float* y) const;
  // The EXL3 view when this is an unpadded EXL3 linear (what exl3::moe takes), else nullopt.
  std::optional<cpu::LinearView> exl3_view() const;

 private:
  std::string name_;
  int64_t in_ = 0, out_ = 0;
  std::shared_ptr<const Exl3LinearData> exl3_;
  cpu::LinearView view_;
  std::shared_ptr<const DenseMatrix> dense_;
  std::shared_ptr<const mxfp8::Weight> mx_;
  std::vector<float> bias_;  // dense and MXFP8 only (EXL3 bias lives in the view)
};

}  // namespace exl3::runtime
