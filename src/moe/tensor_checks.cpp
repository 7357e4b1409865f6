// Per-tensor checks of the MoE loader (see tensor_checks.hpp).
#include "moe/tensor_checks.hpp"

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/trellis/bitstream.hpp"

namespace exl3::moe {
namespace {

std::string where(const TensorRef& r) {
  return fmt::format("{}: tensor '{}'", r.path().string(), r.name());
}
std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

int32_t marker_value(const TensorRef& r) {
  const TensorInfo& t = *r.info;
  if (t.dtype != DType::kI32 || t.rank() != 0) {
    fail("{}: dtype {} shape {}, but a codebook marker must be I32 with shape [] (0-dim)", where(r),
         dtype_name(t.dtype), shape_str(t.shape));
  }
  int32_t v = 0;
  std::memcpy(&v, r.bytes().data(), sizeof v);
  return v;
}

void expect_sentinel(const TensorRef& r, int32_t expected, trellis::Codebook cb) {
  const int32_t v = marker_value(r);
  if (v != expected) {
    fail(
        "{}: marker holds {} (0x{:08X}), expected the {} sentinel 0x{:08X}; hint: made with an "
        "unlocked experimental multiplier, which the kernels decode wrongly",
        where(r), v, static_cast<uint32_t>(v), trellis::codebook_name(cb),
        static_cast<uint32_t>(expected));
  }
}

}  // namespace

TrellisShape check_trellis(const TensorRef& ref, int declared_bits, int64_t in, int64_t out) {
  const TensorInfo& t = *ref.info;
  if (t.dtype != DType::kI16) {
    fail("{}: dtype {}, but a trellis must be I16", where(ref), dtype_name(t.dtype));
  }
  if (t.rank() != 3) {
    fail("{}: rank {} (shape {}), but a trellis must be rank 3 [in/16, out/16, 16*K]", where(ref),
         t.rank(), shape_str(t.shape));
  }
  const int64_t last = t.shape[2];
  if (last % 16 != 0 || last < 16 || last > 16 * trellis::kMaxBits) {
    fail("{}: last dim {} is not 16*K for K in 1..8", where(ref), last);
  }
  if (t.shape[0] <= 0 || t.shape[1] <= 0) {
    fail("{}: shape {} has a zero dim", where(ref), shape_str(t.shape));
  }
  TrellisShape s{static_cast<int>(last / 16), t.shape[0] * 16, t.shape[1] * 16};
  if (s.in % 128 != 0 || s.out % 128 != 0) {
    fail(
        "{}: K x N = {} x {} (shape {}) is not 128-aligned; hint: the Hadamard-128 rotations "
        "and rank slices need both dims to be multiples of 128",
        where(ref), s.in, s.out, shape_str(t.shape));
  }
  if (declared_bits > 0 && s.bits != declared_bits) {
    fail(
        "{}: stored K{} (last dim {}), but the metadata declares K{} for this expert; hint: the "
        "tier bitmap or bits does not match the tensors",
        where(ref), s.bits, last, declared_bits);
  }
  if ((in > 0 && s.in != in) || (out > 0 && s.out != out)) {
    fail("{}: {} x {} (shape {}), expected {} x {} like the layer's other experts", where(ref),
         s.in, s.out, shape_str(t.shape), in, out);
  }
  return s;
}

void check_fp16_vector(const TensorRef& ref, int64_t length, const char* what) {
  const TensorInfo& t = *ref.info;
  if (t.dtype != DType::kF16 || t.rank() != 1 || t.shape[0] != length) {
    fail("{}: {} {}, but {} must be F16 [{}]", where(ref), dtype_name(t.dtype), shape_str(t.shape),
         what, length);
  }
  const auto v = copy_tensor<uint16_t>(ref);
  for (size_t i = 0; i < v.size(); ++i) {
    if ((v[i] & 0x7C00u) == 0x7C00u) {
      fail("{}: element {} is not finite (fp16 bits 0x{:04X}); scales must be finite", where(ref),
           i, v[i]);
    }
  }
}

void check_legacy_signs(const TensorRef& ref, int64_t length) {
  const TensorInfo& t = *ref.info;
  if (t.dtype != DType::kI16 || t.rank() != 1 || t.shape[0] != length / 16) {
    fail("{}: {} {}, but legacy packed signs must be I16 [{}]", where(ref), dtype_name(t.dtype),
         shape_str(t.shape), length / 16);
  }
}

trellis::Codebook check_markers(const std::string& prefix, const TensorRef* mcg,
                                const TensorRef* mul1, const std::string& root) {
  if (mcg != nullptr && mul1 != nullptr) {
    fail(
        "{}: EXL3 expert '{}' has both 'mcg' and 'mul1' markers; hint: exllamav3 refuses this "
        "too (\"Specified both mcg and mul1\")",
        root, prefix);
  }
  if (mcg != nullptr) {
    expect_sentinel(*mcg, trellis::kMcgMarker, trellis::Codebook::kMcg);
    return trellis::Codebook::kMcg;
  }
  if (mul1 != nullptr) {
    expect_sentinel(*mul1, trellis::kMul1Marker, trellis::Codebook::kMul1);
    return trellis::Codebook::kMul1;
  }
  return trellis::Codebook::k3Inst;
}

void check_model_config(const ModelConfig& config, const MoeLayerWeights& w,
                        const std::string& label) {
  if (const auto act = config.raw.find("hidden_act"); act != config.raw.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      fail(
          "{}: key 'hidden_act' is {}, but the MoE computes SiLU(gate) * up; hint: other "
          "expert activations are not supported",
          label, act->dump());
    }
  }
  const auto up128 = [](int64_t v) { return (v + 127) / 128 * 128; };
  if (config.hidden_size > 0 && up128(config.hidden_size) != w.hidden) {
    fail("{}: hidden_size {} does not match the experts' stored H {} (layer {})", label,
         config.hidden_size, w.hidden, w.layer);
  }
  if (config.moe_intermediate_size > 0) {
    const int64_t want = w.rotation == RotationLayout::kPlain ? up128(config.moe_intermediate_size)
                                                              : config.moe_intermediate_size;
    if (w.intermediate * w.tp != want) {
      fail(
          "{}: moe_intermediate_size {} does not match the experts' stored {} x TP {} (layer "
          "{}); hint: each rank holds I / tp rows",
          label, config.moe_intermediate_size, w.intermediate, w.tp, w.layer);
    }
  }
}

}  // namespace exl3::moe
