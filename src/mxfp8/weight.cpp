// MXFP8 weights on the host (see exl3/mxfp8/weight.hpp; arithmetic in exl3/mxfp8/codec.hpp).
#include "exl3/mxfp8/weight.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include "exl3/cpu/dot.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/mxfp8/codec.hpp"

namespace exl3::mxfp8 {
namespace {

// The largest scale code the kernels accept: 2^(246 - 127) = 2^119 is what an fp32 block can
// need (floor(log2(FLT_MAX)) - 8); larger codes only come from broken writers.
constexpr uint8_t kMaxScaleCode = 246;

void check_cols(const std::string& name, int64_t cols) {
  if (cols <= 0 || cols % kBlock != 0) {
    fail("{}: input width {} is not a positive multiple of 32; MXFP8 scales blocks of 32 inputs "
         "(hint: such layers stay unquantized, see docs/mxfp8.md)",
         name, cols);
  }
}

}  // namespace

Weight Weight::quantize(std::string name, const std::byte* data, DType dtype, int64_t rows,
                        int64_t cols) {
  if (!is_float_matrix_dtype(dtype)) {
    fail("{}: cannot convert {} to MXFP8; expected F32, F16 or BF16", name, dtype_name(dtype));
  }
  check_cols(name, cols);
  if (rows <= 0) fail("{}: {} rows; expected at least one", name, rows);
  Weight w;
  w.name_ = std::move(name);
  w.rows_ = rows;
  w.cols_ = cols;
  w.owned_values_ = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols));
  w.owned_scales_ = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * (cols / kBlock)));
  const size_t es = dtype_size(dtype);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, 8), [&](const tbb::blocked_range<int64_t>& rr) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = rr.begin(); r < rr.end(); ++r) {
      float_elements_to_f32(data + static_cast<size_t>(r * cols) * es, dtype, cols, row.data());
      for (int64_t b = 0; b < cols / kBlock; ++b) {
        if (!encode_block(row.data() + b * kBlock, kBlock, w.owned_values_->data() + r * cols + b * kBlock,
                          w.owned_scales_->data() + r * (cols / kBlock) + b)) {
          int64_t c = b * kBlock;
          while (std::isfinite(row[static_cast<size_t>(c)])) ++c;
          fail("{}: element [{}, {}] is {}; a weight must be finite to convert to MXFP8 (the "
               "source checkpoint is damaged)",
               w.name_, r, c, row[static_cast<size_t>(c)]);
        }
      }
    }
  });
  w.values_ = w.owned_values_->data();
  w.scales_ = w.owned_scales_->data();
  return w;
}

Weight Weight::quantize_f32(std::string name, std::span<const float> w, int64_t rows, int64_t cols) {
  if (static_cast<int64_t>(w.size()) != rows * cols) {
    fail("{}: {} values for a [{}, {}] matrix", name, w.size(), rows, cols);
  }
  return quantize(std::move(name), reinterpret_cast<const std::byte*>(w.data()), DType::kF32, rows, cols);
}

void check_planes(const std::string& where, const uint8_t* values, const uint8_t* scales, int64_t rows,
                  int64_t cols) {
  for (int64_t i = 0; i < rows * cols; ++i) {
    if ((values[i] & 0x7Fu) == kE4m3NaN) {
      fail("{}: the E4M3 NaN code 0x{:02X} at [{}, {}]; the weight is damaged", where, values[i], i / cols, i % cols);
    }
  }
  const int64_t kb = cols / kBlock;
  for (int64_t i = 0; i < rows * kb; ++i) {
    if (scales[i] > kMaxScaleCode) {
      fail("{}: scale code {} at [{}, {}]; codes above {} (2^119) are not produced by any fp32 block and 255 is NaN",
           where, scales[i], i / kb, i % kb, kMaxScaleCode);
    }
  }
}

Weight Weight::from_planes(std::string name, std::vector<uint8_t> values, std::vector<uint8_t> scales, int64_t rows,
                           int64_t cols) {
  check_cols(name, cols);
  if (rows <= 0 || static_cast<int64_t>(values.size()) != rows * cols ||
      static_cast<int64_t>(scales.size()) != rows * (cols / kBlock)) {
    fail("{}: {} codes and {} scales for a [{}, {}] MXFP8 matrix (expected {} and {})", name, values.size(),
         scales.size(), rows, cols, rows * cols, rows * (cols / kBlock));
  }
  check_planes(name, values.data(), scales.data(), rows, cols);
  Weight w;
  w.name_ = std::move(name);
  w.rows_ = rows;
  w.cols_ = cols;
  w.owned_values_ = std::make_shared<std::vector<uint8_t>>(std::move(values));
  w.owned_scales_ = std::make_shared<std::vector<uint8_t>>(std::move(scales));
  w.values_ = w.owned_values_->data();
  w.scales_ = w.owned_scales_->data();
  return w;
}

bool Weight::stored_in(const TensorStore& store, const std::string& prefix) {
  return store.contains(prefix + kScaleSuffix);
}

