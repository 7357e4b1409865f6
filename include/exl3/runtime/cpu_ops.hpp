// The CPU backend's elementwise and attention kernels (fp32 activations). Written for clarity
// first; loops that matter run on TBB.
#pragma once

#include <cstdint>

#include "exl3/runtime/kv_cache.hpp"

namespace exl3::runtime::cpu_ops {

// y[m, n] = x * rsqrt(mean(x^2) + eps) * w, per row (the sum of squares in fp64). y may be x.
void rms_norm(const float* x, const float* w, int64_t m, int64_t n, double eps, float* y);

// g[i] = SiLU(g[i]) * u[i].
void silu_mul(float* g, const float* u, int64_t n);
// g[i] = GELU(g[i]) * u[i], GELU's tanh approximation (transformers' gelu_pytorch_tanh):
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
void gelu_tanh_mul(float* g, const float* u, int64_t n);
// gpt-oss's clamped SwiGLU: with x = min(g[i], limit) and y = clamp(u[i], -limit, limit),
// g[i] = x * sigmoid(alpha * x) * (y + 1).
void clamped_swiglu_mul(float* g, const float* u, int64_t n, float alpha, float limit);
// x[i] = cap * tanh(x[i] / cap) (Gemma's logit soft-capping).
void softcap(float* x, int64_t n, float cap);
// Each of the `rows` heads x[r, 0..hd) goes through the normalised Hadamard transform of size hd
// (a power of two): what a quantized KV cache applies to keys and queries (exl3/cpu/kv_codec.hpp).
void rotate_heads(float* x, int64_t rows, int64_t hd);

// The kv head a query head reads under grouped-query attention (transformers' repeat_kv):
// q heads [j * q_per_kv, (j + 1) * q_per_kv) share kv head j.
inline int64_t kv_head_of(int64_t q_head, int64_t num_heads, int64_t num_kv_heads) {
  return q_head / (num_heads / num_kv_heads);
}

struct GqaShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  // A tensor-parallel rank's window of a larger GQA layer (0 = the whole layer): local q head h
  // is global head first_q_head + h and reads global kv head (first_q_head + h) / q_per_kv; the
  // cache holds the kv heads from first_q_head / q_per_kv on.
  int64_t q_per_kv = 0;
  int64_t first_q_head = 0;
  // > 0: a query at position p attends to p - sliding_window + 1 .. p only (Mistral).
  int64_t sliding_window = 0;
  // gpt-oss: each (local) head's sink logit, one more term of its softmax's denominator that
  // weighs no value; null without.
  const float* sinks = nullptr;
};

// Causal attention of m queries q[m, num_heads, head_dim] at positions start .. start + m - 1
// over the keys/values 0 .. start + m - 1 of `seq` in `layer` of the cache (the new tokens'
// entries already written; K and V slots are [num_kv_heads, head_dim]). Softmax in fp32 with
// the max subtracted. out[m, num_heads, head_dim]. Parallel over (token, head).
void gqa_attention(const float* q, int64_t m, int64_t start, const PagedKvCache& cache, int layer,
                   PagedKvCache::SeqId seq, const GqaShape& shape, float scale, float* out);

}  // namespace exl3::runtime::cpu_ops
