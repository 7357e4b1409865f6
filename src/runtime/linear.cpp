// Runtime weights: DenseMatrix, load_vector and the Linear interface (see linear.hpp).
#include "exl3/runtime/linear.hpp"

#include <algorithm>
#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include "exl3/cpu/dot.hpp"
#include "exl3/cpu/widen.hpp"
#include "exl3/error.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3::runtime {

DenseMatrix DenseMatrix::load(const TensorStore& store, const std::string& name, int64_t rows,
                              int64_t cols) {
  const TensorRef* ref = store.find(name);
  if (ref == nullptr) fail("{}: tensor '{}' is missing", store.root().string(), name);
  const TensorInfo& t = *ref->info;
  if (!is_float_matrix_dtype(t.dtype) || t.rank() != 2) {
    fail("{}: tensor '{}' is {} of rank {}; expected a 2-D F32, F16 or BF16 matrix",
         ref->path().string(), name, dtype_name(t.dtype), t.rank());
  }
  if ((rows > 0 && t.shape[0] != rows) || (cols > 0 && t.shape[1] != cols)) {
    fail("{}: tensor '{}' is [{}, {}], expected [{}, {}] (from config.json)", ref->path().string(),
         name, t.shape[0], t.shape[1], rows, cols);
  }
  DenseMatrix m;
  m.name_ = name;
  m.dtype_ = t.dtype;
  m.rows_ = t.shape[0];
  m.cols_ = t.shape[1];
  const auto bytes = ref->bytes();
  if (reinterpret_cast<uintptr_t>(bytes.data()) % dtype_size(t.dtype) == 0) {
    m.data_ = bytes.data();
  } else {
    m.owned_.assign(bytes.begin(), bytes.end());
    m.data_ = m.owned_.data();
  }
  return m;
}

DenseMatrix DenseMatrix::from_f32(std::vector<float> values, int64_t rows, int64_t cols,
                                  std::string name) {
  if (static_cast<int64_t>(values.size()) != rows * cols) {
    fail("DenseMatrix::from_f32: {} values for [{}, {}]", values.size(), rows, cols);
  }
  DenseMatrix m;
  m.name_ = std::move(name);
  m.rows_ = rows;
  m.cols_ = cols;
  m.owned_.resize(values.size() * 4);
  std::memcpy(m.owned_.data(), values.data(), m.owned_.size());
  m.data_ = m.owned_.data();
  return m;
}

void DenseMatrix::row(int64_t r, float* out) const {
  if (r < 0 || r >= rows_) fail("{}: row {} is outside 0..{}", name_, r, rows_ - 1);
  const size_t es = dtype_size(dtype_);
  cpu::widen_to_f32(data_ + static_cast<size_t>(r * cols_) * es, dtype_, cols_, out);
}

std::vector<float> DenseMatrix::to_f32() const {
  std::vector<float> out(static_cast<size_t>(rows_ * cols_));
  cpu::widen_to_f32(data_, dtype_, rows_ * cols_, out.data());
  return out;
}

void DenseMatrix::matmul_t(const float* x, int64_t m, float* y, std::span<const float> bias) const {
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != rows_) {
    fail("{}: bias has {} values for {} rows", name_, bias.size(), rows_);
  }
  tbb::enumerable_thread_specific<std::vector<float>> buffers(
      [&] { return std::vector<float>(static_cast<size_t>(cols_)); });
  const size_t es = dtype_size(dtype_);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows_, 16),
                    [&](const tbb::blocked_range<int64_t>& rr) {
                      auto& w = buffers.local();
                      for (int64_t r = rr.begin(); r < rr.end(); ++r) {
                        const float* wr = w.data();
                        if (dtype_ == DType::kF32 && reinterpret_cast<uintptr_t>(data_) % 4 == 0) {
                          wr = reinterpret_cast<const float*>(data_) + r * cols_;
                        } else {
                          cpu::widen_to_f32(data_ + static_cast<size_t>(r * cols_) * es, dtype_,
                                            cols_, w.data());
                        }
                        const float b = bias.empty() ? 0.0f : bias[static_cast<size_t>(r)];
                        for (int64_t i = 0; i < m; ++i)
                          y[i * rows_ + r] = cpu::dot_f32(x + i * cols_, wr, cols_) + b;
                      }
                    });
}

std::vector<float> load_float_tensor(const TensorStore& store, const std::string& name,
                                     std::span<const int64_t> shape) {
  const TensorRef* ref = store.find(name);
  if (ref == nullptr) fail("{}: tensor '{}' is missing", store.root().string(), name);
  const TensorInfo& t = *ref->info;
  if (!is_float_matrix_dtype(t.dtype) && t.dtype != DType::kF64) {
    fail("{}: tensor '{}' is {}; expected float values", ref->path().string(), name,
         dtype_name(t.dtype));
  }
  bool same = t.shape.size() == shape.size();
  for (size_t i = 0; same && i < shape.size(); ++i) same = shape[i] <= 0 || t.shape[i] == shape[i];
  if (!same) {
    fail("{}: tensor '{}' has shape [{}], expected [{}]", ref->path().string(), name,
         fmt::join(t.shape, ", "), fmt::join(shape, ", "));
  }
  return read_as_float(*ref);
}

std::vector<float> load_vector(const TensorStore& store, const std::string& name, int64_t len) {
  const int64_t shape[] = {len};
  return load_float_tensor(store, name, shape);
}

