// Multi-head latent attention (DeepSeek-V3 / Kimi-K2 / GLM-5) and the DSA lightning indexer on
// the GPU (src/cuda/mla_attention.cu, src/cuda/dsa_indexer.cu). The CPU backend's
// mla_attention (src/runtime/cpu_backend.cpp) is the reference every kernel is tested against.
//
// The cache holds, per token, only the normed latent (kv_lora_rank) and the roped shared key part
// (qk_rope_head_dim), fp16, in the paged layout of PagedKv (PagedKv::k; v unused). Attention runs
// in the absorbed form for every token, decode and prefill alike: kv_b_proj's key rows are folded
// into the query (q_lat = W_UK^T q_nope), the scores read the cached latent directly, the softmax
// weights sum latents (o_lat), and kv_b_proj's value rows expand o_lat into each head's output.
// Nothing per head is ever cached or materialised for the context, so a step reads the latent
// cache once per group of kMlaHeadsPerBlock heads and kv_b_proj once per kMlaTokensPerBlock
// tokens. Every launcher is asynchronous on `stream`, never allocates or synchronises (a decode
// step of them is captured as a CUDA graph) and returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/cuda/dtype.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/trellis/hd.hpp"

namespace exl3::cuda {

struct MlaShape {
  int heads = 0;      // this rank's heads
  int nope = 0;       // qk_nope_head_dim
  int rope_half = 0;  // qk_rope_head_dim / 2
  int v_dim = 0;      // v_head_dim
  int lora = 0;       // kv_lora_rank
  EXL3_HD int qk() const { return nope + 2 * rope_half; }
  EXL3_HD int latent_width() const { return lora + 2 * rope_half; }  // a cache slot (halves)
};

// Heads one attention block scores together (the latent chunk it loads serves them all) and
// tokens the kv_b_proj kernels share one read of the weight among.
constexpr int kMlaHeadsPerBlock = 8;
constexpr int kMlaTokensPerBlock = 8;
// Limits of the kernels (checked by mla_supports): latent <= 512 channels (even), rope <= 128, a
// head's nope part <= 256.
constexpr int kMlaMaxRopeHalf = 64;
constexpr int kMlaMaxNope = 256;
bool mla_supports(const MlaShape& s);

// For every token t < n: RoPE (cos/sin rows of rope_cs [max_pos, 2, rope_half] at pos[t]) on the
// rope part of each head of q [n, heads, nope + 2 * rope_half] (in place), and the cache slot of
// (seq_row[t], pos[t]) set to [rms_norm(kv_a latent) * kv_norm, RoPE(kv_a rope part)] from kv_a
// [n, lora + 2 * rope_half]. `interleave`: the rope parts pair (2i, 2i + 1) and are written
// de-interleaved (evens then odds), as transformers does; queries and keys alike.
cudaError_t mla_rope_store(float* q, const float* kv_a, const float* kv_norm, float eps,
                           const float* rope_cs, bool interleave, TokenMeta meta, int64_t n,
                           const MlaShape& s, const PagedKv& kv, cudaStream_t stream);

// q_lat [n, heads, lora] = per head, q_nope [nope] times kv_b_proj's key rows of the head
// (kv_b [heads * (nope + v_dim), lora], dtype f32 / f16 / bf16).
cudaError_t mla_absorb_q(const float* q, const void* kv_b, DType kv_b_type, int64_t n,
                         const MlaShape& s, float* q_lat, cudaStream_t stream);

// o_lat [n, heads, lora] = softmax over the attended positions of scale * (q_lat . latent_j +
// q_rope . key_rope_j), weighting the latents. The positions of token t: 0..pos[t] of its
// sequence, or (selection non-null) the count[t] positions selection[t * sel_stride + i].
// Split-KV: with few (token, head group) blocks, each is cut into mla_attend_splits(n, s) ranges
// of its positions run by separate blocks, whose partial softmax states a second kernel merges in
// a fixed order; the split count depends only on n and the shape (never on the context), so a
// captured step replays at any length. `workspace` holds mla_attend_workspace_bytes(n_max, s)
// bytes for any n <= n_max (with less, every block runs unsplit).
int mla_attend_splits(int64_t n, const MlaShape& s);
size_t mla_attend_workspace_bytes(int64_t n_max, const MlaShape& s);
cudaError_t mla_attend(const float* q_lat, const float* q, const int32_t* selection,
                       int64_t sel_stride, const int32_t* count, TokenMeta meta, int64_t n,
                       const MlaShape& s, float scale, const PagedKv& kv, void* workspace,
                       size_t workspace_bytes, float* o_lat, cudaStream_t stream);

// out [n, heads * v_dim] = per head, kv_b_proj's value rows times o_lat.
cudaError_t mla_expand_v(const float* o_lat, const void* kv_b, DType kv_b_type, int64_t n,
                         const MlaShape& s, float* out, cudaStream_t stream);

// ---- DSA lightning indexer (DeepSeek-V3.2, GLM-5) --------------------------------------------

struct DsaShape {
  int heads = 0;      // index_n_heads
  int head_dim = 0;   // index_head_dim
  int rope_half = 0;  // RoPE on the first 2 * rope_half channels of each head and the key
  int topk = 0;       // index_topk
};
bool dsa_supports(const DsaShape& s);

// For every token t < n: RoPE on each head of iq [n, heads, head_dim] (in place), and the key ik
// [n, head_dim] LayerNormed (ln_w, ln_b, eps 1e-6), roped and stored (fp32) at the cache slot of
// (seq_row[t], pos[t]) in keys [slots, head_dim] (slots as PagedKv's page tables give them).
cudaError_t dsa_index_store(float* iq, const float* ik, const float* ln_w, const float* ln_b,
                            const float* rope_cs, bool interleave, TokenMeta meta, int64_t n,
                            const DsaShape& s, float* keys, const PagedKv& kv, cudaStream_t stream);

// For every token t < n: the score of each position j <= pos[t], sum over heads of
// weights[t, h] * heads^-1/2 * relu(iq[t, h] . key_j * head_dim^-1/2), and the top-k positions
// (ties to the lower position) in ascending order into selection [n, topk], their number
// (min(topk, pos[t] + 1)) into count [n]. scratch: [n, max_pages * page_size] floats.
cudaError_t dsa_index_select(const float* iq, const float* weights, const float* keys,
                             TokenMeta meta, int64_t n, const DsaShape& s, const PagedKv& kv,
                             float* scratch, int32_t* selection, int32_t* count,
                             cudaStream_t stream);

}  // namespace exl3::cuda
