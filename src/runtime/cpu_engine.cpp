// The CPU reference engine: every module of a ModelSpec on the host, fp32 activations.
//
//   x = embed(tokens)
//   per layer:  x += attention(rms_norm(x)),  x += mlp(rms_norm(x))
//   logits = lm_head(rms_norm(x))
//
// Attention kinds are modules behind CpuAttention (GQA today; an MLA module would declare its
// own KV width and read the same paged cache). MLPs are dense SwiGLU or MoE (exl3::moe routers
// and reference experts, shared experts added).
#include <algorithm>
#include <optional>
#include <variant>

#include <tbb/parallel_for.h>

#include "cpu_engine.hpp"
#include "exl3/error.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/moe/reference.hpp"
#include "exl3/moe/router.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/runtime/cpu_ops.hpp"
#include "exl3/runtime/linear.hpp"
#include "exl3/runtime/rope.hpp"

namespace exl3::runtime {
namespace {

using SeqId = PagedKvCache::SeqId;

// Loads every linear of the model through Linear::load with its overlay decision, collecting
// the overlay report.
struct LinearLoader {
  const Checkpoint& ckpt;
  const OverlayPlan& plan;
  OverlayReport& report;
  bool overlay = false;  // a policy is active (only then are kept layers reported)

  Linear operator()(const std::string& prefix, int64_t in, int64_t out) const {
    OverlayDecision d = plan.decision(prefix);
    if (!overlay) d.reason.clear();  // nothing to report as "kept" without a policy
    return Linear::load(ckpt, prefix, in, out, d, &report);
  }
  const TensorStore& store() const { return ckpt.store(); }
};

// ---- attention modules -----------------------------------------------------------------------

class CpuAttention {
 public:
  virtual ~CpuAttention() = default;
  // Floats per token this layer keeps in the KV cache.
  virtual KvLayerShape kv_shape() const = 0;
  // out[m, hidden] for x[m, hidden] at positions start .. start + m - 1 of `seq`; writes the new
  // tokens' cache entries of `layer` (reserved by the caller) and attends causally.
  virtual void forward(const float* x, int64_t m, int64_t start, PagedKvCache& cache, int layer,
                       SeqId seq, float* out) const = 0;
};

class CpuGqaAttention final : public CpuAttention {
 public:
  CpuGqaAttention(const LinearLoader& load, const GqaAttentionSpec& s, int64_t hidden, double eps)
      : s_(s),
        eps_(eps),
        rope_(s.rope),
        q_(load(s.prefix + ".q_proj", hidden, s.num_heads * s.head_dim)),
        k_(load(s.prefix + ".k_proj", hidden, s.num_kv_heads * s.head_dim)),
        v_(load(s.prefix + ".v_proj", hidden, s.num_kv_heads * s.head_dim)),
        o_(load(s.prefix + ".o_proj", s.num_heads * s.head_dim, hidden)) {
    if (s.qk_norm) {
      q_norm_ = load_vector(load.store(), s.prefix + ".q_norm.weight", s.head_dim);
      k_norm_ = load_vector(load.store(), s.prefix + ".k_norm.weight", s.head_dim);
    }
  }

  KvLayerShape kv_shape() const override {
    return {s_.num_kv_heads * s_.head_dim, s_.num_kv_heads * s_.head_dim};
  }

  void forward(const float* x, int64_t m, int64_t start, PagedKvCache& cache, int layer, SeqId seq,
               float* out) const override {
    const int64_t nh = s_.num_heads, nkv = s_.num_kv_heads, hd = s_.head_dim;
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
    o_.forward(attn.data(), m, out);
  }

 private:
  GqaAttentionSpec s_;
  double eps_;
  RopeTable rope_;
  Linear q_, k_, v_, o_;
  std::vector<float> q_norm_, k_norm_;
};

std::unique_ptr<CpuAttention> make_attention(const LinearLoader& load, const GqaAttentionSpec& s,
                                             int64_t hidden, double eps) {
  return std::make_unique<CpuGqaAttention>(load, s, hidden, eps);
}

// ---- MLP modules -----------------------------------------------------------------------------

class CpuMlp {
 public:
  virtual ~CpuMlp() = default;
  // out[m, hidden] (overwritten).
  virtual void forward(const float* x, int64_t m, float* out) const = 0;
};

class CpuDenseMlp final : public CpuMlp {
 public:
  CpuDenseMlp(const LinearLoader& load, const std::string& prefix, int64_t hidden, int64_t inter)
      : inter_(inter),
        gate_(load(prefix + ".gate_proj", hidden, inter)),
        up_(load(prefix + ".up_proj", hidden, inter)),
        down_(load(prefix + ".down_proj", inter, hidden)) {}