Weight Weight::load(const TensorStore& store, const std::string& prefix, int64_t rows, int64_t cols) {
  const std::string vname = prefix + ".weight", sname = prefix + kScaleSuffix;
  const TensorRef* v = store.find(vname);
  const TensorRef* s = store.find(sname);
  if (v == nullptr || s == nullptr) {
    fail("{}: MXFP8 linear '{}' needs both '{}' and '{}'; '{}' is missing", store.root().string(),
         prefix, vname, sname, v == nullptr ? vname : sname);
  }
  const TensorInfo& vi = *v->info;
  const TensorInfo& si = *s->info;
  if ((vi.dtype != DType::kF8E4M3 && vi.dtype != DType::kU8) || vi.rank() != 2) {
    fail("{}: tensor '{}' is {} of rank {}; an MXFP8 weight is a 2-D F8_E4M3 (or U8) [out, in] "
         "matrix",
         v->path().string(), vname, dtype_name(vi.dtype), vi.rank());
  }
  const int64_t r = vi.shape[0], c = vi.shape[1];
  if ((rows > 0 && r != rows) || (cols > 0 && c != cols)) {
    fail("{}: tensor '{}' is [{}, {}], expected [{}, {}] (from config.json)", v->path().string(),
         vname, r, c, rows, cols);
  }
  check_cols(v->path().string() + ": '" + vname + "'", c);
  if (si.dtype != DType::kU8 || si.rank() != 2 || si.shape[0] != r || si.shape[1] != c / kBlock) {
    fail("{}: tensor '{}' is {} [{}]; expected U8 [{}, {}] (one UE8M0 scale per 32 inputs of '{}')",
         s->path().string(), sname, dtype_name(si.dtype), fmt::join(si.shape, ", "), r, c / kBlock,
         vname);
  }
  Weight w;
  w.name_ = prefix;
  w.rows_ = r;
  w.cols_ = c;
  w.values_ = reinterpret_cast<const uint8_t*>(v->bytes().data());
  w.scales_ = reinterpret_cast<const uint8_t*>(s->bytes().data());
  check_planes(v->path().string() + ": tensors '" + vname + "' / '" + sname + "'", w.values_, w.scales_, r, c);
  return w;
}

void Weight::dequant_row(int64_t r, float* out) const {
  if (r < 0 || r >= rows_) fail("{}: row {} is outside 0..{}", name_, r, rows_ - 1);
  const uint8_t* v = values_ + r * cols_;
  const uint8_t* s = scales_ + r * blocks_per_row();
  for (int64_t i = 0; i < cols_; ++i) out[i] = dequant(v[i], s[i / kBlock]);
}

std::vector<float> Weight::dequantize() const {
  std::vector<float> out(static_cast<size_t>(rows_ * cols_));
  for (int64_t r = 0; r < rows_; ++r) dequant_row(r, out.data() + r * cols_);
  return out;
}

void Weight::matmul_t(const float* x, int64_t m, float* y, std::span<const float> bias) const {
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != rows_) {
    fail("{}: bias has {} values for {} rows", name_, bias.size(), rows_);
  }
  tbb::enumerable_thread_specific<std::vector<float>> buffers(
      [&] { return std::vector<float>(static_cast<size_t>(cols_)); });
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows_, 16), [&](const tbb::blocked_range<int64_t>& rr) {
    auto& w = buffers.local();
    for (int64_t r = rr.begin(); r < rr.end(); ++r) {
      dequant_row(r, w.data());
      const float b = bias.empty() ? 0.0f : bias[static_cast<size_t>(r)];
      for (int64_t i = 0; i < m; ++i) y[i * rows_ + r] = cpu::dot_f32(x + i * cols_, w.data(), cols_) + b;
    }
  });
}

ConversionError conversion_error(const Weight& w, const std::byte* source, DType dtype) {
  if (!is_float_matrix_dtype(dtype)) fail("{}: source dtype {} is not a float type", w.name(), dtype_name(dtype));
  const int64_t cols = w.cols();
  std::vector<float> src(static_cast<size_t>(cols)), dq(static_cast<size_t>(cols));
  double err2 = 0.0, ref2 = 0.0, max_abs = 0.0;
  for (int64_t r = 0; r < w.rows(); ++r) {
    float_elements_to_f32(source + static_cast<size_t>(r * cols) * dtype_size(dtype), dtype, cols, src.data());
    w.dequant_row(r, dq.data());
    for (int64_t i = 0; i < cols; ++i) {
      const double d = static_cast<double>(src[static_cast<size_t>(i)]) - dq[static_cast<size_t>(i)];
      err2 += d * d;
      ref2 += static_cast<double>(src[static_cast<size_t>(i)]) * src[static_cast<size_t>(i)];
      max_abs = std::max(max_abs, std::abs(d));
    }
  }
  return {ref2 > 0.0 ? std::sqrt(err2 / ref2) : 0.0, max_abs};
}

}  // namespace exl3::mxfp8
