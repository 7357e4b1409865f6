// Fused expert tensors (see fused_experts.hpp).
#include "exl3/format/fused_experts.hpp"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/format/float_element.hpp"

namespace exl3 {
namespace {

bool is_float(DType t) {
  return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32 || t == DType::kF64;
}

// The e2m1 values of the 16 nibbles (sign bit 3, then 2 exponent bits and 1 mantissa bit).
constexpr float kFp4[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

void check_columns(const std::string& where, const std::string& name, int64_t columns,
                   const FusedColumns& c) {
  const int64_t last = c.offset + c.stride * (c.first + c.count - 1);
  if (c.count <= 0 || c.stride <= 0 || c.offset < 0 || c.first < 0 || last >= columns) {
    fail("{}: tensor '{}': columns {} + {} * [{}, {}) are outside its {} columns", where, name,
         c.offset, c.stride, c.first, c.first + c.count, columns);
  }
}

std::string shape_of(const TensorRef& t) {
  return fmt::format("{} [{}]", dtype_name(t.info->dtype), fmt::join(t.info->shape, ", "));
}

}  // namespace

bool has_fused_expert_tensor(const TensorStore& store, const std::string& name) {
  return store.contains(name) || store.contains(name + "_blocks");
}

FusedExpertTensor fused_expert_tensor(const TensorStore& store, const std::string& name,
                                      int64_t experts, int64_t in) {
  FusedExpertTensor f;
  f.name = name;
  f.experts = experts;
  f.in = in;
  if (const TensorRef* t = store.find(name)) {
    const TensorInfo& i = *t->info;
    if (!is_float(i.dtype) || i.rank() != 3 || i.shape[0] != experts || i.shape[1] != in) {
      fail(
          "{}: tensor '{}' is {}; expected fused experts, a float tensor [{}, {}, columns] "
          "(experts, inputs, outputs)",
          t->path().string(), name, shape_of(*t), experts, in);
    }
    f.dense = t;
    f.columns = i.shape[2];
    return f;
  }
  f.blocks = store.find(name + "_blocks");
  f.scales = store.find(name + "_scales");
  if (f.blocks == nullptr || f.scales == nullptr) {
    fail("{}: tensor '{}' is missing (neither float nor MXFP4 '{}_blocks' / '{}_scales')",
         store.root().string(), name, name, name);
  }
  const TensorInfo& b = *f.blocks->info;
  const TensorInfo& s = *f.scales->info;
  const bool ok = b.dtype == DType::kU8 && s.dtype == DType::kU8 && b.rank() == 4 &&
                  s.rank() == 3 && in % 32 == 0 && b.shape[0] == experts && b.shape[2] == in / 32 &&
                  b.shape[3] == 16 && s.shape[0] == experts && s.shape[1] == b.shape[1] &&
                  s.shape[2] == in / 32;
  if (!ok) {
    fail(
        "{}: MXFP4 tensors '{}_blocks' {} and '{}_scales' {}; expected U8 [{}, columns, {}, 16] "
        "and U8 [{}, columns, {}] ({} inputs in blocks of 32)",
        f.blocks->path().string(), name, shape_of(*f.blocks), name, shape_of(*f.scales), experts,
        in / 32, experts, in / 32, in);
  }
  f.columns = b.shape[1];
  return f;
}

std::vector<float> fused_expert_columns(const FusedExpertTensor& t, int64_t expert,
                                        const FusedColumns& c) {
  const TensorRef& any = t.dense != nullptr ? *t.dense : *t.blocks;
  check_columns(any.path().string(), t.name, t.columns, c);
  const int64_t in = t.in;
  std::vector<float> w(static_cast<size_t>(in * c.count));
  for (int64_t j = 0; j < c.count; ++j) {
    const int64_t col = c.offset + c.stride * (c.first + j);
    for (int64_t r = 0; r < in; ++r) {
      float v = 0.0f;
      if (t.dense != nullptr) {
        v = float_element(t.dense->bytes().data(), t.dense->info->dtype,
                          static_cast<size_t>((expert * in + r) * t.columns + col));
      } else {
        // Row (expert, col) holds in / 32 blocks of 16 bytes: input r is nibble r % 2 of byte
        // r / 2, scaled by 2^(scale - 127) of its block.
        const auto block = static_cast<size_t>((expert * t.columns + col) * (in / 32) + r / 32);
        const auto byte = static_cast<uint8_t>(t.blocks->bytes()[block * 16 + (r % 32) / 2]);
        const auto scale = static_cast<uint8_t>(t.scales->bytes()[block]);
        v = std::ldexp(kFp4[r % 2 == 0 ? byte & 0x0F : byte >> 4], static_cast<int>(scale) - 127);
      }
      if (!std::isfinite(v)) {
        fail("{}: tensor '{}': element [{}, {}, {}] is {} (weights must be finite)",
             any.path().string(), t.name, expert, r, col, v);
      }
      w[static_cast<size_t>(r * c.count + j)] = v;
    }
  }
  return w;
}

std::vector<float> fused_expert_bias(const TensorStore& store, const std::string& name,
                                     int64_t experts, int64_t expert, const FusedColumns& c) {
  const TensorRef* t = store.find(name);
  if (t == nullptr) fail("{}: tensor '{}' is missing", store.root().string(), name);
  const TensorInfo& i = *t->info;
  if (!is_float(i.dtype) || i.rank() != 2 || i.shape[0] != experts) {
    fail("{}: tensor '{}' is {}; expected fused expert biases, a float tensor [{}, columns]",
         t->path().string(), name, shape_of(*t), experts);
  }
  check_columns(t->path().string(), name, i.shape[1], c);
  std::vector<float> b(static_cast<size_t>(c.count));
  for (int64_t j = 0; j < c.count; ++j) {
    const int64_t col = c.offset + c.stride * (c.first + j);
    b[static_cast<size_t>(j)] =
        float_element(t->bytes().data(), i.dtype, static_cast<size_t>(expert * i.shape[1] + col));
    if (!std::isfinite(b[static_cast<size_t>(j)])) {
      fail("{}: tensor '{}': element [{}, {}] is not finite", t->path().string(), name, expert,
           col);
    }
  }
  return b;
}

}  // namespace exl3
