// DecoderLayer on the CPU (see decoder_layer.hpp): the attention and MLP modules of one layer.
// Attention kinds are modules behind CpuAttention (GQA today; an MLA module would declare its
// own KV width and read the same paged cache). MLPs are dense SwiGLU or MoE (exl3::moe routers;
// EXL3 experts through the exl3::moe reference, unquantized experts as runtime Linears; shared
// experts added). Every linear's input can be shown to a LinearObserver (calibration).
#include "exl3/runtime/decoder_layer.hpp"

#include <algorithm>
#include <optional>
#include <variant>

#include <fmt/format.h>

#include <tbb/parallel_for.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/moe/reference.hpp"
#include "exl3/moe/router.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/runtime/cpu_ops.hpp"
#include "exl3/runtime/linear.hpp"
#include "exl3/runtime/rope.hpp"
#include "moe_routing.hpp"

namespace exl3::runtime {
namespace {

using SeqId = PagedKvCache::SeqId;

// ---- attention modules -----------------------------------------------------------------------

class CpuAttention {
 public:
  virtual ~CpuAttention() = default;
  // Floats per token this layer keeps in the KV cache.
  virtual KvLayerShape kv_shape() const = 0;
  // out[m, hidden] for x[m, hidden] at positions start .. start + m - 1 of `seq`; writes the new
  // tokens' cache entries of `layer` (reserved by the caller) and attends causally.
  virtual void forward(const float* x, int64_t m, int64_t start, PagedKvCache& cache, int layer,
                       SeqId seq, float* out, LinearObserver* obs) const = 0;
};

class CpuGqaAttention final : public CpuAttention {
 public:
  CpuGqaAttention(const Checkpoint& ckpt, const GqaAttentionSpec& s, int64_t hidden, double eps)
      : s_(s),
        eps_(eps),
        rope_(s.rope),
        q_(Linear::load(ckpt, s.prefix + ".q_proj", hidden, s.num_heads * s.head_dim)),
        k_(Linear::load(ckpt, s.prefix + ".k_proj", hidden, s.num_kv_heads * s.head_dim)),
        v_(Linear::load(ckpt, s.prefix + ".v_proj", hidden, s.num_kv_heads * s.head_dim)),
        o_(Linear::load(ckpt, s.prefix + ".o_proj", s.num_heads * s.head_dim, hidden)),
        qkv_names_{q_.name(), k_.name(), v_.name()},
        o_names_{o_.name()} {
    if (s.qk_norm) {
      q_norm_ = load_vector(ckpt.store(), s.prefix + ".q_norm.weight", s.head_dim);
      k_norm_ = load_vector(ckpt.store(), s.prefix + ".k_norm.weight", s.head_dim);
    }
  }

  KvLayerShape kv_shape() const override {
    return {s_.num_kv_heads * s_.head_dim, s_.num_kv_heads * s_.head_dim};
  }

