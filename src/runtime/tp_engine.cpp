// The CPU tensor-parallel engine: the reference CpuEngine's computation cut by a TpPlan.
//
//   x = all_reduce(embedding rows this rank owns, zeros elsewhere)
//   per layer:  x += all_reduce(o_loc(attention over the local heads(q/k/v_loc(norm(x)))))
//               x += all_reduce(down_loc(SiLU(gate_loc(h)) * up_loc(h)))      (or the MoE slice)
//   logits = all_gather(lm_head_loc(norm(x)))
//
// The residual stream is replicated: after each all-reduce every rank holds the same bits, so the
// replicated parts (norms, the MoE router) agree across ranks. The ranks run on std::threads,
// not TBB tasks: they block in collectives, and a blocked TBB task could starve the others; each
// rank's kernels still use TBB inside.
#include "tp_engine.hpp"
#include "moe_routing.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <thread>

#include <tbb/parallel_for.h>

#include "exl3/error.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/moe/reference.hpp"
#include "exl3/moe/router.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/runtime/communicator.hpp"
#include "exl3/runtime/cpu_ops.hpp"
#include "exl3/runtime/rope.hpp"
#include "exl3/runtime/tp_linear.hpp"
#include "exl3/runtime/tp_plan.hpp"

namespace exl3::runtime {
namespace {

using SeqId = PagedKvCache::SeqId;

// ---- per-rank modules --------------------------------------------------------------------------

struct RankAttention {
  GqaAttentionSpec spec;
  Extent heads, kv_heads;
  int64_t kv_offset = 0;  // channels before this rank's first kv head in its k/v slice
  double eps = 0.0;
  std::optional<RopeTable> rope;
  std::optional<RankLinear> q, k, v, o;
  std::vector<float> q_norm, k_norm;

  // out[m, nkv * head_dim] = this rank's kv heads; an EXL3 k/v slice may cover whole blocks
  // around them (kv_offset floats in), from which the rank's heads are picked.
  void project_kv(const RankLinear& l, const float* x, int64_t m, float* out) const {
    const int64_t width = kv_heads.count * spec.head_dim, wide = l.out_features();
    if (wide == width) {
      l.forward(x, m, out);
      return;
    }
    std::vector<float> y(static_cast<size_t>(m * wide));
    l.forward(x, m, y.data());
    for (int64_t t = 0; t < m; ++t) std::copy_n(y.data() + t * wide + kv_offset, width, out + t * width);
  }

  KvLayerShape kv_shape() const { return {kv_heads.count * spec.head_dim, kv_heads.count * spec.head_dim}; }

  // out[m, hidden] = this rank's partial of the attention output.
  void forward(const float* x, int64_t m, int64_t start, PagedKvCache& cache, int layer, SeqId seq, float* out) const {
    const int64_t nh = heads.count, nkv = kv_heads.count, hd = spec.head_dim;
    if (nh == 0) {
      o->forward(nullptr, m, out);  // zeros, or the o_proj bias on rank 0
      return;
    }
    std::vector<float> qv(static_cast<size_t>(m * nh * hd)), kv(static_cast<size_t>(m * nkv * hd)), vv(kv.size());
    q->forward(x, m, qv.data());
    project_kv(*k, x, m, kv.data());
    project_kv(*v, x, m, vv.data());
    if (spec.qk_norm) {
      cpu_ops::rms_norm(qv.data(), q_norm.data(), m * nh, hd, eps, qv.data());
      cpu_ops::rms_norm(kv.data(), k_norm.data(), m * nkv, hd, eps, kv.data());
    }
    const int64_t half = rope->half();
    tbb::parallel_for(int64_t{0}, m, [&](int64_t t) {
      std::vector<float> cs(static_cast<size_t>(2 * half));
      rope->at(start + t, cs.data(), cs.data() + half);
      for (int64_t h = 0; h < nh; ++h) apply_rope(qv.data() + (t * nh + h) * hd, cs.data(), cs.data() + half, half);
      for (int64_t h = 0; h < nkv; ++h) apply_rope(kv.data() + (t * nkv + h) * hd, cs.data(), cs.data() + half, half);
      std::copy_n(kv.data() + t * nkv * hd, nkv * hd, cache.key(layer, seq, start + t));
      std::copy_n(vv.data() + t * nkv * hd, nkv * hd, cache.value(layer, seq, start + t));
    });
    std::vector<float> attn(qv.size());
    cpu_ops::GqaShape shape{nh, nkv, hd, spec.q_per_kv(), heads.begin};
    cpu_ops::gqa_attention(qv.data(), m, start, cache, layer, seq, shape, static_cast<float>(spec.scale), attn.data());
    o->forward(attn.data(), m, out);
  }
};

struct RankMlp {
  int64_t inter = 0;
  std::optional<RankLinear> gate, up, down;

