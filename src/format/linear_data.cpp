// Exl3LinearData: host copies of one linear's small tensors plus a view of its trellis.
#include <cstring>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/trellis/tile.hpp"

namespace exl3 {
namespace {

// Re-checks a tensor against the info it is loaded for: the info may come from another store.
const TensorRef& member(const TensorStore& store, const Exl3LinearInfo& info, const char* suffix,
                        DType dtype, int64_t length) {
  // A shared_h_v1 expert has no hidden-side vector of its own (see shared_h_row).
  std::string name = info.prefix + "." + suffix;
  if (!store.contains(name)) {
    if (const auto row = shared_h_row(info.prefix); row && row->field == suffix) name = row->name;
  }
  const TensorRef& r = store.at(name);
  const TensorInfo& t = *r.info;
  if (t.dtype != dtype || t.rank() != 1 || t.shape[0] != length) {
    fail("{}: tensor '{}': expected {} [{}] for EXL3 linear '{}', found {} with {} dims",
         r.path().string(), t.name, dtype_name(dtype), length, info.prefix, dtype_name(t.dtype),
         t.rank());
  }
  return r;
}

std::vector<uint16_t> expand_signs(const TensorRef& r, int64_t channels) {
  const auto packed = copy_tensor<uint16_t>(r);
  std::vector<uint16_t> out(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c)
    out[static_cast<size_t>(c)] = trellis::legacy_sign_bits(packed.data(), c);
  return out;
}

}  // namespace

Exl3LinearData Exl3LinearData::load(const Checkpoint& ckpt, std::string_view prefix) {
  return load(ckpt.store(), ckpt.linear(prefix));
}

Exl3LinearData Exl3LinearData::load(const TensorStore& store, const Exl3LinearInfo& info) {
  Exl3LinearData d;
  d.info_ = info;
  const TensorRef& tr = store.at(info.prefix + ".trellis");
  const std::vector<int64_t> want{info.in_features / 16, info.out_features / 16,
                                  16 * int64_t{info.bits}};
  if (tr.info->dtype != DType::kI16 || tr.info->shape != want) {
    fail("{}: tensor '{}': does not match the EXL3 linear info it is loaded for",
         tr.path().string(), tr.name());
  }
  const auto bytes = tr.bytes();
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint16_t) == 0) {
    d.trellis_view_ = reinterpret_cast<const uint16_t*>(bytes.data());
  } else {
    d.trellis_copy_ = copy_tensor<uint16_t>(tr);
  }

  if (info.rotation == Rotation::kSuhSvh) {
    d.suh_ = copy_tensor<uint16_t>(member(store, info, "suh", DType::kF16, info.in_features));
    d.svh_ = copy_tensor<uint16_t>(member(store, info, "svh", DType::kF16, info.out_features));
  } else {
    d.suh_ = expand_signs(member(store, info, "su", DType::kI16, info.in_features / 16),
                          info.in_features);
    d.svh_ = expand_signs(member(store, info, "sv", DType::kI16, info.out_features / 16),
                          info.out_features);
  }
  if (info.has_bias) {
    const TensorRef& b = store.at(info.prefix + ".bias");
    d.bias_ = read_as_float(member(store, info, "bias", b.info->dtype, info.out_features));
  }
  return d;
}

std::span<const uint16_t> Exl3LinearData::trellis() const {
  if (trellis_view_ == nullptr) return trellis_copy_;
  const auto n =
      static_cast<size_t>((info_.in_features / 16) * (info_.out_features / 16) * 16 * info_.bits);
  return {trellis_view_, n};
}

}  // namespace exl3