  void forward(const float* x, int64_t m, float* out) const override {
    std::vector<float> g(static_cast<size_t>(m * inter_)), u(g.size());
    gate_.forward(x, m, g.data());
    up_.forward(x, m, u.data());
    cpu_ops::silu_mul(g.data(), u.data(), m * inter_);
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
};

class CpuMoe final : public CpuMlp {
 public:
  CpuMoe(const LinearLoader& loader, const MoeSpec& s, const moe::MoeLayout& layout, int layer,
         int64_t hidden)
      : s_(s) {
    const Checkpoint& ckpt = loader.ckpt;
    const auto& store = ckpt.store();
    router_ = std::make_unique<DenseMatrix>(
        DenseMatrix::load(store, s.prefix + ".gate.weight", s.num_experts, hidden));
    if (s.correction_bias) {
      bias_ = load_vector(store, s.prefix + ".gate.e_score_correction_bias", s.num_experts);
    }
    const int experts = static_cast<int>(s.num_experts);
    for (int r = 0; r < layout.tp; ++r) {
      ranks_.push_back(moe::load_moe_layer(store, layout, layer, r, layout.tp, experts));
    }
    const auto& w0 = ranks_.front();
    if (w0.hidden != hidden || w0.intermediate * layout.tp != s.intermediate) {
      fail("{}: MoE layer {} experts are {} -> {} (x TP {}), but config.json gives hidden_size {} "
           "and moe_intermediate_size {}",
           ckpt.path().string(), layer, w0.hidden, w0.intermediate, layout.tp, hidden,
           s.intermediate);
    }
    if (layout.tp == 1) {
      for (const auto& e : w0.experts) views_.push_back(moe::MlpView::of(e, w0.codebook));
    }
    if (s.shared) {
      shared_ = std::make_unique<CpuDenseMlp>(loader, s.shared->prefix, hidden, s.shared->intermediate);
      if (auto v = shared_->view()) shared_views_.push_back(*v);
    }
    hidden_ = hidden;
  }

  void forward(const float* x, int64_t m, float* out) const override {
    const int64_t e = s_.num_experts;
    std::vector<float> logits(static_cast<size_t>(m * e));
    router_->matmul_t(x, m, logits.data());
    moe::TopK routes;
    if (s_.router == RouterKind::kSoftmax) {
      routes = moe::route_softmax(logits, m, e, {s_.top_k, s_.renormalize});
    } else {
      moe::SigmoidGroupedRouting r;
      r.top_k = s_.top_k;
      r.n_group = s_.n_group;
      r.topk_group = s_.topk_group;
      r.renormalize = s_.renormalize;
      r.routed_scaling_factor = static_cast<float>(s_.routed_scaling_factor);
      r.correction_bias = bias_;
      routes = moe::route_sigmoid_grouped(logits, m, e, r);
    }
    if (ranks_.size() == 1) {
      moe::moe_forward(views_, routes, x, m, out, shared_views_);
    } else {
      moe::moe_forward_ranks(ranks_, routes, x, m, out, shared_views_);
    }
    if (shared_ && shared_views_.empty()) {  // unquantized shared experts
      std::vector<float> y(static_cast<size_t>(m * hidden_));
      shared_->forward(x, m, y.data());
      for (size_t i = 0; i < y.size(); ++i) out[i] += y[i];
    }
  }

 private:
  MoeSpec s_;
  int64_t hidden_ = 0;
  std::unique_ptr<DenseMatrix> router_;
  std::vector<float> bias_;
  std::vector<moe::MoeLayerWeights> ranks_;
  std::vector<moe::MlpView> views_;
  std::unique_ptr<CpuDenseMlp> shared_;
  std::vector<moe::MlpView> shared_views_;
};

// ---- the engine ------------------------------------------------------------------------------

class CpuEngine final : public Engine {
 public:
  CpuEngine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts)
      : ckpt_(ckpt),
        spec_(std::move(spec)),
        embed_(DenseMatrix::load(ckpt_.store(), spec_.embed_tokens, 0, spec_.hidden_size)) {
    const OverlayPlan plan = OverlayPlan::build(opts.overlay, ckpt_, spec_);
    const LinearLoader loader{ckpt_, plan, overlay_report_, opts.overlay.any()};
    const int64_t hidden = spec_.hidden_size;
    const auto& store = ckpt_.store();
    if (embed_.rows() < spec_.vocab_size) {
      fail("{}: tensor '{}' has {} rows, fewer than vocab_size {} (config.json)",
           ckpt_.path().string(), spec_.embed_tokens, embed_.rows(), spec_.vocab_size);
    }
    final_norm_ = load_vector(store, spec_.final_norm, hidden);
    head_ = spec_.lm_head_tied
                ? Linear::dense(DenseMatrix::load(store, spec_.embed_tokens, 0, hidden))
                : loader(spec_.lm_head, hidden, spec_.vocab_size);

    std::optional<moe::MoeLayout> layout;
    if (spec_.is_moe()) {
      layout = moe::read_moe_layout(ckpt_);
      if (!layout) {
        fail("{}: config.json describes a MoE model but the checkpoint has no EXL3 experts "
             "('model.layers.{{L}}.mlp.experts.{{E}}.{{gate,up,down}}_proj'); hint: the runtime "
             "runs quantized experts only",
             ckpt_.path().string());
      }
    }
    std::vector<KvLayerShape> kv;
    for (const auto& ls : spec_.layers) {
      Layer layer;
      layer.input_norm = load_vector(store, ls.input_norm, hidden);
      layer.post_norm = load_vector(store, ls.post_attention_norm, hidden);
      layer.attn = std::visit(
          [&](const auto& a) { return make_attention(loader, a, hidden, spec_.rms_norm_eps); },
          ls.attention);
      if (const auto* d = std::get_if<DenseMlpSpec>(&ls.mlp)) {
        layer.mlp = std::make_unique<CpuDenseMlp>(loader, d->prefix, hidden, d->intermediate);
      } else {
        const auto& m = std::get<MoeSpec>(ls.mlp);
        if (!layout->has_layer(ls.index)) {
          fail("{}: config.json makes layer {} a MoE layer, but the checkpoint has no experts for it",
               ckpt_.path().string(), ls.index);
        }
        layer.mlp = std::make_unique<CpuMoe>(loader, m, *layout, ls.index, hidden);
      }
      kv.push_back(layer.attn->kv_shape());
      layers_.push_back(std::move(layer));
    }
    if (opts.page_size <= 0) fail("engine: page size {} must be positive", opts.page_size);
    if (opts.cache_tokens <= 0) fail("engine: cache size {} tokens must be positive", opts.cache_tokens);
    const int64_t pages = (opts.cache_tokens + opts.page_size - 1) / opts.page_size;
    cache_ = std::make_unique<PagedKvCache>(std::move(kv), opts.page_size, pages);
  }