  // out[m, hidden] (overwritten) = this rank's partial.
  void forward(const float* x, int64_t m, float* out) const {
    std::vector<float> g(static_cast<size_t>(m * inter)), u(g.size());
    gate->forward(x, m, g.data());
    up->forward(x, m, u.data());
    cpu_ops::silu_mul(g.data(), u.data(), m * inter);
    down->forward(g.data(), m, out);
  }
};

// Every rank's RankMlp for one SwiGLU plan.
std::vector<RankMlp> rank_mlps(const Checkpoint& ckpt, const TpMlpPlan& p, int64_t hidden) {
  const auto [gate, up, down] = mlp_linear_plans(ckpt, p, hidden);
  auto g = RankLinear::slice_all(ckpt, gate), u = RankLinear::slice_all(ckpt, up), d = RankLinear::slice_all(ckpt, down);
  std::vector<RankMlp> out(p.ranks.size());
  for (size_t r = 0; r < out.size(); ++r) {
    out[r].inter = p.ranks[r].count;
    out[r].gate.emplace(std::move(g[r]));
    out[r].up.emplace(std::move(u[r]));
    out[r].down.emplace(std::move(d[r]));
  }
  return out;
}

// The routed experts of one MoE layer on one rank, plus its slice of the shared experts.
struct RankMoe {
  MoeSpec spec;
  std::shared_ptr<const DenseMatrix> router;  // replicated
  std::vector<float> correction_bias;
  // Plain checkpoints: every expert's slices cut here; rank-sliced ones: the rank's own tensors.
  std::shared_ptr<const moe::MoeLayerWeights> full;  // the parent the slices view
  std::vector<Exl3Slice> owned;
  std::vector<moe::MlpView> experts;
  std::optional<moe::MoeLayerWeights> local;
  std::optional<RankMlp> shared;
  int64_t hidden = 0;

