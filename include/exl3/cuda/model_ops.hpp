// Device kernels of the CUDA model runtime (src/cuda/model_ops.cu, attention_decode.cu,
// attention_prefill.cu, router.cu): embeddings, RMSNorm, per-head q/k norm + RoPE + paged-KV
// write, paged attention (decode and prefill), SwiGLU, MoE routers.
// Activations are fp32; the KV cache is fp16 or one of the quantized formats. Every launcher is
// asynchronous on `stream`, never allocates and never synchronises, so a decode step made of them
// can be captured in a CUDA graph; each returns the launch's cudaError_t. The CPU engine
// (src/runtime/cpu_engine.cpp and cpu_ops) is the reference every kernel is tested against.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/cpu/kv_codec.hpp"
#include "exl3/cuda/dtype.hpp"

namespace exl3::cuda {

// out[n, hidden] (fp32) = rows ids[0..n) of table [vocab, hidden] (f16 / bf16 / f32) * scale
// (the model's embedding scale, 1 for most; one fp32 multiply, as the CPU engine does).
cudaError_t embed_rows(const void* table, DType table_type, int64_t hidden, const int32_t* ids,
                       int64_t n, float* out, cudaStream_t stream, float scale = 1.0f);

// Per row r < rows: when `add` is non-null x[r] += add[r] first (the residual update, in place);
// then y[r] = x[src] * rsqrt(mean(x[src]^2) + eps) * w, where src = row_index ? row_index[r] : r
// (row_index gathers e.g. the last token of each sequence before the head). y may not alias x.
cudaError_t add_rms_norm(float* x, const float* add, const float* w, const int32_t* row_index,
                         int64_t rows, int64_t n, float eps, float* y, cudaStream_t stream);

// The paged KV cache of one layer as kernels see it: token `pos` of the sequence whose page
// table row is `r` lives in slot page_tables[r * max_pages + pos / page_size] * page_size +
// pos % page_size of K and V. In the native format a slot is kv_heads * head_dim halves of k / v;
// in a quantized one (exl3/cpu/kv_codec.hpp) it is kv_heads * kv_code_bytes(head_dim) bytes of
// kq / vq and kv_heads * head_dim / 32 fp16 scales of ks / vs (keys rotated in q8 / q4).
struct PagedKv {
  uint16_t* k = nullptr;  // fp16 bits (kNative)
  uint16_t* v = nullptr;
  const int32_t* page_tables = nullptr;  // [rows, max_pages]
  int32_t max_pages = 0;
  int32_t page_size = 0;
  cpu::KvFormat format = cpu::KvFormat::kNative;
  uint8_t* kq = nullptr;  // codes (quantized formats)
  uint8_t* vq = nullptr;
  uint16_t* ks = nullptr;  // fp16 scale bits (quantized formats)
  uint16_t* vs = nullptr;
};

// Per-token geometry of one forward step: token t is at position pos[t] of the sequence whose
// page-table row is seq_row[t].
struct TokenMeta {
  const int32_t* pos = nullptr;
  const int32_t* seq_row = nullptr;
};

struct AttnShape {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;     // 32, 64, 128 or 256 (attention_supports_head_dim)
  int rotary_half = 0;  // rotary_dim / 2 (<= head_dim / 2)
  // > 0: a sliding-window layer, where the token at pos attends to the last `window` positions
  // (pos - window + 1 .. pos); 0: to every earlier position.
  int window = 0;
  // gpt-oss's learned sink logits, one per query head of this launch (device fp32), or null: a
  // sink joins each softmax's max and denominator but weighs no value.
  const float* sinks = nullptr;
};

// For every token t < n: optional per-head RMSNorm of q [n, heads, hd] and k [n, kv, hd] (q_norm /
// k_norm weights [hd], null = none), NeoX RoPE on the first 2 * rotary_half channels with
// cos/sin from rope_cs [max_pos, 2, rotary_half] at pos[t], then k and v [n, kv, hd] stored in the
// cache slot of (seq_row[t], pos[t]) in the cache's format; q8 and q4 rotate q and k first
// (exl3/cpu/kv_codec.hpp). q is updated in place (fp32).
cudaError_t qk_norm_rope_store(float* q, const float* k, const float* v, const float* q_norm,
                               const float* k_norm, float eps, const float* rope_cs, TokenMeta meta,
                               int64_t n, const AttnShape& shape, const PagedKv& kv,
                               cudaStream_t stream);

// Causal attention of queries q [n, heads, hd] (after RoPE) over keys/values 0..pos[t] of their
// sequence (max(0, pos[t] - window + 1)..pos[t] with a sliding window) -> out [n, heads, hd] (fp32;
// softmax in fp32, with shape.sinks in the denominators when set).
//   decode:  the `count` tokens listed in tokens[] (what a decode step runs). Split-KV
//            ("flash-decoding"): each (token, group of query heads sharing a kv head) is cut into
//            up to attention_decode_splits() key ranges run by separate blocks, whose partial
//            softmax states the last block to finish merges (fixed order), so a batch-1 step at
//            long context still fills the GPU. Needs `workspace` of
//            attention_decode_workspace_bytes(count, ...) bytes, zeroed once when allocated (the
//            kernel leaves it zeroed); with less, or count > kAttentionSplitMaxTokens, every
//            (token, head group) runs as one block. The split count depends only on the shape
//            and the cache's keys per sequence, never on the batch, so a token's output is the
//            same bits at every batch size up to kAttentionSplitMaxTokens. The fp16 cache runs on
//            tensor cores, a block per (token, up to 16 query heads of one kv head, key range),
//            so every staged K/V row serves all the kv head's query heads, with q and the
//            softmax weights split into two fp16 halves each (src/cuda/attention_decode_mma.cu);
//            quantized caches run a CUDA-core kernel that decodes codes as it stages them
//            (src/cuda/attention_decode.cu).
//   prefill: `count` tiles of up to 32 consecutive tokens of one sequence, tile i = tokens
//            tile_first[i] .. tile_first[i] + tile_len[i] - 1 at consecutive positions; their keys
//            include any context already in the cache (chunked prefill). The fp16 cache runs on
//            tensor cores, a block per tile and group of query heads sharing a kv head, with q and
//            the softmax weights split into two fp16 halves each so the result keeps fp32-level
//            accuracy (src/cuda/attention_prefill.cu); quantized caches run a CUDA-core kernel.
constexpr int64_t kAttentionSplitMaxTokens = 64;
int attention_decode_splits(const PagedKv& kv);
size_t attention_decode_workspace_bytes(int64_t count, const AttnShape& shape, const PagedKv& kv);
cudaError_t attention_decode(const float* q, const int32_t* tokens, int64_t count, TokenMeta meta,
                             const AttnShape& shape, float scale, const PagedKv& kv,
                             void* workspace, size_t workspace_bytes, float* out,
                             cudaStream_t stream);
cudaError_t attention_prefill(const float* q, const int32_t* tile_first, const int32_t* tile_len,
                              int64_t count, TokenMeta meta, const AttnShape& shape, float scale,
                              const PagedKv& kv, float* out, cudaStream_t stream);
// Head dims the attention kernels are built for.
bool attention_supports_head_dim(int head_dim);

// g[i] = SiLU(g[i]) * u[i], i < n.
cudaError_t silu_mul(float* g, const float* u, int64_t n, cudaStream_t stream);
// g[i] = GELU_tanh(g[i]) * u[i], i < n (Gemma's GeGLU; the CPU engine's formula in fp32).
cudaError_t gelu_tanh_mul(float* g, const float* u, int64_t n, cudaStream_t stream);
// x[i] = cap * tanh(x[i] / cap), i < n (final-logit soft-capping).
cudaError_t softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// y[i] += x[i], i < n.
cudaError_t add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);

