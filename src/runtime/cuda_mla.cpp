// CudaBackend's multi-head latent attention (DeepSeek-V3 / Kimi-K2, and with the DSA indexer
// DeepSeek-V3.2 / GLM-5): loading a layer and running it through the kernels of
// exl3/cuda/mla.hpp. The CPU backend's mla_attention is the reference.
#include "cuda_backend.hpp"

#if defined(EXL3_HAVE_CUDA)

#include <algorithm>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/mla.hpp"
#include "exl3/error.hpp"
#include "exl3/runtime/linear.hpp"
#include "exl3/runtime/tp_linear.hpp"

namespace exl3::runtime {

using model::Act;
using model::Module;
using model::ModulePtr;

// Tokens whose absorbed queries and latent outputs the workspace holds at once; a longer step
// runs in chunks (the count is a function of the step's token count, so graphs still replay).
constexpr int64_t kMlaChunkTokens = 128;

struct CudaBackend::Mla final : Module {
  MlaAttentionSpec spec;  // this rank's heads
  cuda::MlaShape shape;
  DeviceBuffer kv_norm;
  DeviceBuffer kv_b;  // [heads * (nope + v), lora] in kv_b_type
  cuda::DType kv_b_type = cuda::DType::kF32;
  int rope = 0;
  DeviceBuffer latent;  // fp16 [pages * page_size, lora + rope]
  // A full DSA indexer (a shared one reads the selection an earlier layer left).
  bool full_indexer = false;
  cuda::DsaShape dsa;
  GpuLinear wq_b, wk, weights_proj;
  DeviceBuffer ln_w, ln_b;
  DeviceBuffer index_keys;  // fp32 [pages * page_size, index head_dim]
};

namespace {

// Tokens per chunk of a step: what the MLA and DSA workspaces are sized for.
int64_t chunk_tokens(int64_t capacity) {
  return std::min(capacity, kMlaChunkTokens);
}

// kv_b_proj as the host [out, in] matrix the kernels read: an unquantized weight in its stored
// type (16-bit stays 16-bit, so the GPU multiplies the checkpoint's exact values), anything else
// (EXL3) decoded to fp32 by the CPU engine's own linear (its product with the identity), so both
// backends use the same weights.
struct HostWeight {
  std::vector<float> f32;
  exl3::DType stored = exl3::DType::kF32;
};

std::vector<float> transpose_identity_product(int64_t in, int64_t out, auto&& forward) {
  std::vector<float> eye(static_cast<size_t>(in * in), 0.0f), y(static_cast<size_t>(in * out));
  for (int64_t i = 0; i < in; ++i) eye[static_cast<size_t>(i * in + i)] = 1.0f;
  forward(eye.data(), in, y.data());  // y = I W^T = W^T
  std::vector<float> w(y.size());
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o)
      w[static_cast<size_t>(o * in + i)] = y[static_cast<size_t>(i * out + o)];
  return w;
}

HostWeight load_kv_b(const Checkpoint& ckpt, const model::LinearSource& src, int64_t out) {
  HostWeight h;
  const int64_t in = src.in;
  if (src.slice == nullptr) {
    const std::string tensor = src.prefix + ".weight";
    if (ckpt.store().find(src.prefix + ".bias") != nullptr) {
      fail("{}: {} has a bias; MLA's kv_b_proj has none in any supported architecture",
           ckpt.path().string(), src.prefix);
    }
    if (ckpt.store().find(tensor) != nullptr) {
      const auto d = DenseMatrix::load(ckpt.store(), tensor, out, in);
      h.f32 = d.to_f32();
      h.stored = d.dtype();
      return h;
    }
    const Linear l = Linear::load(ckpt, src.prefix, in, out);
    h.f32 = transpose_identity_product(
        in, out, [&](const float* x, int64_t m, float* y) { l.forward(x, m, y); });
    return h;
  }
  if (src.out_offset != 0 || (src.out_count >= 0 && src.out_count != out)) {
    fail("{}: a kv_b_proj slice of columns {}..{} (MLA slices whole heads)", src.prefix,
         src.out_offset, src.out_offset + src.out_count);
  }
  const RankLinear r = RankLinear::slice(ckpt, *src.slice, src.rank);
  if (r.out_features() != out || r.in_features() != in) {
    fail("{}: rank {}'s kv_b_proj slice is {} -> {}, expected {} -> {}", src.prefix, src.rank,
         r.in_features(), r.out_features(), in, out);
  }
  if (const DenseMatrix* d = r.dense()) {
    h.f32 = d->to_f32();
    const TensorRef* ref = ckpt.store().find(src.slice->prefix + ".weight");
    h.stored = ref != nullptr ? ref->info->dtype : exl3::DType::kF32;
    return h;
  }
  h.f32 = transpose_identity_product(
      in, out, [&](const float* x, int64_t m, float* y) { r.forward(x, m, y); });
  return h;
}

// The matrix uploaded in its kernel type: BF16 / F16 when stored so, else F32.
DeviceBuffer upload_weight(const HostWeight& h, cuda::DType& type, const std::string& name) {
  const std::vector<uint16_t> bits = to_stored_16bit(h.f32, h.stored, type);
  return bits.empty() ? DeviceBuffer::upload(h.f32, name)
                      : DeviceBuffer(bits.data(), bits.size() * 2, name);
}

}  // namespace