  void forward(const float* x, int64_t m, int64_t start, PagedKvCache& cache, int layer, SeqId seq,
               float* out, LinearObserver* obs) const override {
    const int64_t nh = s_.num_heads, nkv = s_.num_kv_heads, hd = s_.head_dim;
    if (obs != nullptr) obs->observe(qkv_names_, x, m, q_.in_features());
    std::vector<float> q(static_cast<size_t>(m * nh * hd)), k(static_cast<size_t>(m * nkv * hd)),
        v(k.size());
    q_.forward(x, m, q.data());
    k_.forward(x, m, k.data());
    v_.forward(x, m, v.data());
    if (s_.qk_norm) {
      cpu_ops::rms_norm(q.data(), q_norm_.data(), m * nh, hd, eps_, q.data());
      cpu_ops::rms_norm(k.data(), k_norm_.data(), m * nkv, hd, eps_, k.data());
    }
    const int64_t half = rope_.half();
    tbb::parallel_for(int64_t{0}, m, [&](int64_t t) {
      std::vector<float> cs(static_cast<size_t>(2 * half));
      rope_.at(start + t, cs.data(), cs.data() + half);
      for (int64_t h = 0; h < nh; ++h)
        apply_rope(q.data() + (t * nh + h) * hd, cs.data(), cs.data() + half, half);
      for (int64_t h = 0; h < nkv; ++h)
        apply_rope(k.data() + (t * nkv + h) * hd, cs.data(), cs.data() + half, half);
      std::copy_n(k.data() + t * nkv * hd, nkv * hd, cache.key(layer, seq, start + t));
      std::copy_n(v.data() + t * nkv * hd, nkv * hd, cache.value(layer, seq, start + t));
    });
    std::vector<float> attn(q.size());
    cpu_ops::gqa_attention(q.data(), m, start, cache, layer, seq, {nh, nkv, hd},
                           static_cast<float>(s_.scale), attn.data());
    if (obs != nullptr) obs->observe(o_names_, attn.data(), m, o_.in_features());
    o_.forward(attn.data(), m, out);
  }

 private:
  GqaAttentionSpec s_;
  double eps_;
  RopeTable rope_;
  Linear q_, k_, v_, o_;
  std::string qkv_names_[3], o_names_[1];
  std::vector<float> q_norm_, k_norm_;
};

std::unique_ptr<CpuAttention> make_attention(const Checkpoint& ckpt, const GqaAttentionSpec& s,
                                             int64_t hidden, double eps) {
  return std::make_unique<CpuGqaAttention>(ckpt, s, hidden, eps);
}

// ---- MLP modules -----------------------------------------------------------------------------

class CpuMlp {
 public:
  virtual ~CpuMlp() = default;
  // out[m, hidden] (overwritten).
  virtual void forward(const float* x, int64_t m, float* out, LinearObserver* obs) const = 0;
};

class CpuDenseMlp final : public CpuMlp {
 public:
  CpuDenseMlp(const Checkpoint& ckpt, const std::string& prefix, int64_t hidden, int64_t inter)
      : inter_(inter),
        gate_(Linear::load(ckpt, prefix + ".gate_proj", hidden, inter)),
        up_(Linear::load(ckpt, prefix + ".up_proj", hidden, inter)),
        down_(Linear::load(ckpt, prefix + ".down_proj", inter, hidden)),
        gate_up_names_{gate_.name(), up_.name()},
        down_names_{down_.name()} {}

  void forward(const float* x, int64_t m, float* out, LinearObserver* obs) const override {
    std::vector<float> g(static_cast<size_t>(m * inter_)), u(g.size());
    if (obs != nullptr) obs->observe(gate_up_names_, x, m, gate_.in_features());
    gate_.forward(x, m, g.data());
    up_.forward(x, m, u.data());
    cpu_ops::silu_mul(g.data(), u.data(), m * inter_);
    if (obs != nullptr) obs->observe(down_names_, g.data(), m, inter_);
    down_.forward(g.data(), m, out);
  }

  // The exl3::moe view when all three projections are unpadded EXL3 linears.
  std::optional<moe::MlpView> view() const {
    auto g = gate_.exl3_view(), u = up_.exl3_view(), d = down_.exl3_view();
    if (!g || !u || !d) return std::nullopt;
    return moe::MlpView{*g, *u, *d};
  }

