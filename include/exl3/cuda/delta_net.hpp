// The gated delta rule of a Gated DeltaNet layer (model::GatedDeltaNetSpec: Qwen3-Next's
// interleaved in_proj_qkvz / in_proj_ba, or Qwen3.5's split projections) on the GPU, for every
// sequence of a step at once. The host reference is exl3/runtime/delta_net.hpp; these kernels
// compute the same recurrence, token by token within each sequence, with fp32 state.
//
// A step's tokens come in runs: run r is tokens run_first[r] .. run_first[r] + run_len[r] - 1 of
// the step (consecutive), all of one sequence, continuing the state in slot run_slot[r] of the
// state pool. A slot holds every DeltaNet layer's state of one sequence; a layer's part starts
// at `layer_offset` floats: S of every value head [num_v_heads, head_k_dim, head_v_dim], then the
// convolution window [conv_kernel - 1, conv_dim] (oldest input first). A fresh sequence's slot
// must be zeroed before its first step. Launchers only enqueue work on `stream` (graph-capturable).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/trellis/hd.hpp"

namespace exl3::cuda {

struct DeltaNetShape {
  int num_k_heads = 0, num_v_heads = 0, head_k_dim = 0, head_v_dim = 0, conv_kernel = 0;
  float norm_eps = 0.0f;
  bool split_inputs = false;  // qkv, z, b, a (Qwen3.5) instead of qkvz, ba (Qwen3-Next)

  EXL3_HD int key_dim() const { return num_k_heads * head_k_dim; }
  EXL3_HD int value_dim() const { return num_v_heads * head_v_dim; }
  EXL3_HD int conv_dim() const { return 2 * key_dim() + value_dim(); }
  // floats of one layer's state in a slot
  EXL3_HD int64_t state_floats() const {
    return static_cast<int64_t>(num_v_heads) * head_k_dim * head_v_dim +
           static_cast<int64_t>(conv_kernel - 1) * conv_dim();
  }
};

// Whether the kernels run this shape (head_v_dim a divisor of 256, head_k_dim and head_v_dim at
// most 256, every value head's key rows spread over the block in at most 64 registers, v heads
// a multiple of k heads, a convolution of 1 to 8 taps); the backend refuses others with a hint.
bool delta_net_supports(const DeltaNetShape& s);

struct DeltaNetWeightsDev {
  const float* conv = nullptr;     // [conv_dim, conv_kernel]
  const float* a = nullptr;        // exp(A_log) [num_v_heads]
  const float* dt_bias = nullptr;  // [num_v_heads]
  const float* norm = nullptr;     // the gated RMSNorm's weight [head_v_dim]
};

struct DeltaNetRuns {
  const int32_t* token_run = nullptr;  // [tokens]: the run each token of the step belongs to
  const int32_t* first = nullptr;      // [runs]
  const int32_t* len = nullptr;        // [runs]
  const int32_t* slot = nullptr;       // [runs]
  int runs = 0;
};

struct DeltaNetStatePool {
  float* base = nullptr;
  int64_t slot_floats = 0;   // floats per slot (every DeltaNet layer of the model)
  int64_t layer_offset = 0;  // this layer's part of a slot
};

// in: the projections' outputs for `tokens` rows: qkvz [tokens, 2 key_dim + 2 value_dim] and
// ba [tokens, 2 num_v_heads]; or (split_inputs) qkv [tokens, conv_dim], z [tokens, value_dim],
// b and a [tokens, num_v_heads]. conv_ws: [tokens, conv_dim] floats of workspace.
// out: [tokens, value_dim], the gated norm's output (before out_proj). The states of the runs'
// slots advance by their tokens.
cudaError_t delta_net_forward(const DeltaNetShape& s, const DeltaNetWeightsDev& w,
                              const float* const in[4], int64_t tokens, const DeltaNetRuns& runs,
                              const DeltaNetStatePool& pool, float* conv_ws, float* out,
                              cudaStream_t stream);

// q [rows, heads * head_dim] and gate [rows, heads * head_dim] from qg [rows, heads * 2 *
// head_dim] ([query, gate] per head, as a gated attention's q_proj writes them).
cudaError_t split_query_gate(const float* qg, int64_t rows, int64_t heads, int64_t head_dim,
                             float* q, float* gate, cudaStream_t stream);

// y[r, i] *= sigmoid(gate[r, gate_width == 1 ? 0 : i]) for y [rows, width].
cudaError_t sigmoid_gate(float* y, const float* gate, int64_t rows, int64_t width,
                         int64_t gate_width, cudaStream_t stream);

}  // namespace exl3::cuda