ModulePtr CudaBackend::load_mla(const MlaAttentionSpec& s, int, const model::LinearSource& kv_b) {
  if (s.rope.rotary_dim != s.qk_rope_head_dim) {
    fail(
        "{}: the CUDA MLA kernels rotate all {} rope channels; this layer rotates {}; hint: "
        "--device cpu",
        s.prefix, s.qk_rope_head_dim, s.rope.rotary_dim);
  }
  auto a = std::make_unique<Mla>();
  a->spec = s;
  a->shape = {static_cast<int>(s.num_heads), static_cast<int>(s.qk_nope_head_dim),
              static_cast<int>(s.qk_rope_head_dim / 2), static_cast<int>(s.v_head_dim),
              static_cast<int>(s.kv_lora_rank)};
  if (s.qk_rope_head_dim % 2 != 0 || !cuda::mla_supports(a->shape)) {
    fail(
        "{}: {}: the CUDA MLA kernels take kv_lora_rank <= 512 (even), qk_rope_head_dim <= 128 "
        "(even), qk_nope_head_dim <= 256 (this layer: {}, {}, {}; hint: --device cpu)",
        spec_.label, s.prefix, s.kv_lora_rank, s.qk_rope_head_dim, s.qk_nope_head_dim);
  }
  a->kv_norm = DeviceBuffer::upload(
      load_vector(ckpt_.store(), s.prefix + ".kv_a_layernorm.weight", s.kv_lora_rank),
      "kv_a_layernorm");
  const HostWeight w = load_kv_b(ckpt_, kv_b, s.num_heads * (s.qk_nope_head_dim + s.v_head_dim));
  a->kv_b = upload_weight(w, a->kv_b_type, kv_b.prefix);
  weight_bytes_ += a->kv_b.bytes();
  a->rope = rope_table(s.rope);
  mla_lat_width_ = std::max(mla_lat_width_, s.num_heads * s.kv_lora_rank);
  if (s.indexer) {
    const DsaIndexerSpec& ix = *s.indexer;
    a->dsa = {static_cast<int>(ix.n_heads), static_cast<int>(ix.head_dim),
              static_cast<int>(s.qk_rope_head_dim / 2), static_cast<int>(ix.topk)};
    if (!cuda::dsa_supports(a->dsa)) {
      fail(
          "{}: {}: the CUDA DSA indexer takes index_head_dim <= 256 with the rope part inside "
          "it and index_n_heads * (index_head_dim + 1) floats within 40 KiB (this layer: {} heads "
          "of {}; hint: --device cpu)",
          spec_.label, s.prefix, ix.n_heads, ix.head_dim);
    }
    if (dsa_topk_ != 0 && dsa_topk_ != ix.topk) {
      fail("{}: {}: index_topk {} differs from an earlier layer's {}", spec_.label, s.prefix,
           ix.topk, dsa_topk_);
    }
    dsa_topk_ = ix.topk;
    a->full_indexer = !ix.shared;
    if (ix.shared && !dsa_selection_made_) {
      fail(
          "{}: {} shares the DSA selection of an earlier layer, but no layer before it has a "
          "full indexer (config.json's indexer_types)",
          spec_.label, s.prefix);
    }
    if (a->full_indexer) {
      dsa_selection_made_ = true;
      const std::string p = s.prefix + ".indexer.";
      const int64_t hidden = spec_.hidden_size;
      a->wq_b = whole_linear(p + "wq_b", s.q_lora_rank, ix.n_heads * ix.head_dim);
      a->wk = whole_linear(p + "wk", hidden, ix.head_dim);
      a->weights_proj = whole_linear(p + "weights_proj", hidden, ix.n_heads);
      for (const GpuLinear* l : {&a->wq_b, &a->wk, &a->weights_proj}) track(*l);
      a->ln_w = DeviceBuffer::upload(load_vector(ckpt_.store(), p + "k_norm.weight", ix.head_dim),
                                     "the indexer's k_norm");
      a->ln_b = DeviceBuffer::upload(load_vector(ckpt_.store(), p + "k_norm.bias", ix.head_dim),
                                     "the indexer's k_norm");
      dsa_q_width_ = std::max(dsa_q_width_, ix.n_heads * ix.head_dim);
      dsa_heads_ = std::max(dsa_heads_, ix.n_heads);
      dsa_head_dim_ = std::max(dsa_head_dim_, ix.head_dim);
    }
  }
  cache_layers_.push_back({nullptr, a.get()});
  return a;
}