std::vector<float> load_norm_vector(const TensorStore& store, const std::string& name, int64_t len,
                                    bool unit_offset) {
  std::vector<float> w = load_vector(store, name, len);
  if (unit_offset)
    for (auto& v : w) v += 1.0f;
  return w;
}

Linear Linear::load(const Checkpoint& ckpt, const std::string& prefix, int64_t in, int64_t out,
                    const OverlayDecision& overlay, OverlayReport* report) {
  Linear l;
  l.name_ = prefix;
  l.in_ = in;
  l.out_ = out;
  if (const Exl3LinearInfo* info = ckpt.find_linear(prefix)) {
    // Stored dims are padded up to multiples of 128 (docs/format.md, Padding); never smaller.
    if (info->in_features < in || info->out_features < out || info->in_features - in >= 128 ||
        info->out_features - out >= 128) {
      fail("{}: EXL3 linear '{}' is {} -> {}, expected {} -> {} from config.json",
           ckpt.path().string(), prefix, info->in_features, info->out_features, in, out);
    }
    if (overlay.action == OverlayAction::kMxfp8) {
      fail("{}: linear '{}' is EXL3; the MXFP8 overlay applies to unquantized linears only",
           ckpt.path().string(), prefix);
    }
    l.exl3_ = std::make_shared<const Exl3LinearData>(Exl3LinearData::load(ckpt, prefix));
    l.view_ = cpu::LinearView::of(*l.exl3_);
    return l;
  }
  if (mxfp8::Weight::stored_in(ckpt.store(), prefix)) {
    l.mx_ =
        std::make_shared<const mxfp8::Weight>(mxfp8::Weight::load(ckpt.store(), prefix, out, in));
    if (ckpt.store().contains(prefix + ".bias"))
      l.bias_ = load_vector(ckpt.store(), prefix + ".bias", out);
    if (report != nullptr) {
      report->layers.push_back(
          {prefix, out, in, DType::kF8E4M3, l.mx_->bytes(), l.mx_->bytes(), 0.0, 0.0, true});
    }
    return l;
  }
  const std::string w = prefix + ".weight";
  if (!ckpt.store().contains(w)) {
    fail("{}: linear '{}' is missing (neither EXL3 '{}.trellis' nor unquantized '{}')",
         ckpt.path().string(), prefix, prefix, w);
  }
  l.dense_ = std::make_shared<const DenseMatrix>(DenseMatrix::load(ckpt.store(), w, out, in));
  if (ckpt.store().contains(prefix + ".bias"))
    l.bias_ = load_vector(ckpt.store(), prefix + ".bias", out);
  if (overlay.action == OverlayAction::kMxfp8) {
    const TensorRef& ref = ckpt.store().at(w);
    const std::byte* src = ref.bytes().data();
    auto mx = mxfp8::Weight::quantize(prefix, src, ref.info->dtype, out, in);
    const auto err = mxfp8::conversion_error(mx, src, ref.info->dtype);
    if (report != nullptr) {
      report->layers.push_back({prefix, out, in, ref.info->dtype, ref.bytes().size(), mx.bytes(),
                                err.rel_l2, err.max_abs, false});
    }
    l.mx_ = std::make_shared<const mxfp8::Weight>(std::move(mx));
    l.dense_.reset();
  } else if (report != nullptr && !overlay.reason.empty()) {
    report->kept_unquantized.emplace_back(prefix, overlay.reason);
  }
  return l;
}

Linear Linear::dense(DenseMatrix w, std::vector<float> bias) {
  Linear l;
  l.name_ = w.name();
  l.in_ = w.cols();
  l.out_ = w.rows();
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != l.out_) {
    fail("{}: bias has {} values for {} outputs", l.name_, bias.size(), l.out_);
  }
  l.dense_ = std::make_shared<const DenseMatrix>(std::move(w));
  l.bias_ = std::move(bias);
  return l;
}

double Linear::bits() const {
  if (exl3_) return exl3_->info().bits;
  if (mx_) return 8.25;  // one E4M3 byte per weight + one UE8M0 byte per 32
  return 8.0 * static_cast<double>(dtype_size(dense_->dtype()));
}

std::optional<cpu::LinearView> Linear::exl3_view() const {
  if (!exl3_ || view_.in_features != in_ || view_.out_features != out_) return std::nullopt;
  return view_;
}

void Linear::forward(const float* x, int64_t m, float* y) const {
  if (m <= 0) return;
  if (mx_) {
    mx_->matmul_t(x, m, y, bias_);
    return;
  }
  if (dense_) {
    dense_->matmul_t(x, m, y, bias_);
    return;
  }
  const int64_t sin = view_.in_features, sout = view_.out_features;
  if (sin == in_ && sout == out_) {
    cpu::linear_forward(view_, x, cpu::ActDType::kF32, m, y);
    return;
  }
  // Padded storage: zero-pad the input, trim the output.
  std::vector<float> xp(static_cast<size_t>(m * sin), 0.0f), yp(static_cast<size_t>(m * sout));
  for (int64_t r = 0; r < m; ++r) std::copy_n(x + r * in_, in_, xp.data() + r * sin);
  cpu::linear_forward(view_, xp.data(), cpu::ActDType::kF32, m, yp.data());
  for (int64_t r = 0; r < m; ++r) std::copy_n(yp.data() + r * sout, out_, y + r * out_);
}

}  // namespace exl3::runtime