  void forward(const float* x, int64_t m, float* out) const {
    const int64_t e = spec.num_experts;
    std::vector<float> logits(static_cast<size_t>(m * e));
    router->matmul_t(x, m, logits.data());
    const moe::TopK routes = route_moe(spec, logits, m, correction_bias);
    if (local) {
      moe::moe_forward(*local, routes, x, m, out);
    } else if (!experts.empty()) {
      moe::moe_forward(experts, routes, x, m, out);
    } else {
      std::fill_n(out, m * hidden, 0.0f);  // this rank holds no intermediate channels
    }
    if (shared) {
      std::vector<float> y(static_cast<size_t>(m * hidden));
      shared->forward(x, m, y.data());
      for (size_t i = 0; i < y.size(); ++i) out[i] += y[i];
    }
  }
};

std::vector<RankMoe> rank_moes(const Checkpoint& ckpt, const MoeSpec& s, const TpMoePlan& p,
                               const moe::MoeLayout& layout, int layer, int64_t hidden) {
  const int tp = static_cast<int>(p.ranks.size());
  const int experts = static_cast<int>(s.num_experts);
  auto router = std::make_shared<const DenseMatrix>(DenseMatrix::load(ckpt.store(), s.prefix + ".gate.weight", s.num_experts, hidden));
  std::vector<float> bias;
  if (s.correction_bias) bias = load_vector(ckpt.store(), s.prefix + ".gate.e_score_correction_bias", s.num_experts);
  std::vector<RankMlp> shared;
  if (p.shared) shared = rank_mlps(ckpt, *p.shared, hidden);
  std::shared_ptr<const moe::MoeLayerWeights> full;
  if (!p.rank_sliced) {
    full = std::make_shared<const moe::MoeLayerWeights>(moe::load_moe_layer(ckpt.store(), layout, layer, 0, layout.tp, experts));
    if (full->hidden != hidden || full->intermediate != s.intermediate) {
      fail("{}: MoE layer {} experts are {} -> {}, but config.json gives hidden_size {} and moe_intermediate_size {}",
           ckpt.path().string(), layer, full->hidden, full->intermediate, hidden, s.intermediate);
    }
  }
  std::vector<RankMoe> out(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    RankMoe& rm = out[static_cast<size_t>(r)];
    rm.spec = s;
    rm.router = router;
    rm.correction_bias = bias;
    rm.hidden = hidden;
    if (!shared.empty()) rm.shared.emplace(std::move(shared[static_cast<size_t>(r)]));
    const Extent& ext = p.ranks[static_cast<size_t>(r)];
    if (p.rank_sliced) {
      // Only this rank's `.rank{r}` tensors are read.
      rm.local.emplace(moe::load_moe_layer(ckpt.store(), layout, layer, r, tp, experts));
      if (rm.local->hidden != hidden || rm.local->intermediate != ext.count) {
        fail("{}: MoE layer {} rank {} experts are {} -> {}, expected {} -> {} (moe_intermediate_size {} / TP {})",
             ckpt.path().string(), layer, r, rm.local->hidden, rm.local->intermediate, hidden, ext.count,
             s.intermediate, tp);
      }
      continue;
    }
    if (ext.empty()) continue;
    rm.full = full;
    rm.owned.reserve(full->experts.size() * 3);
    for (const auto& ew : full->experts) {
      const auto v = moe::MlpView::of(ew, full->codebook);
      rm.owned.push_back(slice_exl3(v.gate, TpSplit::kColumn, ext.begin, ext.end(), true));
      rm.owned.push_back(slice_exl3(v.up, TpSplit::kColumn, ext.begin, ext.end(), true));
      rm.owned.push_back(slice_exl3(v.down, TpSplit::kRow, ext.begin, ext.end(), r == 0));
    }
    for (size_t i = 0; i < full->experts.size(); ++i) {
      rm.experts.push_back({rm.owned[3 * i].view, rm.owned[3 * i + 1].view, rm.owned[3 * i + 2].view});
    }
  }
  return out;
}

// ---- the engine --------------------------------------------------------------------------------

class TpCpuEngine final : public Engine {
 public:
  TpCpuEngine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts)
      : ckpt_(ckpt), spec_(std::move(spec)) {
    const int tp = opts.tp;
    plan_ = plan_tensor_parallel(spec_, tp, tp_weight_info(ckpt_));
    const int64_t hidden = spec_.hidden_size;
    const auto& store = ckpt_.store();
    embed_ = std::make_shared<const DenseMatrix>(DenseMatrix::load(store, spec_.embed_tokens, 0, hidden));
    if (embed_->rows() < spec_.vocab_size) {
      fail("{}: tensor '{}' has {} rows, fewer than vocab_size {} (config.json)", ckpt_.path().string(),
           spec_.embed_tokens, embed_->rows(), spec_.vocab_size);
    }
    final_norm_ = load_vector(store, spec_.final_norm, hidden);
    auto heads = spec_.lm_head_tied ? RankLinear::slice_dense(*embed_, plan_.vocab) : RankLinear::slice_all(ckpt_, plan_.lm_head);
    std::optional<moe::MoeLayout> layout;
    if (spec_.is_moe()) {
      layout = moe::read_moe_layout(ckpt_);
      if (!layout) {
        fail("{}: config.json describes a MoE model but the checkpoint has no EXL3 experts; hint: the runtime runs "
             "quantized experts only",
             ckpt_.path().string());
      }
    }
    ranks_.resize(static_cast<size_t>(tp));
    for (int r = 0; r < tp; ++r) ranks_[static_cast<size_t>(r)].head.emplace(std::move(heads[static_cast<size_t>(r)]));
    std::vector<std::vector<KvLayerShape>> kv(static_cast<size_t>(tp));
    LoadProgressReporter progress(opts.load_progress, static_cast<int64_t>(spec_.layers.size()));
    for (size_t l = 0; l < spec_.layers.size(); ++l) {
      const LayerSpec& ls = spec_.layers[l];
      const TpLayerPlan& lp = plan_.layers[l];
      const auto& a = std::get<GqaAttentionSpec>(ls.attention);
      const auto& ap = lp.attention;
      auto q = RankLinear::slice_all(ckpt_, ap.q), k = RankLinear::slice_all(ckpt_, ap.k), v = RankLinear::slice_all(ckpt_, ap.v), o = RankLinear::slice_all(ckpt_, ap.o);
      std::vector<float> qn, kn;
      if (a.qk_norm) {
        qn = load_vector(store, a.prefix + ".q_norm.weight", a.head_dim);
        kn = load_vector(store, a.prefix + ".k_norm.weight", a.head_dim);
      }
      const auto in_norm = load_vector(store, ls.input_norm, hidden);
      const auto post_norm = load_vector(store, ls.post_attention_norm, hidden);
      std::vector<RankMlp> mlps;
      std::vector<RankMoe> moes;
      if (const auto* d = std::get_if<TpMlpPlan>(&lp.mlp)) {
        mlps = rank_mlps(ckpt_, *d, hidden);
      } else {
        if (!layout->has_layer(ls.index)) {
          fail("{}: config.json makes layer {} a MoE layer, but the checkpoint has no experts for it",
               ckpt_.path().string(), ls.index);
        }
        moes = rank_moes(ckpt_, std::get<MoeSpec>(ls.mlp), std::get<TpMoePlan>(lp.mlp), *layout, ls.index, hidden);
      }
      for (int r = 0; r < tp; ++r) {
        const auto ur = static_cast<size_t>(r);
        Layer layer;
        layer.input_norm = in_norm;
        layer.post_norm = post_norm;
        auto& at = layer.attn;
        at.spec = a;
        at.heads = ap.q_heads[ur];
        at.kv_heads = ap.kv_heads[ur];
        at.kv_offset = ap.kv_heads[ur].begin * a.head_dim - ap.k.ranks[ur].begin;
        if (ap.k.ranks[ur] != ap.v.ranks[ur]) {
          fail("{}: k_proj and v_proj are stored differently (one EXL3, one not); hint: the TP engine needs "
               "both in one form",
               a.prefix);
        }
        at.eps = spec_.rms_norm_eps;
        at.rope.emplace(a.rope);
        at.q.emplace(std::move(q[ur]));
        at.k.emplace(std::move(k[ur]));
        at.v.emplace(std::move(v[ur]));
        at.o.emplace(std::move(o[ur]));
        at.q_norm = qn;
        at.k_norm = kn;
        if (!mlps.empty()) layer.mlp.emplace(std::move(mlps[ur]));
        if (!moes.empty()) layer.moe.emplace(std::move(moes[ur]));
        kv[ur].push_back(at.kv_shape());
        ranks_[ur].layers.push_back(std::move(layer));
      }
      progress.layer_done();
    }
    if (opts.page_size <= 0) fail("engine: page size {} must be positive", opts.page_size);
    if (opts.cache_tokens <= 0) fail("engine: cache size {} tokens must be positive", opts.cache_tokens);
    const int64_t pages = (opts.cache_tokens + opts.page_size - 1) / opts.page_size;
    for (int r = 0; r < tp; ++r) {
      ranks_[static_cast<size_t>(r)].cache =
          std::make_unique<PagedKvCache>(std::move(kv[static_cast<size_t>(r)]), opts.page_size, pages);
    }
  }

