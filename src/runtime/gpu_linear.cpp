// GpuLinear (see gpu_linear.hpp).
#include "gpu_linear.hpp"

#if defined(EXL3_HAVE_CUDA)

#include <algorithm>

#include "cuda_buffers.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/cuda/plan.hpp"
#include "exl3/error.hpp"
#include "exl3/mxfp8/weight.hpp"
#include "exl3/runtime/linear.hpp"

namespace exl3::runtime {
GpuLinear GpuLinear::load(cuda::CudaContext& ctx, const Checkpoint& ckpt, const std::string& prefix,
                          int64_t in, int64_t out, int64_t cap, bool fp32_weights,
                          const OverlayDecision& overlay, OverlayReport* report,
                          const cuda::Mxfp8Options& mxfp8, const cuda::LinearOptions& exl3) {
  GpuLinear l;
  l.in_ = in;
  l.out_ = out;
  l.name_ = prefix;
  if (const Exl3LinearInfo* info = ckpt.find_linear(prefix)) {
    if (info->in_features < in || info->out_features < out || info->in_features - in >= 128 ||
        info->out_features - out >= 128) {
      fail("{}: EXL3 linear '{}' is {} -> {}, expected {} -> {} from config.json",
           ckpt.path().string(), prefix, info->in_features, info->out_features, in, out);
    }
    if (overlay.action == OverlayAction::kMxfp8) {
      fail("{}: linear '{}' is EXL3; the MXFP8 overlay applies to unquantized linears only",
           ckpt.path().string(), prefix);
    }
    const Exl3LinearData data = Exl3LinearData::load(ckpt, prefix);
    l.upload_exl3(ctx, cpu::LinearView::of(data), cap, exl3);
    return l;
  }
  if (!ckpt.store().contains(prefix + ".weight")) {
    fail("{}: linear '{}' is missing (neither EXL3 '{}.trellis' nor unquantized '{}.weight')",
         ckpt.path().string(), prefix, prefix, prefix);
  }
  // The CPU engine's loader validates dtype and shape, reads stored MXFP8, applies the overlay
  // decision with the one MXFP8 codec and fills the report; only the upload differs here.
  const Linear host = Linear::load(ckpt, prefix, in, out, overlay, report);
  std::vector<float> bias;
  if (ckpt.store().contains(prefix + ".bias"))
    bias = load_vector(ckpt.store(), prefix + ".bias", out);
  if (const mxfp8::Weight* w = host.mxfp8_weight()) {
    cuda::Mxfp8Options mo = mxfp8;
    mo.max_m = cap;
    l.mx_ = std::make_unique<cuda::Mxfp8LinearCuda>(ctx, *w, bias, mo);
    l.mx_x_bytes_ = cuda::carve_align_up(static_cast<size_t>(cap * in) * 2);
    l.stored_in_ = in;
    l.stored_out_ = out;
    l.bytes_ = l.mx_->weight_bytes() + bias.size() * 4;
    return l;
  }
  return dense(ctx, ckpt.store(), prefix + ".weight", bias, cap, fp32_weights);
}

GpuLinear GpuLinear::dense(cuda::CudaContext& ctx, const TensorStore& store,
                           const std::string& tensor, const std::vector<float>& bias, int64_t cap,
                           bool fp32_weights, Extent rows) {
  const TensorRef* ref = store.find(tensor);
  if (ref == nullptr) fail("{}: tensor '{}' is missing", store.root().string(), tensor);
  if (ref->info->rank() != 2) fail("{}: tensor '{}' is not a matrix", ref->path().string(), tensor);
  const int64_t all_rows = ref->info->shape[0];
  if (rows.empty()) rows = {0, all_rows};
  if (rows.end() > all_rows) {
    fail("{}: tensor '{}' has {} rows; rows [{}, {}) were asked for", ref->path().string(), tensor,
         all_rows, rows.begin, rows.end());
  }
  GpuLinear l;
  l.name_ = tensor;
  l.out_ = l.stored_out_ = rows.count;
  l.in_ = l.stored_in_ = ref->info->shape[1];
  const cuda::DType t = cuda_dtype(ref->info->dtype, tensor);
  const auto bytes = ref->bytes();
  const size_t row_bytes = static_cast<size_t>(l.in_) * cuda::dtype_size(t);
  // A copy: the mapping may be unaligned for the element type.
  std::vector<std::byte> aligned(
      bytes.begin() + static_cast<std::ptrdiff_t>(rows.begin * row_bytes),
      bytes.begin() + static_cast<std::ptrdiff_t>(rows.end() * row_bytes));
  l.dense_ = std::make_unique<cuda::DenseLinearCuda>(ctx, tensor, aligned.data(), t, l.in_, l.out_,
                                                     bias.empty() ? nullptr : bias.data(), cap,
                                                     fp32_weights);
  l.bytes_ = l.dense_->device_bytes();
  return l;
}

GpuLinear GpuLinear::from_rank(cuda::CudaContext& ctx, const RankLinear& r, const std::string& name,
                               int64_t out_offset, int64_t out, int64_t cap, exl3::DType stored,
                               const cuda::LinearOptions& exl3) {
  GpuLinear l;
  l.name_ = name;
  l.in_ = r.in_features();
  l.out_ = out;
  l.out_offset_ = out_offset;
  if (l.in_ <= 0 || l.out_ <= 0 || out_offset < 0 || out_offset + out > r.out_features()) {
    fail(
        "{}: this rank's slice is {} -> {} (columns {}..{} kept); the CUDA tensor-parallel engine "
        "needs every rank "
        "to hold part of every linear (hint: use a smaller --tp)",
        name, r.in_features(), r.out_features(), out_offset, out_offset + out);
  }
  if (const Exl3Slice* s = r.exl3()) {
    l.upload_exl3(ctx, s->view, cap, exl3);
    return l;
  }
  const DenseMatrix* d = r.dense();
  if (d == nullptr || out_offset != 0 || out != r.out_features()) {
    fail("{}: an unquantized rank slice must be kept whole ({} -> {}, columns {}..{} asked for)",
         name, r.in_features(), r.out_features(), out_offset, out_offset + out);
  }
  const auto w = d->to_f32();
  const auto bias = r.bias();
  l.stored_in_ = l.in_;
  l.stored_out_ = l.out_;
  // The fp32 slice holds the checkpoint's values exactly; back to their dtype, so cuBLAS runs the
  // same GEMM as for the unsliced tensor.
  cuda::DType t = cuda::DType::kF32;
  const std::vector<uint16_t> half = to_stored_16bit(w, stored, t);
  const void* host = half.empty() ? static_cast<const void*>(w.data()) : half.data();
  l.dense_ = std::make_unique<cuda::DenseLinearCuda>(
      ctx, name, host, t, l.in_, l.out_, bias.empty() ? nullptr : bias.data(), cap, false);
  l.bytes_ = l.dense_->device_bytes();
  return l;
}

void GpuLinear::upload_exl3(cuda::CudaContext& ctx, const cpu::LinearView& v, int64_t cap,
                            cuda::LinearOptions lo) {
  lo.max_m = cap;
  exl3_ = std::make_unique<cuda::Exl3LinearCuda>(
      ctx, name_.c_str(), v.trellis.data(), v.in_features, v.out_features, v.bits, v.codebook,
      v.suh.data(), v.svh.data(), v.bias.empty() ? nullptr : v.bias.data(), lo);
  stored_in_ = v.in_features;
  stored_out_ = v.out_features;
  bytes_ = v.trellis.size() * 2 + (v.suh.size() + v.svh.size()) * 2;
}

const float* GpuLinear::fp32_matrix() const {
  const bool unpadded = stored_in_ == in_ && stored_out_ == out_ && out_offset_ == 0;
  return dense_ != nullptr && unpadded ? dense_->fp32_matrix() : nullptr;
}

size_t GpuLinear::workspace_bytes() const {
  if (mx_) return mx_x_bytes_ + mx_->workspace_bytes();
  return exl3_ ? exl3_->workspace_bytes() : dense_->workspace_bytes();
}

std::vector<const cuda::Exl3LinearCuda*> GpuLinear::groupable(
    std::span<const GpuLinear* const> linears, int64_t m) {
  std::vector<const cuda::Exl3LinearCuda*> g;
  if (linears.size() < 2) return g;
  for (const GpuLinear* l : linears) {
    if (!l->exl3_ || l->stored_in_ != l->in_ || l->stored_out_ != l->out_ || l->out_offset_ != 0)
      return {};
    g.push_back(l->exl3_.get());
  }
  if (!cuda::Exl3LinearCuda::can_group(g, m)) return {};
  return g;
}

size_t GpuLinear::group_workspace_bytes(std::span<const GpuLinear* const> linears) {
  if (linears.empty() || !linears[0]->exl3_) return 0;
  const auto& o = linears[0]->exl3_->options();
  const int64_t m = std::min(o.gemv_max_m, o.max_m);
  if (m < 1) return 0;
  const auto g = groupable(linears, m);
  return g.empty() ? 0 : cuda::Exl3LinearCuda::group_workspace_bytes(g, m);
}

void GpuLinear::run_group(std::span<const GpuLinear* const> linears, const float* x,
                          std::span<float* const> ys, int64_t m, void* ws, size_t ws_size,
                          const Pads& pads, cudaStream_t stream) {
  const auto g = groupable(linears, m);
  if (!g.empty() && x != nullptr && ws_size >= cuda::Exl3LinearCuda::group_workspace_bytes(g, m)) {
    std::vector<void*> out(ys.begin(), ys.end());
    EXL3_CUDA_CHECK(cuda::Exl3LinearCuda::run_group(g, x, cuda::DType::kF32, out, cuda::DType::kF32,
                                                    m, ws, ws_size, stream),
                    linears[0]->name_ + " (grouped)");
    return;
  }
  for (size_t i = 0; i < linears.size(); ++i)
    linears[i]->run(x, ys[i], m, ws, ws_size, pads, stream);
}

void GpuLinear::run(const float* x, float* y, int64_t m, void* ws, size_t ws_size, const Pads& pads,
                    cudaStream_t stream) const {
  if (mx_) {
    if (m < 1 || m > mx_->options().max_m || ws == nullptr || ws_size < mx_x_bytes_) {
      fail(
          "{} ({} rows, {} workspace bytes): the MXFP8 linear takes 1..{} rows and at least {} "
          "workspace bytes",
          name_, m, ws_size, mx_->options().max_m, mx_x_bytes_);
    }
    auto* xb = static_cast<char*>(ws);
    EXL3_CUDA_CHECK(cuda::convert_rows(x, in_, xb, cuda::DType::kBF16, in_, m, in_, stream),
                    name_ + " (BF16 input)");
    EXL3_CUDA_CHECK(
        mx_->run(xb, y, cuda::DType::kF32, m, xb + mx_x_bytes_, ws_size - mx_x_bytes_, stream),
        name_);
    return;
  }
  if (dense_) {
    EXL3_CUDA_CHECK(dense_->run(x, y, m, ws, ws_size, stream), name_);
    return;
  }
  const float* xin = x;
  if (stored_in_ != in_) {  // zero-pad the input columns
    EXL3_CUDA_CHECK(cudaMemsetAsync(pads.in, 0, static_cast<size_t>(m * stored_in_) * 4, stream),
                    name_ + " (pad)");
    EXL3_CUDA_CHECK(cudaMemcpy2DAsync(pads.in, static_cast<size_t>(stored_in_) * 4, x,
                                      static_cast<size_t>(in_) * 4, static_cast<size_t>(in_) * 4,
                                      static_cast<size_t>(m), cudaMemcpyDeviceToDevice, stream),
                    name_ + " (pad)");
    xin = pads.in;
  }
  float* yout = stored_out_ != out_ ? pads.out : y;
  EXL3_CUDA_CHECK(
      exl3_->run(xin, cuda::DType::kF32, yout, cuda::DType::kF32, m, ws, ws_size, stream), name_);
  if (yout != y) {
    EXL3_CUDA_CHECK(
        cudaMemcpy2DAsync(y, static_cast<size_t>(out_) * 4, yout + out_offset_,
                          static_cast<size_t>(stored_out_) * 4, static_cast<size_t>(out_) * 4,
                          static_cast<size_t>(m), cudaMemcpyDeviceToDevice, stream),
        name_ + " (trim)");
  }
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
