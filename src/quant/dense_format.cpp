// `exl3 quantize --dense-format`: which dense linears (attention, dense MLP, shared experts) are
// written as BF16 or MXFP8 instead of EXL3 -- decided by the MXFP8 overlay's own plan, so a
// stored-MXFP8 checkpoint holds exactly what `--overlay` would convert at load -- and how one
// such linear is staged (see exl3/quant/convert.hpp).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/mxfp8/weight.hpp"
#include "exl3/quant/convert.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/runtime/overlay.hpp"
#include "exl3/trellis/half.hpp"
#include "quant/convert_internal.hpp"
#include "quant/stream_writer.hpp"

namespace exl3::quant {

std::string_view dense_format_name(DenseFormat f) {
  switch (f) {
    case DenseFormat::kBf16: return "bf16";
    case DenseFormat::kMxfp8: return "mxfp8";
    case DenseFormat::kExl3: break;
  }
  return "exl3";
}

std::optional<DenseFormat> parse_dense_format(std::string_view s) {
  if (s == "exl3") return DenseFormat::kExl3;
  if (s == "bf16") return DenseFormat::kBf16;
  if (s == "mxfp8") return DenseFormat::kMxfp8;
  return std::nullopt;
}

std::map<std::string, DenseFormat> plan_dense_formats(const std::filesystem::path& in_dir, DenseFormat format,
                                                      const std::vector<std::string>& ignore) {
  if (format != DenseFormat::kMxfp8 && !ignore.empty()) {
    fail("quantize: --dense-ignore ('{}') applies to --dense-format mxfp8 only (the ignored linears stay BF16 "
         "there); with --dense-format {} drop it",
         ignore.front(), dense_format_name(format));
  }
  std::map<std::string, DenseFormat> out;
  if (format == DenseFormat::kExl3) return out;
  const Checkpoint src = Checkpoint::open(in_dir);
  const runtime::ModelSpec spec = runtime::describe_model(src);
  runtime::OverlayPolicy policy;
  policy.linear = policy.shared_experts = true;
  // The overlay's own entry rules, with errors naming this option.
  policy.ignore = runtime::parse_overlay_config(nlohmann::json{{"ignore", ignore}}, "quantize --dense-ignore").ignore;
  const auto plan = runtime::OverlayPlan::build(policy, src, spec);
  for (const auto& [prefix, d] : plan.decisions()) {
    if (!spec.lm_head_tied && prefix == spec.lm_head) continue;  // --head-bits decides the head
    out[prefix] = format == DenseFormat::kMxfp8 && d.action == runtime::OverlayAction::kMxfp8 ? DenseFormat::kMxfp8
                                                                                              : DenseFormat::kBf16;
  }
  return out;
}

namespace detail {
namespace {

// Every element of a float tensor as fp32, refusing non-finite values (a broken source is never
// silently stored), with the element's [row, column].
std::vector<float> finite_f32(const TensorRef& ref) {
  std::vector<float> v = read_as_float(ref);
  const int64_t cols = ref.info->shape.back();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      fail("{}: tensor '{}': element [{}, {}] is {} (weights must be finite)", ref.path().string(), ref.name(),
           static_cast<int64_t>(i) / cols, static_cast<int64_t>(i) % cols, v[i]);
    }
  }
  return v;
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

}  // namespace

TensorReport stage_dense_linear(const TensorStore& store, const PlanItem& item, const fs::path& file) {
  const TensorRef& ref = store.at(item.source);
  const DType dt = ref.info->dtype;
  const int64_t out = item.out_features, in = item.in_features;
  const std::vector<int64_t> shape = {out, in};
  const std::vector<float> w = finite_f32(ref);  // checks every element, whatever the format
  TensorReport rep;
  rep.name = item.name;
  rep.source_bytes = ref.bytes().size();
  std::vector<StreamEntry> e;
  std::vector<uint16_t> bf16;
  std::optional<mxfp8::Weight> mx;
  if (item.dense_format == DenseFormat::kMxfp8) {
    // From the stored bytes when the codec takes them (what the runtime's --overlay converts),
    // else (F64) from their fp32 values.
    const bool direct = is_float_matrix_dtype(dt);
    const std::byte* src = direct ? ref.bytes().data() : reinterpret_cast<const std::byte*>(w.data());
    const DType src_type = direct ? dt : DType::kF32;
    const std::string label = fmt::format("{}: tensor '{}'", ref.path().string(), ref.name());
    mx = mxfp8::Weight::quantize(label, src, src_type, out, in);
    const auto err = mxfp8::conversion_error(*mx, src, src_type);
    e.push_back(span_entry(item.name + ".weight", DType::kF8E4M3, shape,
                           std::as_bytes(std::span<const uint8_t>(mx->values(), static_cast<size_t>(out * in)))));
    e.push_back(span_entry(item.name + mxfp8::kScaleSuffix, DType::kU8, {out, mx->blocks_per_row()},
                           std::as_bytes(std::span<const uint8_t>(
                               mx->scales(), static_cast<size_t>(out * mx->blocks_per_row())))));
    rep.mxfp8 = true;
    rep.rel_l2 = err.rel_l2;
    rep.max_abs = err.max_abs;
    rep.stored_bytes = mx->bytes();
  } else if (dt == DType::kBF16 || dt == DType::kF16) {
    e.push_back(span_entry(item.name + ".weight", dt, shape, ref.bytes()));
    rep.stored_bytes = ref.bytes().size();
  } else {  // F32 / F64: BF16 keeps the range
    bf16.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) bf16[i] = trellis::float_to_bf16(w[i]);
    e.push_back(span_entry(item.name + ".weight", DType::kBF16, shape, bytes_of(bf16)));
    rep.stored_bytes = bf16.size() * 2;
  }
  std::vector<float> bias32;
  if (!item.bias.empty()) {
    const TensorRef& b = store.at(item.bias);
    if (b.info->dtype == DType::kF64) {
      bias32 = read_as_float(b);
      e.push_back(span_entry(item.name + ".bias", DType::kF32, b.info->shape, bytes_of(bias32)));
    } else {
      e.push_back(span_entry(item.name + ".bias", b.info->dtype, b.info->shape, b.bytes()));
    }
  }
  write_safetensors_streaming(file, std::move(e), {});
  release_pages(ref.bytes());
  return rep;
}

}  // namespace detail
}  // namespace exl3::quant