  const ModelSpec& spec() const override { return spec_; }
  OverlayReport overlay_report() const override { return overlay_report_; }
  Device device() const override { return Device::kCpu; }
  SeqId new_sequence() override { return cache_->add_sequence(); }
  void drop_sequence(SeqId seq) override { cache_->remove_sequence(seq); }
  int64_t sequence_length(SeqId seq) const override { return cache_->length(seq); }
  int64_t free_cache_tokens() const override { return cache_->free_pages() * cache_->page_size(); }
  int64_t cache_tokens_needed(SeqId seq, int64_t new_tokens) const override {
    return cache_->pages_needed(seq, new_tokens) * cache_->page_size();
  }

  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    const auto n = static_cast<int64_t>(tokens.size());
    if (n == 0) fail("forward: no tokens");
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= spec_.vocab_size) {
        fail("forward: token id {} at index {} is outside the vocabulary 0..{}", tokens[i], i,
             spec_.vocab_size - 1);
      }
    }
    const int64_t start = cache_->length(seq);
    cache_->reserve(seq, n);
    const int64_t hidden = spec_.hidden_size;
    const auto size = static_cast<size_t>(n * hidden);
    std::vector<float> x(size), h(size), y(size);
    for (int64_t t = 0; t < n; ++t) embed_.row(tokens[static_cast<size_t>(t)], x.data() + t * hidden);
    const double eps = spec_.rms_norm_eps;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      cpu_ops::rms_norm(x.data(), layer.input_norm.data(), n, hidden, eps, h.data());
      layer.attn->forward(h.data(), n, start, *cache_, static_cast<int>(l), seq, y.data());
      for (size_t i = 0; i < size; ++i) x[i] += y[i];
      cpu_ops::rms_norm(x.data(), layer.post_norm.data(), n, hidden, eps, h.data());
      layer.mlp->forward(h.data(), n, y.data());
      for (size_t i = 0; i < size; ++i) x[i] += y[i];
    }
    const int64_t rows = mode == LogitsMode::kAll ? n : 1;
    cpu_ops::rms_norm(x.data() + (n - rows) * hidden, final_norm_.data(), rows, hidden, eps, h.data());
    const int64_t out = head_.out_features(), vocab = spec_.vocab_size;
    std::vector<float> logits(static_cast<size_t>(rows * out));
    head_.forward(h.data(), rows, logits.data());
    if (out != vocab) {  // a tied head over a padded embedding
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(logits.data() + r * out, vocab, logits.data() + r * vocab);
      logits.resize(static_cast<size_t>(rows * vocab));
    }
    cache_->advance(seq, n);
    return logits;
  }

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm;
    std::unique_ptr<CpuAttention> attn;
    std::unique_ptr<CpuMlp> mlp;
  };

  Checkpoint ckpt_;  // keeps the mapped files alive
  ModelSpec spec_;
  DenseMatrix embed_;
  std::vector<float> final_norm_;
  Linear head_;
  std::vector<Layer> layers_;
  std::unique_ptr<PagedKvCache> cache_;
  OverlayReport overlay_report_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const Checkpoint& ckpt, ModelSpec spec,
                                        const EngineOptions& opts) {
  return std::make_unique<CpuEngine>(ckpt, std::move(spec), opts);
}

}  // namespace exl3::runtime
