// MXFP8 weights on the host: conversion from F32/F16/BF16 [out, in] matrices, the CPU reference
// dequant and matmul (what the CUDA kernels are tested against), the error of a conversion, and
// the checkpoint form written by `exl3 quantize --dense-format mxfp8` (src/quant/dense_format.cpp,
// with this codec: a stored linear equals the runtime overlay of its BF16 source bit for bit).
//
// Checkpoint tensors of one overlaid linear `<prefix>` (docs/mxfp8.md):
//   <prefix>.weight        F8_E4M3 [out, in]       E4M3 codes (U8 is accepted on read)
//   <prefix>.weight_scale  U8      [out, in / 32]  UE8M0 block scales
//   <prefix>.bias          optional, as for any unquantized linear
// The arithmetic lives in exl3/mxfp8/codec.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "exl3/format/dtype.hpp"

namespace exl3 {
class TensorStore;
}

namespace exl3::mxfp8 {

// The suffix of the scale plane next to `<prefix>.weight`.
inline constexpr const char* kScaleSuffix = ".weight_scale";

// Relative error of a conversion against its source (over the whole matrix, in fp64).
struct ConversionError {
  double rel_l2 = 0.0;    // ||W - dq(W)|| / ||W|| (0 for an all-zero source)
  double max_abs = 0.0;   // max |W - dq(W)|
};

// One MXFP8 matrix [rows = out, cols = in]: the two planes, owned or viewed in a checkpoint
// mapping (which must then outlive this object).
class Weight {
 public:
  // Converts `rows x cols` elements of `dtype` (F32, F16 or BF16; any alignment). Throws
  // exl3::Error naming `name` when cols is not a multiple of 32, the dtype is not a float type,
  // or an element is NaN / infinite (with its row and column).
  static Weight quantize(std::string name, const std::byte* data, DType dtype, int64_t rows,
                         int64_t cols);
  static Weight quantize_f32(std::string name, std::span<const float> w, int64_t rows, int64_t cols);
  // Reads `<prefix>.weight` (F8_E4M3 or U8) and `<prefix>.weight_scale` (U8) from `store`.
  // `rows` / `cols` > 0 must match. Fails closed (naming file, tensor and value) on wrong dtypes
  // or shapes, cols not a multiple of 32, NaN E4M3 codes or scale codes above 246 (2^119).
  static Weight load(const TensorStore& store, const std::string& prefix, int64_t rows = 0,
                     int64_t cols = 0);
  // Owns the given planes (values [rows, cols], scales [rows, cols / 32]); the same checks as load.
  static Weight from_planes(std::string name, std::vector<uint8_t> values, std::vector<uint8_t> scales,
                            int64_t rows, int64_t cols);
  // Whether `store` holds the checkpoint form for `prefix` (a `<prefix>.weight_scale` exists).
  static bool stored_in(const TensorStore& store, const std::string& prefix);

  const std::string& name() const { return name_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t blocks_per_row() const { return cols_ / 32; }
  const uint8_t* values() const { return values_; }  // [rows, cols]
  const uint8_t* scales() const { return scales_; }  // [rows, cols / 32]
  // Bytes of both planes.
  size_t bytes() const { return static_cast<size_t>(rows_ * cols_ + rows_ * blocks_per_row()); }

  // out[cols] = row r dequantized to fp32 (exact).
  void dequant_row(int64_t r, float* out) const;
  // The whole matrix [rows, cols] in fp32.
  std::vector<float> dequantize() const;
  // y[m, rows] = x[m, cols] @ dq(W)^T (+ bias[rows] when not empty); fp32, parallel over rows.
  // The reference the GPU kernels are compared with.
  void matmul_t(const float* x, int64_t m, float* y, std::span<const float> bias = {}) const;

 private:
  std::string name_;
  int64_t rows_ = 0, cols_ = 0;
  const uint8_t* values_ = nullptr;
  const uint8_t* scales_ = nullptr;
  std::shared_ptr<std::vector<uint8_t>> owned_values_, owned_scales_;
};

// Fails (prefixed by `where`) on an E4M3 NaN code or a scale code above 246 (2^119; 255 is NaN):
// planes no conversion writes. Shared by every way a weight enters (checkpoint, raw planes, GPU).
void check_planes(const std::string& where, const uint8_t* values, const uint8_t* scales, int64_t rows,
                  int64_t cols);

// The error of `w` against its source matrix (same dtype rules as Weight::quantize).
ConversionError conversion_error(const Weight& w, const std::byte* source, DType dtype);

}  // namespace exl3::mxfp8