KvLayerShape CudaBackend::mla_kv_shape(const Mla& a) {
  // As the CPU backend counts it: the latent and rope key, and a full indexer's key.
  const int64_t w = a.shape.latent_width() + (a.full_indexer ? a.dsa.head_dim : 0);
  return {w, 0};
}

void CudaBackend::allocate_mla(int64_t slots, int64_t max_pages, int64_t page_size) {
  const int64_t chunk = chunk_tokens(opts_.capacity);
  for (const CacheLayer& c : cache_layers_) {
    Mla* a = c.mla;
    if (a == nullptr) continue;
    const auto bytes = static_cast<size_t>(slots * a->shape.latent_width()) * 2;
    a->latent = DeviceBuffer(bytes, "the MLA latent cache");
    kv_bytes_ += bytes;
    if (a->full_indexer) {
      const auto kb = static_cast<size_t>(slots * a->dsa.head_dim) * 4;
      a->index_keys = DeviceBuffer(kb, "the DSA indexer's key cache");
      kv_bytes_ += kb;
    }
  }
  if (mla_lat_width_ == 0) return;
  const auto lat = static_cast<size_t>(chunk * mla_lat_width_) * 4;
  mla_q_lat_ = DeviceBuffer(lat, "the MLA absorbed queries");
  mla_o_lat_ = DeviceBuffer(lat, "the MLA latent outputs");
  size_t split = 0;
  for (const CacheLayer& c : cache_layers_) {
    if (c.mla != nullptr)
      split = std::max(split, cuda::mla_attend_workspace_bytes(chunk, c.mla->shape));
  }
  mla_split_ = DeviceBuffer(split, "the MLA split-KV partial states");
  if (dsa_topk_ == 0) return;
  const int64_t cap = opts_.capacity;
  dsa_q_ = DeviceBuffer(static_cast<size_t>(cap * dsa_q_width_) * 4, "the DSA indexer queries");
  dsa_w_ = DeviceBuffer(static_cast<size_t>(cap * dsa_heads_) * 4, "the DSA indexer weights");
  dsa_k_ = DeviceBuffer(static_cast<size_t>(cap * dsa_head_dim_) * 4, "the DSA indexer keys");
  dsa_scores_ =
      DeviceBuffer(static_cast<size_t>(chunk * max_pages * page_size) * 4, "the DSA scores");
  dsa_sel_ = DeviceBuffer(static_cast<size_t>(cap * dsa_topk_) * 4, "the DSA selection");
  dsa_count_ = DeviceBuffer(static_cast<size_t>(cap) * 4, "the DSA selection");
}

