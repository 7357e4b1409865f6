// Greedy token selection on the GPU: the argmax of each logits row where the logits already are,
// so a greedy decode step brings back a few ids instead of rows × vocab floats.
//
// Same result as exl3::runtime::argmax's sequential scan (the largest value; the lowest id among
// equal values; -0 equals +0; a NaN is never larger than anything, so a NaN in the first column
// wins every comparison and yields id 0, and a NaN elsewhere is never picked).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace exl3::cuda {

// Where a row's vocabulary lives: `parts` column blocks (one per tensor-parallel rank; 1 on one
// GPU). Row r's part p holds ids begin[p] .. begin[p] + count[p] - 1 at
// logits + p * part_stride + r * row_stride.
constexpr int kArgmaxMaxParts = 8;
struct ArgmaxLayout {
  int parts = 1;
  int64_t part_stride = 0;  // floats
  int64_t row_stride = 0;   // floats
  int32_t begin[kArgmaxMaxParts] = {};
  int32_t count[kArgmaxMaxParts] = {};
};

// keys[rows] (uint64, device): each row's winner packed as (ordered value bits << 32) |
// (0xFFFFFFFF - id); argmax_id() unpacks one. Runs a memset of keys and one launch; asynchronous
// on `stream`.
cudaError_t argmax_rows(const float* logits, const ArgmaxLayout& layout, int64_t rows,
                        uint64_t* keys, cudaStream_t stream);

inline int32_t argmax_id(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFu));
}

}  // namespace exl3::cuda
