// Staging one plan item: an EXL3 linear is read (transposed to input-major [in, out] fp32 while
// decoding), checked for non-finite values, quantized and written as trellis/suh/svh/marker/bias;
// a plain tensor is streamed through (bf16/fp16 as stored, fp32/fp64 and routers to fp16) in
// bounded chunks. Source pages are released after use so RSS does not grow with the model.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/format/float_element.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/half.hpp"
#include "quant/convert_internal.hpp"
#include "quant/stream_writer.hpp"

namespace exl3::quant::detail {

namespace tr = exl3::trellis;

namespace {

// Element i of a float tensor's bytes (unaligned-safe).
struct FloatReader {
  const std::byte* p;
  DType t;
  float operator()(size_t i) const { return float_element(p, t, i); }
};

std::string index_string(size_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = static_cast<int64_t>(flat % static_cast<size_t>(shape[d]));
    flat /= static_cast<size_t>(shape[d]);
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

// HF weight [out, in] -> fp32 [in, out]. Blocked so both sides stay in cache.
std::vector<float> load_transposed(const TensorRef& ref) {
  const int64_t out = ref.info->shape[0], in = ref.info->shape[1];
  const FloatReader rd{ref.bytes().data(), ref.info->dtype};
  std::vector<float> w(static_cast<size_t>(in * out));
  constexpr int64_t B = 64;
  for (int64_t o0 = 0; o0 < out; o0 += B) {
    for (int64_t i0 = 0; i0 < in; i0 += B) {
      for (int64_t o = o0; o < std::min(out, o0 + B); ++o) {
        for (int64_t i = i0; i < std::min(in, i0 + B); ++i) {
          const float v = rd(static_cast<size_t>(o * in + i));
          if (!std::isfinite(v)) {
            fail("{}: tensor '{}': element [{}, {}] is {} (weights must be finite)",
                 ref.path().string(), ref.name(), o, i, v);
          }
          w[static_cast<size_t>(i * out + o)] = v;
        }
      }
    }
  }
  return w;
}

uint16_t to_f16_checked(float v, const TensorRef& ref, size_t flat) {
  const uint16_t h = tr::float_to_half(v);
  if (std::isfinite(v) && (h & 0x7C00u) == 0x7C00u) {
    fail("{}: tensor '{}': element {} = {} overflows fp16", ref.path().string(), ref.name(),
         index_string(flat, ref.info->shape), v);
  }
  return h;
}

// Elements converted per chunk when streaming a plain tensor.
constexpr size_t kChunkElems = size_t{1} << 20;

std::span<const std::byte> bytes_of(const std::vector<uint16_t>& v) {
  return std::as_bytes(std::span(v));
}

TensorReport stage_linear(const TensorStore& store, const PlanItem& item, const ConvertOptions& o,
                          const fs::path& file, const std::vector<double>* hessian) {
  // A fused expert's columns come input-major: already the [in, out] the quantizer takes. (Its
  // tensor is read again for the next expert, so its pages stay.)
  const bool fused = item.fused_expert >= 0;
  std::vector<float> w;
  std::string where, what;  // the source, for errors
  if (fused) {
    const auto t = fused_expert_tensor(store, item.source, store.at(item.bias).info->shape[0],
                                       item.in_features);
    w = fused_expert_columns(t, item.fused_expert, item.fused_columns);
    where = store.root().string();
    what = fmt::format("{}' expert '{}", item.source, item.fused_expert);
  } else {
    const TensorRef& ref = store.at(item.source);
    w = load_transposed(ref);
    release_pages(ref.bytes());
    where = ref.path().string();
    what = ref.name();
  }

  QuantOptions q;
  q.bits = item.bits;
  q.codebook = o.codebook;
  q.seed = tensor_seed(o.seed, item.name);
  q.out_scales = o.out_scales;
  q.g_scale = o.g_scale;
  q.device = o.device;
  QuantizedTensor r;
  HessianView hv;
  if (hessian != nullptr) hv = {nullptr, hessian->data(), item.in_features, item.in_features};
  try {
    r = quantize_tensor(w.data(), item.in_features, item.out_features, q,
                        hessian != nullptr ? &hv : nullptr);
  } catch (const Error& e) {
    fail("{}: tensor '{}': {}", where, what, e.what());
  }
  std::vector<float>().swap(w);

  std::vector<uint16_t> bias;
  if (!item.bias.empty()) {
    const TensorRef& b = store.at(item.bias);
    const std::vector<float> bf = fused ? fused_expert_bias(store, item.bias, b.info->shape[0],
                                                            item.fused_expert, item.fused_columns)
                                        : read_as_float(b);
    bias.assign(static_cast<size_t>(r.padded_out), 0);  // padded outputs get bias 0
    for (size_t i = 0; i < bf.size(); ++i) {
      if (!std::isfinite(bf[i])) {
        fail("{}: tensor '{}': element [{}] is {} (biases must be finite)", b.path().string(),
             b.name(), i, bf[i]);
      }
      bias[i] = to_f16_checked(bf[i], b, i);
    }
  }

  const std::string& p = item.name;
  const int32_t marker = o.codebook == tr::Codebook::kMcg ? tr::kMcgMarker : tr::kMul1Marker;
  std::vector<StreamEntry> e;
  e.push_back(span_entry(p + ".trellis", DType::kI16,
                         {r.padded_in / 16, r.padded_out / 16, 16 * r.bits}, bytes_of(r.trellis)));
  e.push_back(span_entry(p + ".suh", DType::kF16, {r.padded_in}, bytes_of(r.suh)));
  e.push_back(span_entry(p + ".svh", DType::kF16, {r.padded_out}, bytes_of(r.svh)));
  if (o.codebook != tr::Codebook::k3Inst) {
    e.push_back(span_entry(p + (o.codebook == tr::Codebook::kMcg ? ".mcg" : ".mul1"), DType::kI32,
                           {}, std::as_bytes(std::span<const int32_t>(&marker, 1))));
  }
  if (!bias.empty())
    e.push_back(span_entry(p + ".bias", DType::kF16, {r.padded_out}, bytes_of(bias)));
  write_safetensors_streaming(file, std::move(e), {});

  TensorReport rep;
  rep.name = item.name;
  rep.quantized = true;
  rep.bits = r.bits;
  rep.proxy_err = r.proxy_err;
  return rep;
}

TensorReport stage_plain(const TensorStore& store, const PlanItem& item, const fs::path& file) {
  const TensorRef& ref = store.at(item.source);
  const auto src = ref.bytes();
  StreamEntry e;
  e.name = item.name;
  e.dtype = item.out_dtype;
  e.shape = ref.info->shape;
  const auto numel = static_cast<size_t>(ref.info->numel());
  e.nbytes = numel * dtype_size(item.out_dtype);
  if (item.out_dtype == ref.info->dtype) {
    e.produce = [src](const ByteSink& sink) {
      for (size_t off = 0; off < src.size(); off += kChunkElems * 4) {
        const auto piece = src.subspan(off, std::min(src.size() - off, kChunkElems * 4));
        sink(piece);
        release_pages(piece);
      }
    };
  } else if (item.out_dtype == DType::kF16) {
    e.produce = [&ref, src, numel](const ByteSink& sink) {
      const FloatReader rd{src.data(), ref.info->dtype};
      std::vector<uint16_t> buf;
      for (size_t i0 = 0; i0 < numel; i0 += kChunkElems) {
        const size_t n = std::min(numel - i0, kChunkElems);
        buf.resize(n);
        for (size_t i = 0; i < n; ++i) buf[i] = to_f16_checked(rd(i0 + i), ref, i0 + i);
        sink(std::as_bytes(std::span<const uint16_t>(buf)));
      }
      release_pages(src);
    };
  } else {
    fail("{}: tensor '{}': no conversion from {} to {}", ref.path().string(), ref.name(),
         dtype_name(ref.info->dtype), dtype_name(item.out_dtype));
  }
  write_safetensors_streaming(file, {std::move(e)}, {});
  TensorReport rep;
  rep.name = item.name;
  return rep;
}

}  // namespace

uint64_t tensor_seed(uint64_t seed, std::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, then a splitmix64 finaliser with the run seed
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  uint64_t z = h ^ (seed + 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

TensorReport stage_item(const TensorStore& store, const PlanItem& item, const ConvertOptions& o,
                        const fs::path& file, const std::vector<double>* hessian) {
  const double t0 = now_seconds();
  TensorReport r =
      item.kind == PlanItem::Kind::kExl3Linear    ? stage_linear(store, item, o, file, hessian)
      : item.kind == PlanItem::Kind::kDenseLinear ? stage_dense_linear(store, item, file)
                                                  : stage_plain(store, item, file);
  r.seconds = now_seconds() - t0;
  return r;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace exl3::quant::detail
