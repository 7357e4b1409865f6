// CPU backend kernels (see cpu_ops.hpp).
#include "exl3/runtime/cpu_ops.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include "exl3/cpu/activation.hpp"
#include "exl3/error.hpp"
#include "exl3/trellis/hadamard.hpp"

namespace exl3::runtime::cpu_ops {

void rms_norm(const float* x, const float* w, int64_t m, int64_t n, double eps, float* y) {
  auto row = [&](int64_t r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  };
  if (m * n < (1 << 16)) {
    for (int64_t r = 0; r < m; ++r) row(r);
  } else {
    tbb::parallel_for(int64_t{0}, m, row);
  }
}

void silu_mul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = exl3::cpu::silu(g[i]) * u[i];
}

void gelu_tanh_mul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = exl3::cpu::gelu_tanh(g[i]) * u[i];
}

void clamped_swiglu_mul(float* g, const float* u, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::min(g[i], limit);
    const float y = std::clamp(u[i], -limit, limit);
    g[i] = x / (1.0f + std::exp(-alpha * x)) * (y + 1.0f);
  }
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = exl3::cpu::softcap(x[i], cap);
}

void rotate_heads(float* x, int64_t rows, int64_t hd) {
  const float scale = cpu::kv_rotation_scale(static_cast<int>(hd));
  for (int64_t r = 0; r < rows; ++r) {
    float* h = x + r * hd;
    trellis::fwht_inplace(h, static_cast<int>(hd));
    for (int64_t i = 0; i < hd; ++i) h[i] *= scale;
  }
}

void gqa_attention(const float* q, int64_t m, int64_t start, const PagedKvCache& cache, int layer,
                   PagedKvCache::SeqId seq, const GqaShape& shape, float scale, float* out) {
  const int64_t nh = shape.num_heads, nkv = shape.num_kv_heads, hd = shape.head_dim;
  const bool window = shape.q_per_kv > 0;
  if (!window && (nkv <= 0 || nh % nkv != 0))
    fail("gqa_attention: {} heads over {} kv heads", nh, nkv);
  const int64_t first_kv = window ? shape.first_q_head / shape.q_per_kv : 0;
  if (window && (nh <= 0 || (shape.first_q_head + nh - 1) / shape.q_per_kv - first_kv >= nkv)) {
    fail("gqa_attention: q heads {}..{} read kv heads beyond the {} held", shape.first_q_head,
         shape.first_q_head + nh - 1, nkv);
  }
  const auto& ls = cache.layer_shape(layer);
  if (ls.k_width != nkv * hd || ls.v_width != nkv * hd) {
    fail("gqa_attention: cache layer {} holds {}/{} floats per token, expected {}", layer,
         ls.k_width, ls.v_width, nkv * hd);
  }
  const int64_t ps = cache.page_size();
  const int64_t total = start + m;
  const int64_t pages = (total + ps - 1) / ps;
  const int64_t width = nkv * hd;
  // Base pointers of every page holding a position < total (one page-table lookup per page). A
  // quantized cache is decoded once per call into contiguous rows the pointers then walk.
  std::vector<const float*> kp(static_cast<size_t>(pages)), vp(static_cast<size_t>(pages));
  std::vector<float> kd, vd;
  if (cpu::kv_quantized(cache.format())) {
    kd.resize(static_cast<size_t>(total * width));
    vd.resize(kd.size());
    cache.load(layer, seq, 0, total, kd.data(), vd.data());
  }
  for (int64_t p = 0; p < pages; ++p) {
    const auto i = static_cast<size_t>(p);
    kp[i] = kd.empty() ? cache.key(layer, seq, p * ps) : kd.data() + p * ps * width;
    vp[i] = vd.empty() ? cache.value(layer, seq, p * ps) : vd.data() + p * ps * width;
  }
  tbb::enumerable_thread_specific<std::vector<float>> scores_tls;
  tbb::parallel_for(int64_t{0}, m * nh, [&](int64_t task) {
    const int64_t t = task / nh, h = task % nh;
    const int64_t g =
        window ? (shape.first_q_head + h) / shape.q_per_kv - first_kv : kv_head_of(h, nh, nkv);
    const int64_t n = start + t + 1;  // causal: positions 0 .. start + t
    // A sliding window keeps the last sliding_window of them (every loop below starts there).
    const int64_t first =
        shape.sliding_window > 0 ? std::max<int64_t>(0, n - shape.sliding_window) : 0;
    const float* qv = q + (t * nh + h) * hd;
    auto& s = scores_tls.local();
    s.resize(static_cast<size_t>(n));
    // A sink joins the max and the denominator but weighs no value.
    const float sink = shape.sinks != nullptr ? shape.sinks[h] : -INFINITY;
    float mx = sink;
    for (int64_t j = first; j < n; ++j) {
      const float* kv = kp[static_cast<size_t>(j / ps)] + (j % ps) * width + g * hd;
      float acc = 0.0f;
      for (int64_t d = 0; d < hd; ++d) acc += qv[d] * kv[d];
      s[static_cast<size_t>(j)] = acc * scale;
      mx = std::max(mx, s[static_cast<size_t>(j)]);
    }
    float sum = shape.sinks != nullptr ? std::exp(sink - mx) : 0.0f;
    for (int64_t j = first; j < n; ++j) {
      s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx);
      sum += s[static_cast<size_t>(j)];
    }
    const float inv = 1.0f / sum;
    float* o = out + (t * nh + h) * hd;
    std::fill_n(o, hd, 0.0f);
    for (int64_t j = first; j < n; ++j) {
      const float w = s[static_cast<size_t>(j)] * inv;
      const float* vv = vp[static_cast<size_t>(j / ps)] + (j % ps) * width + g * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] += w * vv[d];
    }
  });
}

}  // namespace exl3::runtime::cpu_ops