 private:
  int64_t inter_;
  Linear gate_, up_, down_;
  std::string gate_up_names_[2], down_names_[1];
};

// Routed experts come in two storages: the exl3::moe layout (EXL3 experts found by
// read_moe_layout, plain or rank-sliced; run through moe_forward with their views) or, when the
// layout has no experts for this layer, one runtime Linear per projection (HF BF16/FP16/F32
// weights, e.g. an unquantized source model), routed through moe::routed_forward with the same
// router and FP32 top-k sum.
class CpuMoe final : public CpuMlp {
 public:
  CpuMoe(const Checkpoint& ckpt, const MoeSpec& s, const moe::MoeLayout* layout, int layer,
         int64_t hidden)
      : s_(s), hidden_(hidden) {
    const auto& store = ckpt.store();
    router_ = std::make_unique<DenseMatrix>(
        DenseMatrix::load(store, s.prefix + ".gate.weight", s.num_experts, hidden));
    if (s.correction_bias) {
      bias_ = load_vector(store, s.prefix + ".gate.e_score_correction_bias", s.num_experts);
    }
    const int experts = static_cast<int>(s.num_experts);
    if (layout != nullptr) {
      load_layout_experts(ckpt, *layout, layer, experts);
    } else {
      for (int e = 0; e < experts; ++e) {
        dense_experts_.push_back(std::make_unique<CpuDenseMlp>(
            ckpt, fmt::format("{}.experts.{}", s.prefix, e), hidden, s.intermediate));
      }
    }
    if (s.shared) {
      shared_ = std::make_unique<CpuDenseMlp>(ckpt, s.shared->prefix, hidden, s.shared->intermediate);
      if (auto v = shared_->view(); v && !ranks_.empty()) shared_views_.push_back(*v);
    }
  }

  void forward(const float* x, int64_t m, float* out, LinearObserver* obs) const override {
    const int64_t e = s_.num_experts;
    if (obs != nullptr && dense_experts_.empty()) {
      fail("{}: observing expert inputs needs the experts loaded as Linears (no MoE layout); "
           "hint: this is a calibration forward over an EXL3 layout",
           s_.prefix);
    }
    std::vector<float> logits(static_cast<size_t>(m * e));
    router_->matmul_t(x, m, logits.data());
    const moe::TopK routes = route_moe(s_, logits, m, bias_);
    if (!dense_experts_.empty()) {
      moe::routed_forward(static_cast<int>(e), hidden_, routes, x, m, out,
                          [&](int id, const float* xs, int64_t rows, float* ys) {
                            dense_experts_[static_cast<size_t>(id)]->forward(xs, rows, ys, obs);
                          });
    } else if (ranks_.size() == 1) {
      moe::moe_forward(views_, routes, x, m, out, shared_views_);
    } else {
      moe::moe_forward_ranks(ranks_, routes, x, m, out, shared_views_);
    }
    if (shared_ && shared_views_.empty()) {  // shared experts outside exl3::moe
      std::vector<float> y(static_cast<size_t>(m * hidden_));
      shared_->forward(x, m, y.data(), obs);
      for (size_t i = 0; i < y.size(); ++i) out[i] += y[i];
    }
  }

 private:
  void load_layout_experts(const Checkpoint& ckpt, const moe::MoeLayout& layout, int layer,
                           int experts) {
    for (int e = 0; e < experts; ++e) {
      for (const auto p : moe::kProjs) {
        const std::string w = fmt::format("{}.experts.{}.{}.weight", s_.prefix, e, moe::proj_name(p));
        if (ckpt.store().contains(w)) {
          fail("{}: MoE layer {} mixes EXL3 experts with unquantized ones (e.g. '{}'); hint: "
               "quantize all routed experts of a layer, or none",
               ckpt.path().string(), layer, w);
        }
      }
    }
    for (int r = 0; r < layout.tp; ++r) {
      ranks_.push_back(moe::load_moe_layer(ckpt.store(), layout, layer, r, layout.tp, experts));
    }
    const auto& w0 = ranks_.front();
    if (w0.hidden != hidden_ || w0.intermediate * layout.tp != s_.intermediate) {
      fail("{}: MoE layer {} experts are {} -> {} (x TP {}), but config.json gives hidden_size {} "
           "and moe_intermediate_size {}",
           ckpt.path().string(), layer, w0.hidden, w0.intermediate, layout.tp, hidden_,
           s_.intermediate);
    }
    if (layout.tp == 1) {
      for (const auto& e : w0.experts) views_.push_back(moe::MlpView::of(e, w0.codebook));
    }
  }