  const ModelSpec& spec() const override { return spec_; }
  Device device() const override { return Device::kCpu; }

  SeqId new_sequence() override {
    const SeqId id = cache0().add_sequence();
    for (size_t r = 1; r < ranks_.size(); ++r) {
      if (ranks_[r].cache->add_sequence() != id) fail("tensor parallel: rank {} KV cache lost step with rank 0", r);
    }
    return id;
  }
  void drop_sequence(SeqId seq) override {
    for (auto& rk : ranks_) rk.cache->remove_sequence(seq);
  }
  int64_t sequence_length(SeqId seq) const override { return cache0().length(seq); }
  int64_t free_cache_tokens() const override { return cache0().free_pages() * cache0().page_size(); }
  int64_t cache_tokens_needed(SeqId seq, int64_t new_tokens) const override {
    return cache0().pages_needed(seq, new_tokens) * cache0().page_size();
  }

  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    const BatchEntry entry{seq, tokens, mode};
    validate_batch(*this, std::span<const BatchEntry>(&entry, 1));  // before any rank starts
    const auto n = static_cast<int64_t>(tokens.size());
    const int64_t start = cache0().length(seq);
    cache0().reserve(seq, n);  // throws (nothing taken) when full; the other caches are in step
    for (size_t r = 1; r < ranks_.size(); ++r) ranks_[r].cache->reserve(seq, n);