void CudaBackend::mla_attention(const Module& attn, Act h, Act q_resid, Act q, Act kv_a, Act out) {
  const auto scope = op_scope("attention");
  const auto& a = static_cast<const Mla&>(attn);
  const MlaAttentionSpec& s = a.spec;
  const int64_t n = q.rows;
  const cuda::TokenMeta tm{meta() + ml_.pos(), meta() + ml_.seq_row()};
  const cuda::PagedKv kv{a.latent.as<uint16_t>(), nullptr, meta() + ml_.page_tables(),
                         static_cast<int32_t>(max_pages_), static_cast<int32_t>(page_size_)};
  const float* rope = rope_cs(a.rope);
  const int64_t chunk = chunk_tokens(opts_.capacity);
  EXL3_CUDA_CHECK(cuda::mla_rope_store(q.data, kv_a.data, a.kv_norm.as<float>(),
                                       static_cast<float>(s.latent_norm_eps), rope,
                                       s.rope_interleave, tm, n, a.shape, kv, stream_),
                  "MLA RoPE and latent cache");
  const int32_t* selection = nullptr;
  if (s.indexer) {
    const int64_t stride = dsa_topk_;
    if (a.full_indexer) {
      a.wq_b.run(q_resid.data, dsa_q_.as<float>(), n, ws_.get(), ws_.bytes(), pads_, stream_);
      a.wk.run(h.data, dsa_k_.as<float>(), n, ws_.get(), ws_.bytes(), pads_, stream_);
      a.weights_proj.run(h.data, dsa_w_.as<float>(), n, ws_.get(), ws_.bytes(), pads_, stream_);
      EXL3_CUDA_CHECK(
          cuda::dsa_index_store(dsa_q_.as<float>(), dsa_k_.as<float>(), a.ln_w.as<float>(),
                                a.ln_b.as<float>(), rope, s.indexer->rope_interleave, tm, n, a.dsa,
                                a.index_keys.as<float>(), kv, stream_),
          "DSA indexer keys");
      for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        const int64_t c = std::min(chunk, n - t0);
        const cuda::TokenMeta tc{tm.pos + t0, tm.seq_row + t0};
        EXL3_CUDA_CHECK(
            cuda::dsa_index_select(dsa_q_.as<float>() + t0 * a.dsa.heads * a.dsa.head_dim,
                                   dsa_w_.as<float>() + t0 * a.dsa.heads, a.index_keys.as<float>(),
                                   tc, c, a.dsa, kv, dsa_scores_.as<float>(),
                                   dsa_sel_.as<int32_t>() + t0 * stride,
                                   dsa_count_.as<int32_t>() + t0, stream_),
            "DSA top-k selection");
      }
    }
    selection = dsa_sel_.as<int32_t>();
  }
  const int64_t qk = s.qk_head_dim();
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    const int64_t c = std::min(chunk, n - t0);
    const cuda::TokenMeta tc{tm.pos + t0, tm.seq_row + t0};
    const float* qc = q.data + t0 * s.num_heads * qk;
    EXL3_CUDA_CHECK(cuda::mla_absorb_q(qc, a.kv_b.get(), a.kv_b_type, c, a.shape,
                                       mla_q_lat_.as<float>(), stream_),
                    "MLA query absorption");
    EXL3_CUDA_CHECK(
        cuda::mla_attend(mla_q_lat_.as<float>(), qc,
                         selection != nullptr ? selection + t0 * dsa_topk_ : nullptr, dsa_topk_,
                         selection != nullptr ? dsa_count_.as<int32_t>() + t0 : nullptr, tc, c,
                         a.shape, static_cast<float>(s.scale), kv, mla_split_.get(),
                         mla_split_.bytes(), mla_o_lat_.as<float>(), stream_),
        "MLA attention");
    EXL3_CUDA_CHECK(
        cuda::mla_expand_v(mla_o_lat_.as<float>(), a.kv_b.get(), a.kv_b_type, c, a.shape,
                           out.data + t0 * s.num_heads * s.v_head_dim, stream_),
        "MLA value expansion");
  }
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