  MoeSpec s_;
  int64_t hidden_ = 0;
  std::unique_ptr<DenseMatrix> router_;
  std::vector<float> bias_;
  std::vector<moe::MoeLayerWeights> ranks_;  // layout experts
  std::vector<moe::MlpView> views_;
  std::vector<std::unique_ptr<CpuDenseMlp>> dense_experts_;  // per-projection Linears
  std::unique_ptr<CpuDenseMlp> shared_;
  std::vector<moe::MlpView> shared_views_;
};

}  // namespace

struct DecoderLayer::Impl {
  LayerSpec spec;
  int64_t hidden = 0;
  double eps = 0.0;
  std::vector<float> input_norm, post_norm;
  std::unique_ptr<CpuAttention> attn;
  std::unique_ptr<CpuMlp> mlp;
};

DecoderLayer::DecoderLayer(const Checkpoint& ckpt, const ModelSpec& model, const LayerSpec& ls,
                           const moe::MoeLayout* moe_layout)
    : impl_(std::make_unique<Impl>()) {
  auto& l = *impl_;
  const int64_t hidden = model.hidden_size;
  const auto& store = ckpt.store();
  l.spec = ls;
  l.hidden = hidden;
  l.eps = model.rms_norm_eps;
  l.input_norm = load_vector(store, ls.input_norm, hidden);
  l.post_norm = load_vector(store, ls.post_attention_norm, hidden);
  l.attn = std::visit(
      [&](const auto& a) { return make_attention(ckpt, a, hidden, model.rms_norm_eps); },
      ls.attention);
  if (const auto* d = std::get_if<DenseMlpSpec>(&ls.mlp)) {
    l.mlp = std::make_unique<CpuDenseMlp>(ckpt, d->prefix, hidden, d->intermediate);
  } else {
    l.mlp = std::make_unique<CpuMoe>(ckpt, std::get<MoeSpec>(ls.mlp), moe_layout, ls.index, hidden);
  }
}

DecoderLayer::~DecoderLayer() = default;
DecoderLayer::DecoderLayer(DecoderLayer&&) noexcept = default;
DecoderLayer& DecoderLayer::operator=(DecoderLayer&&) noexcept = default;

const LayerSpec& DecoderLayer::spec() const { return impl_->spec; }
KvLayerShape DecoderLayer::kv_shape() const { return impl_->attn->kv_shape(); }

void DecoderLayer::forward(float* x, int64_t m, int64_t start, PagedKvCache& cache, int cache_layer,
                           PagedKvCache::SeqId seq, LinearObserver* observer) const {
  const auto& l = *impl_;
  const auto size = static_cast<size_t>(m * l.hidden);
  std::vector<float> h(size), y(size);
  cpu_ops::rms_norm(x, l.input_norm.data(), m, l.hidden, l.eps, h.data());
  l.attn->forward(h.data(), m, start, cache, cache_layer, seq, y.data(), observer);
  for (size_t i = 0; i < size; ++i) x[i] += y[i];
  cpu_ops::rms_norm(x, l.post_norm.data(), m, l.hidden, l.eps, h.data());
  l.mlp->forward(h.data(), m, y.data(), observer);
  for (size_t i = 0; i < size; ++i) x[i] += y[i];
}

void DecoderLayer::forward_sequence(float* x, int64_t n, LinearObserver* observer) const {
  if (n <= 0) fail("{}: forward over {} tokens", impl_->spec.prefix, n);
  constexpr int64_t kPage = 64;
  PagedKvCache cache({kv_shape()}, kPage, (n + kPage - 1) / kPage);
  const auto seq = cache.add_sequence();
  cache.reserve(seq, n);
  forward(x, n, 0, cache, 0, seq, observer);
}

}  // namespace exl3::runtime