// MoE routers on router logits [m, E] (fp32) -> ids int32 [m, k] and weights fp32 [m, k], the
// same selection and weights as exl3::moe::route_softmax / route_sigmoid_grouped (ties to the
// lower id). E <= 1024, n_group <= 32, k <= 32.
struct RouterParams {
  int num_experts = 0;
  int top_k = 0;
  bool sigmoid_grouped = false;  // else softmax top-k
  bool renormalize = true;
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling_factor = 1.0f;
  const float* correction_bias = nullptr;  // [E] or null
  // [E] added to every logit before anything else (gpt-oss's router bias), or null; route_decode
  // writes its logits without it.
  const float* logit_bias = nullptr;
};
cudaError_t route_topk(const float* logits, int64_t m, const RouterParams& p, int32_t* ids,
                       float* weights, cudaStream_t stream);

// Decode routing in one launch: logits[m, E] = x[m, H] . w[E, H]^T (fp32; per token a fixed
// summation order, so a token's logits and routes do not depend on m), then route_topk's
// selection, run by the last block to finish. counter: one int32, zero before the first launch
// and left zero by every launch (the caller owns one per router, so launches of one router must
// not overlap). m <= kRouteDecodeMaxTokens, H % 4 == 0.
constexpr int64_t kRouteDecodeMaxTokens = 32;  // the MoE decode path's default reach
cudaError_t route_decode(const float* x, const float* w, int64_t m, int64_t hidden,
                         const RouterParams& p, float* logits, int32_t* counter, int32_t* ids,
                         float* weights, cudaStream_t stream);

// dst[m, n] (f16 / bf16 / f32) = src[m, n] (fp32), row strides ld_src / ld_dst (elements).
cudaError_t convert_rows(const float* src, int64_t ld_src, void* dst, DType dst_type,
                         int64_t ld_dst, int64_t m, int64_t n, cudaStream_t stream);

// y[m, n] += bias[n].
cudaError_t add_bias(float* y, const float* bias, int64_t m, int64_t n, cudaStream_t stream);

}  // namespace exl3::cuda
