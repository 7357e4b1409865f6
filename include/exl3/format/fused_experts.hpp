// Fused expert tensors as transformers stores gpt-oss's: one tensor per projection for every
// expert of a layer, input-major ([E, in, columns], applied as x @ W[e]), and a bias [E, columns].
// gate_up_proj interleaves its columns (gate channel c at 2c, up channel c at 2c + 1), so one
// expert's linear is a strided set of columns. OpenAI's released checkpoints store the same
// tensor as MXFP4: `<name>_blocks` U8 [E, columns, in / 32, 16] (two e2m1 values a byte, the low
// nibble first) and `<name>_scales` U8 [E, columns, in / 32] (a power of two per 32 inputs,
// biased by 127). The runtime (unquantized experts) and the converter (which quantizes each
// expert's gate, up and down as a linear) both read them here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exl3/format/safetensors.hpp"

namespace exl3 {

// Columns offset + stride * j for j in [first, first + count): one linear's outputs.
struct FusedColumns {
  int64_t offset = 0;
  int64_t stride = 1;
  int64_t first = 0;
  int64_t count = 0;
};

// One fused projection, float or MXFP4.
struct FusedExpertTensor {
  std::string name;  // the float tensor's name (MXFP4: without _blocks / _scales)
  int64_t experts = 0, in = 0, columns = 0;
  const TensorRef* dense = nullptr;   // [E, in, columns]
  const TensorRef* blocks = nullptr;  // MXFP4
  const TensorRef* scales = nullptr;
};

// Whether `store` holds the fused projection `name` in either form.
bool has_fused_expert_tensor(const TensorStore& store, const std::string& name);
// The fused projection `name` of `store`, checked: a float tensor [experts, in, columns] or its
// MXFP4 pair of the same shape. Throws exl3::Error naming the tensor otherwise.
FusedExpertTensor fused_expert_tensor(const TensorStore& store, const std::string& name,
                                      int64_t experts, int64_t in);
// Expert e's chosen columns as fp32 [in, count] (input-major), refusing columns outside the
// tensor and non-finite values.
std::vector<float> fused_expert_columns(const FusedExpertTensor& t, int64_t expert,
                                        const FusedColumns& c);
// Expert e's entries of the bias `name` [E, columns] for the same columns.
std::vector<float> fused_expert_bias(const TensorStore& store, const std::string& name,
                                     int64_t experts, int64_t expert, const FusedColumns& c);

}  // namespace exl3