    const int tp = plan_.tp;
    const int64_t rows = mode == LogitsMode::kAll ? n : 1;
    std::vector<float> logits(static_cast<size_t>(rows * spec_.vocab_size));
    auto comms = make_in_process_group(tp);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(tp));
    std::vector<std::thread> threads;
    auto body = [&](int r) {
      try {
        run_rank(r, *comms[static_cast<size_t>(r)], seq, tokens, start, rows, logits);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        comms[static_cast<size_t>(r)]->abort();
      }
    };
    for (int r = 1; r < tp; ++r) threads.emplace_back(body, r);
    body(0);
    for (auto& t : threads) t.join();
    // The first failure is the cause; the others are aborts it triggered.
    for (const auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const Error& err) {
        if (std::string_view(err.what()).find("was aborted") == std::string_view::npos) throw;
      }
    }
    for (const auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    for (auto& rk : ranks_) rk.cache->advance(seq, n);
    return logits;
  }

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm;
    RankAttention attn;
    std::optional<RankMlp> mlp;
    std::optional<RankMoe> moe;
  };
  struct Rank {
    std::vector<Layer> layers;
    std::optional<RankLinear> head;
    std::unique_ptr<PagedKvCache> cache;
  };

  PagedKvCache& cache0() { return *ranks_.front().cache; }
  const PagedKvCache& cache0() const { return *ranks_.front().cache; }

  // One rank's whole forward pass; rank 0 writes the gathered logits.
  void run_rank(int r, Communicator& comm, SeqId seq, std::span<const int32_t> tokens, int64_t start, int64_t rows,
                std::vector<float>& logits) {
    Rank& rk = ranks_[static_cast<size_t>(r)];
    const auto n = static_cast<int64_t>(tokens.size());
    const int64_t hidden = spec_.hidden_size;
    const auto size = static_cast<size_t>(n * hidden);
    std::vector<float> x(size, 0.0f), h(size), y(size);
    const Extent vocab = plan_.vocab[static_cast<size_t>(r)];
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = tokens[static_cast<size_t>(t)];
      if (id >= vocab.begin && id < vocab.end()) embed_->row(id, x.data() + t * hidden);
    }
    comm.all_reduce_sum(x);
    const double eps = spec_.rms_norm_eps;
    for (size_t l = 0; l < rk.layers.size(); ++l) {
      const Layer& layer = rk.layers[l];
      cpu_ops::rms_norm(x.data(), layer.input_norm.data(), n, hidden, eps, h.data());
      layer.attn.forward(h.data(), n, start, *rk.cache, static_cast<int>(l), seq, y.data());
      comm.all_reduce_sum(y);
      for (size_t i = 0; i < size; ++i) x[i] += y[i];
      cpu_ops::rms_norm(x.data(), layer.post_norm.data(), n, hidden, eps, h.data());
      if (layer.mlp) {
        layer.mlp->forward(h.data(), n, y.data());
      } else {
        layer.moe->forward(h.data(), n, y.data());
      }
      comm.all_reduce_sum(y);
      for (size_t i = 0; i < size; ++i) x[i] += y[i];
    }
    cpu_ops::rms_norm(x.data() + (n - rows) * hidden, final_norm_.data(), rows, hidden, eps, h.data());
    // Vocab-parallel head: every rank's block padded to the widest so the gather is uniform.
    int64_t widest = 0;
    for (const auto& e : plan_.vocab) widest = std::max(widest, e.count);
    std::vector<float> local(static_cast<size_t>(rows * widest), 0.0f), part(static_cast<size_t>(rows * vocab.count));
    rk.head->forward(h.data(), rows, part.data());
    for (int64_t t = 0; t < rows; ++t) std::copy_n(part.data() + t * vocab.count, vocab.count, local.data() + t * widest);
    std::vector<float> all(static_cast<size_t>(plan_.tp) * local.size());
    comm.all_gather(local, all);
    if (r != 0) return;
    const int64_t v = spec_.vocab_size;
    for (int q = 0; q < plan_.tp; ++q) {
      const Extent& e = plan_.vocab[static_cast<size_t>(q)];
      const float* block = all.data() + static_cast<size_t>(q) * local.size();
      for (int64_t t = 0; t < rows; ++t) std::copy_n(block + t * widest, e.count, logits.data() + t * v + e.begin);
    }
  }

  Checkpoint ckpt_;  // keeps the mapped files alive
  ModelSpec spec_;
  TpPlan plan_;
  std::shared_ptr<const DenseMatrix> embed_;
  std::vector<float> final_norm_;
  std::vector<Rank> ranks_;
};

}  // namespace

std::unique_ptr<Engine> make_tp_cpu_engine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts) {
  return std::make_unique<TpCpuEngine>(ckpt, std::move(spec), opts);
}

}  // namespace exl3::runtime
