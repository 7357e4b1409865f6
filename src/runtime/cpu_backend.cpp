// CpuBackend (see cpu_backend.hpp): the op layer's fp32 reference on the host.
#include "cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include <tbb/parallel_for.h>

#include "exl3/error.hpp"
#include "exl3/format/fused_experts.hpp"
#include "exl3/model/rope.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/moe/reference.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/runtime/cpu_ops.hpp"
#include "exl3/runtime/delta_net.hpp"
#include "exl3/runtime/tp_linear.hpp"
#include "moe_routing.hpp"

namespace exl3::runtime {
namespace {

using model::Act;
using model::Extent;
using model::Module;
using model::ModulePtr;

struct CpuEmbedding final : Module {
  std::shared_ptr<const DenseMatrix> table;
  float scale = 1.0f;  // model::embedding_scale
};

struct CpuNorm final : Module {
  std::vector<float> weight;
  double eps = 0.0;
};

// A whole Linear, or one rank's slice of it (outputs cut to a window when the slice is wider
// than the rank's share: EXL3 k/v blocks around its kv heads).
struct CpuLinear final : Module {
  std::optional<Linear> whole;
  std::optional<RankLinear> slice;
  std::string name;
  int64_t out_offset = 0, out_count = 0;  // the window of the slice's outputs kept

  int64_t in_features() const { return whole ? whole->in_features() : slice->in_features(); }
  int64_t out_features() const { return whole ? whole->out_features() : slice->out_features(); }

  void forward(const float* x, int64_t m, float* y) const {
    if (whole) {
      whole->forward(x, m, y);
      return;
    }
    const int64_t wide = slice->out_features();
    if (out_offset == 0 && out_count == wide) {
      slice->forward(x, m, y);
      return;
    }
    std::vector<float> full(static_cast<size_t>(m * wide));
    slice->forward(x, m, full.data());
    for (int64_t t = 0; t < m; ++t)
      std::copy_n(full.data() + t * wide + out_offset, out_count, y + t * out_count);
  }
};

struct CpuGqa final : Module {
  GqaAttentionSpec spec;
  Extent q_heads, kv_heads;
  bool window = false;  // a rank's heads of a larger layer
  int cache_layer = 0;
  double eps = 0.0;
  std::optional<model::RopeTable> rope;
  std::vector<float> q_norm, k_norm;
  std::vector<float> sinks;  // this rank's heads' sink logits (gpt-oss), empty without
};

// Multi-head latent attention: the latent norm, kv_b_proj and RoPE of one layer.
struct CpuMla final : Module {
  MlaAttentionSpec spec;
  int cache_layer = 0;
  std::vector<float> kv_norm;
  ModulePtr kv_b;  // a CpuLinear: [heads * (qk_nope + v), kv_lora_rank], this rank's heads
  std::optional<model::RopeTable> rope;
  // A full DSA indexer (the cache slot holds its key after the latent and the roped key part).
  std::optional<Linear> wq_b, wk, weights_proj;
  std::vector<float> k_norm_w, k_norm_b;  // LayerNorm over index_head_dim
};

// A gated DeltaNet layer: its weights, and per sequence the recurrent state with the cache
// generation and token count it was computed for (a step must continue exactly there).
struct CpuDeltaNet final : Module {
  DeltaNetWeights w;
  struct Seq {
    uint64_t generation = 0;
    int64_t length = 0;
    DeltaNetState state;
  };
  mutable std::unordered_map<PagedKvCache::SeqId, Seq> seqs;
  mutable std::unordered_map<int64_t, DeltaNetState> snapshots;  // by snapshot slot
};

// RoPE on the first 2 * half channels of x: pairs (i, i + half), or with `interleave` pairs
// (2i, 2i + 1) written back de-interleaved (evens, then odds), as transformers does; queries and
// keys get the same order, so their products are the same as in place.
void rope_mla(float* x, const float* cos, const float* sin, int64_t half, bool interleave) {
  if (!interleave) {
    model::apply_rope(x, cos, sin, half);
    return;
  }
  float tmp[512];
  const int64_t d = 2 * half;
  for (int64_t i = 0; i < half; ++i) {
    tmp[i] = x[2 * i];
    tmp[i + half] = x[2 * i + 1];
  }
  std::copy_n(tmp, d, x);
  model::apply_rope(x, cos, sin, half);
}

// The gated MLP of one routed expert run as runtime Linears (unquantized, or EXL3 experts with
// biases or an activation the exl3::moe kernels lack), observed like any MLP.
// (whole, or a rank's slice of its intermediate channels: the down output is then a partial sum)
struct DenseExpert {
  ModulePtr gate, up, down;  // CpuLinears
  std::string gate_up_names[2], down_names[1];
  model::Activation activation = model::Activation::kSilu;
  float alpha = 0.0f, limit = 0.0f;  // kClampedSwiglu

  void forward(const float* x, int64_t m, float* y, LinearObserver* obs) const {
    const auto& g_l = static_cast<const CpuLinear&>(*gate);
    const int64_t inter = g_l.out_features();
    std::vector<float> g(static_cast<size_t>(m * inter)), u(g.size());
    if (obs != nullptr) obs->observe(gate_up_names, x, m, g_l.in_features());
    g_l.forward(x, m, g.data());
    static_cast<const CpuLinear&>(*up).forward(x, m, u.data());
    if (activation == model::Activation::kClampedSwiglu) {
      cpu_ops::clamped_swiglu_mul(g.data(), u.data(), m * inter, alpha, limit);
    } else {
      cpu_ops::silu_mul(g.data(), u.data(), m * inter);
    }
    if (obs != nullptr) obs->observe(down_names, g.data(), m, inter);
    static_cast<const CpuLinear&>(*down).forward(g.data(), m, y);
  }
};

// Routed experts in one of four storages: the exl3::moe layout whole (views), the layout stored
// rank-sliced and run whole (every rank's part summed), one rank's stored slice, one rank's
// slices cut here from the whole layout; or unquantized experts as Linears.
struct CpuMoe final : Module {
  MoeSpec spec;
  int64_t hidden = 0;
  std::shared_ptr<const DenseMatrix> router;
  std::vector<float> router_bias;  // gpt-oss: added to the logits; empty without
  std::vector<float> correction_bias;
  std::vector<moe::MoeLayerWeights> ranks;             // layout experts (one, or every stored rank)
  std::vector<moe::MlpView> views;                     // over ranks[0] or `owned`
  std::shared_ptr<const moe::MoeLayerWeights> parent;  // what `owned` slices view
  std::vector<Exl3Slice> owned;
  std::vector<DenseExpert> dense;
  bool empty_rank = false;  // a rank with no intermediate channels: contributes zeros
};

// transformers' fused gpt-oss experts (see MoeSpec) as one DenseExpert per expert over the
// intermediate channels `ext`: gate and up from gate_up_proj's interleaved columns, down from
// those rows of down_proj. The down bias belongs to one rank (`down_bias`): the ranks' outputs
// are summed.
std::vector<DenseExpert> fused_experts(const TensorStore& store, const MoeSpec& s, int64_t hidden,
                                       Extent ext, bool down_bias) {
  const int64_t experts = s.num_experts, inter = s.intermediate;
  const std::string p = s.prefix + ".experts.";
  const FusedColumns gate{0, 2, ext.begin, ext.count}, up{1, 2, ext.begin, ext.count};
  const FusedColumns down{0, 1, 0, hidden};
  const FusedExpertTensor gu = fused_expert_tensor(store, p + "gate_up_proj", experts, hidden);
  const FusedExpertTensor dn = fused_expert_tensor(store, p + "down_proj", experts, inter);
  // [in, count] as stored -> a linear weight [count, in].
  auto linear = [](const std::vector<float>& in_major, int64_t in, int64_t count,
                   std::vector<float> bias, const std::string& name) {
    std::vector<float> w(in_major.size());
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < count; ++o)
        w[static_cast<size_t>(o * in + i)] = in_major[static_cast<size_t>(i * count + o)];
    auto l = std::make_unique<CpuLinear>();
    l->name = name;
    l->whole.emplace(
        Linear::dense(DenseMatrix::from_f32(std::move(w), count, in, name), std::move(bias)));
    return l;
  };
  std::vector<DenseExpert> out;
  for (int64_t e = 0; e < experts; ++e) {
    const std::string names[3] = {fmt::format("{}{}.gate_proj", p, e),
                                  fmt::format("{}{}.up_proj", p, e),
                                  fmt::format("{}{}.down_proj", p, e)};
    DenseExpert x;
    x.gate = linear(fused_expert_columns(gu, e, gate), hidden, ext.count,
                    fused_expert_bias(store, p + "gate_up_proj_bias", experts, e, gate), names[0]);
    x.up = linear(fused_expert_columns(gu, e, up), hidden, ext.count,
                  fused_expert_bias(store, p + "gate_up_proj_bias", experts, e, up), names[1]);
    // down_proj [I, H]: this rank's rows are its intermediate channels.
    const std::vector<float> all = fused_expert_columns(dn, e, down);
    const std::vector<float> rows(all.begin() + ext.begin * hidden,
                                  all.begin() + ext.end() * hidden);
    std::vector<float> bias;
    if (down_bias) bias = fused_expert_bias(store, p + "down_proj_bias", experts, e, down);
    x.down = linear(rows, ext.count, hidden, std::move(bias), names[2]);
    x.gate_up_names[0] = names[0];
    x.gate_up_names[1] = names[1];
    x.down_names[0] = names[2];
    x.activation = s.activation;
    x.alpha = static_cast<float>(s.swiglu_alpha);
    x.limit = static_cast<float>(s.swiglu_limit);
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

CpuBackend::CpuBackend(const Checkpoint& ckpt, const ModelSpec& spec, Options opts)
    : ckpt_(ckpt), spec_(spec), opts_(std::move(opts)) {}

CpuBackend::~CpuBackend() = default;

// ---- load --------------------------------------------------------------------------------------

ModulePtr CpuBackend::load_embedding() {
  auto e = std::make_unique<CpuEmbedding>();
  e->table = opts_.embedding;
  if (!e->table) {
    e->table = std::make_shared<const DenseMatrix>(
        DenseMatrix::load(ckpt_.store(), spec_.embed_tokens, 0, spec_.hidden_size));
  }
  if (e->table->rows() < spec_.vocab_size) {
    fail("{}: tensor '{}' has {} rows, fewer than vocab_size {} (config.json)",
         ckpt_.path().string(), spec_.embed_tokens, e->table->rows(), spec_.vocab_size);
  }
  if (spec_.scale_embedding) {
    e->scale = model::embedding_scale(spec_, ckpt_.store().at(spec_.embed_tokens).info->dtype);
  }
  return e;
}

std::vector<float> CpuBackend::load_norm_weight(const std::string& tensor, int64_t width) const {
  return load_norm_vector(ckpt_.store(), tensor, width, spec_.norm_unit_offset);
}

ModulePtr CpuBackend::load_norm(const std::string& tensor, int64_t width,
                                std::optional<double> eps) {
  auto n = std::make_unique<CpuNorm>();
  n->weight = load_norm_weight(tensor, width);
  n->eps = eps.value_or(spec_.rms_norm_eps);
  return n;
}

ModulePtr CpuBackend::load_linear(const model::LinearSource& src) {
  auto l = std::make_unique<CpuLinear>();
  l->name = src.prefix;
  if (src.slice == nullptr) {
    l->whole.emplace(opts_.load ? opts_.load(src.prefix, src.in, src.out)
                                : Linear::load(ckpt_, src.prefix, src.in, src.out));
    return l;
  }
  l->slice.emplace(RankLinear::slice(ckpt_, *src.slice, src.rank));
  l->out_offset = src.out_offset;
  l->out_count = src.out_count < 0 ? l->slice->out_features() : src.out_count;
  if (l->out_offset < 0 || l->out_offset + l->out_count > l->slice->out_features()) {
    fail("{}: rank {} keeps outputs [{}, {}) of a slice of {}", src.prefix, src.rank, l->out_offset,
         l->out_offset + l->out_count, l->slice->out_features());
  }
  return l;
}

ModulePtr CpuBackend::load_tied_head(Extent vocab) {
  auto l = std::make_unique<CpuLinear>();
  l->name = spec_.embed_tokens;
  auto table = DenseMatrix::load(ckpt_.store(), spec_.embed_tokens, 0, spec_.hidden_size);
  if (vocab.begin == 0 && vocab.count == spec_.vocab_size) {
    l->whole.emplace(Linear::dense(std::move(table)));
  } else {
    l->slice.emplace(std::move(RankLinear::slice_dense(table, {vocab}).front()));
    l->out_count = l->slice->out_features();
  }
  return l;
}

ModulePtr CpuBackend::load_gqa(const GqaAttentionSpec& s, Extent q_heads, Extent kv_heads,
                               int cache_layer) {
  auto a = std::make_unique<CpuGqa>();
  a->spec = s;
  a->q_heads = q_heads;
  a->kv_heads = kv_heads;
  a->window = q_heads.count != s.num_heads || kv_heads.count != s.num_kv_heads;
  a->cache_layer = opts_.first_cache_layer + cache_layer;
  a->eps = spec_.rms_norm_eps;
  a->rope.emplace(s.rope);
  if (s.qk_norm == model::QkNorm::kPerHead) {
    a->q_norm = load_norm_weight(s.prefix + ".q_norm.weight", s.head_dim);
    a->k_norm = load_norm_weight(s.prefix + ".k_norm.weight", s.head_dim);
  }
  if (s.sinks) {
    const std::vector<float> all = load_vector(ckpt_.store(), s.prefix + ".sinks", s.num_heads);
    const auto first = all.begin() + q_heads.begin;
    a->sinks.assign(first, first + q_heads.count);
  }
  const int64_t width = kv_heads.count * s.head_dim;
  kv_.push_back({width, width});
  return a;
}

ModulePtr CpuBackend::load_gated_delta_net(const model::GatedDeltaNetSpec& s, int cache_layer) {
  (void)cache_layer;
  auto d = std::make_unique<CpuDeltaNet>();
  d->w = load_delta_net_weights(ckpt_.store(), s);
  delta_nets_.push_back(d.get());
  kv_.push_back({0, 0});  // a cache layer index like any layer's, holding nothing per token
  return d;
}

ModulePtr CpuBackend::load_mla(const MlaAttentionSpec& s, int cache_layer,
                               const model::LinearSource& kv_b) {
  if (s.qk_rope_head_dim > 512) {
    fail("{}: qk_rope_head_dim {} is above the 512 the CPU backend handles", s.prefix,
         s.qk_rope_head_dim);
  }
  auto a = std::make_unique<CpuMla>();
  a->spec = s;
  a->cache_layer = opts_.first_cache_layer + cache_layer;
  a->kv_norm = load_vector(ckpt_.store(), s.prefix + ".kv_a_layernorm.weight", s.kv_lora_rank);
  a->kv_b = load_linear(kv_b);
  a->rope.emplace(s.rope);
  int64_t width = s.kv_lora_rank + s.qk_rope_head_dim;
  if (s.indexer && !s.indexer->shared) {
    const auto& ix = *s.indexer;
    const std::string p = s.prefix + ".indexer.";
    auto ld = [&](const std::string& name, int64_t in, int64_t out) {
      return opts_.load ? opts_.load(p + name, in, out) : Linear::load(ckpt_, p + name, in, out);
    };
    a->wq_b.emplace(ld("wq_b", s.q_lora_rank, ix.n_heads * ix.head_dim));
    a->wk.emplace(ld("wk", spec_.hidden_size, ix.head_dim));
    a->weights_proj.emplace(ld("weights_proj", spec_.hidden_size, ix.n_heads));
    a->k_norm_w = load_vector(ckpt_.store(), p + "k_norm.weight", ix.head_dim);
    a->k_norm_b = load_vector(ckpt_.store(), p + "k_norm.bias", ix.head_dim);
    width += ix.head_dim;
  }
  // The latent cache: the normed latent and the roped shared key part (and the indexer's key),
  // nothing per head.
  kv_.push_back({width, 0});
  return a;
}

ModulePtr CpuBackend::load_moe(const MoeSpec& s, int layer, const model::TpMoePlan* plan,
                               int rank) {
  auto m = std::make_unique<CpuMoe>();
  const auto& store = ckpt_.store();
  const std::string path = ckpt_.path().string();
  m->spec = s;
  m->hidden = spec_.hidden_size;
  const int64_t hidden = spec_.hidden_size;
  const std::string router = s.prefix + "." + s.router_name;
  m->router = std::make_shared<const DenseMatrix>(
      DenseMatrix::load(store, router + ".weight", s.num_experts, hidden));
  if (s.router_bias) m->router_bias = load_vector(store, router + ".bias", s.num_experts);
  if (s.correction_bias) {
    m->correction_bias = load_vector(store, s.prefix + "." + s.correction_bias_name, s.num_experts);
  }
  const int experts = static_cast<int>(s.num_experts);
  const moe::MoeLayout* layout = opts_.moe_layout;
  // Experts with biases or another activation run as runtime Linears, EXL3 or not.
  const bool exl3 = layout != nullptr && layout->has_layer(layer) && s.plain_experts();
  if (!exl3) {  // unquantized experts: runtime Linears, whole or cut to this rank's channels
    if (plan != nullptr && plan->ranks[static_cast<size_t>(rank)].empty()) {
      m->empty_rank = true;
      return m;
    }
    if (has_fused_expert_tensor(store, s.prefix + ".experts.gate_up_proj")) {
      const Extent ext = plan ? plan->ranks[static_cast<size_t>(rank)] : Extent{0, s.intermediate};
      m->dense = fused_experts(store, s, hidden, ext, rank == 0);
      return m;
    }
    for (int e = 0; e < experts; ++e) {
      const std::string p = fmt::format("{}.experts.{}", s.prefix, e);
      auto ld = [&](const char* proj, model::TpSplit split, int64_t in, int64_t out) {
        if (plan == nullptr) return load_linear({p + proj, in, out});
        model::TpLinearPlan lp{p + proj, split, false, in, out, plan->ranks};
        return load_linear({lp.prefix, in, out, &lp, rank});
      };
      const std::string gate = "." + s.expert_proj[0], up = "." + s.expert_proj[1],
                        down = "." + s.expert_proj[2];
      DenseExpert x;
      x.gate = ld(gate.c_str(), model::TpSplit::kColumn, hidden, s.intermediate);
      x.up = ld(up.c_str(), model::TpSplit::kColumn, hidden, s.intermediate);
      x.down = ld(down.c_str(), model::TpSplit::kRow, s.intermediate, hidden);
      x.gate_up_names[0] = p + gate;
      x.gate_up_names[1] = p + up;
      x.down_names[0] = p + down;
      x.activation = s.activation;
      x.alpha = static_cast<float>(s.swiglu_alpha);
      x.limit = static_cast<float>(s.swiglu_limit);
      m->dense.push_back(std::move(x));
    }
    return m;
  }
  moe::check_expert_naming(*layout, s.block, s.expert_proj, spec_.label);
  for (int e = 0; e < experts; ++e) {
    for (const auto& proj : s.expert_proj) {
      const std::string w = fmt::format("{}.experts.{}.{}.weight", s.prefix, e, proj);
      if (store.contains(w)) {
        fail(
            "{}: MoE layer {} mixes EXL3 experts with unquantized ones (e.g. '{}'); hint: "
            "quantize all routed experts of a layer, or none",
            path, layer, w);
      }
    }
  }
  if (plan == nullptr) {  // the whole layer: one stored rank, or every stored rank summed
    for (int r = 0; r < layout->tp; ++r) {
      m->ranks.push_back(moe::load_moe_layer(store, *layout, layer, r, layout->tp, experts));
    }
    const auto& w0 = m->ranks.front();
    if (w0.hidden != hidden || w0.intermediate * layout->tp != s.intermediate) {
      fail(
          "{}: MoE layer {} experts are {} -> {} (x TP {}), but config.json gives hidden_size "
          "{} and moe_intermediate_size {}",
          path, layer, w0.hidden, w0.intermediate, layout->tp, hidden, s.intermediate);
    }
    if (layout->tp == 1) {
      for (const auto& e : w0.experts) m->views.push_back(moe::MlpView::of(e, w0.codebook));
    }
    return m;
  }
  const int tp = static_cast<int>(plan->ranks.size());
  const Extent ext = plan->ranks[static_cast<size_t>(rank)];
  if (plan->rank_sliced) {  // only this rank's `.rank{r}` tensors are read
    m->ranks.push_back(moe::load_moe_layer(store, *layout, layer, rank, tp, experts));
    const auto& w = m->ranks.front();
    if (w.hidden != hidden || w.intermediate != ext.count) {
      fail(
          "{}: MoE layer {} rank {} experts are {} -> {}, expected {} -> {} "
          "(moe_intermediate_size {} / TP {})",
          path, layer, rank, w.hidden, w.intermediate, hidden, ext.count, s.intermediate, tp);
    }
    for (const auto& e : w.experts) m->views.push_back(moe::MlpView::of(e, w.codebook));
    return m;
  }
  auto full = std::make_shared<const moe::MoeLayerWeights>(
      moe::load_moe_layer(store, *layout, layer, 0, layout->tp, experts));
  if (full->hidden != hidden || full->intermediate != s.intermediate) {
    fail(
        "{}: MoE layer {} experts are {} -> {}, but config.json gives hidden_size {} and "
        "moe_intermediate_size {}",
        path, layer, full->hidden, full->intermediate, hidden, s.intermediate);
  }
  if (ext.empty()) {
    m->empty_rank = true;
    return m;
  }
  m->parent = full;
  m->owned.reserve(full->experts.size() * 3);
  for (const auto& ew : full->experts) {
    const auto v = moe::MlpView::of(ew, full->codebook);
    m->owned.push_back(slice_exl3(v.gate, model::TpSplit::kColumn, ext.begin, ext.end(), true));
    m->owned.push_back(slice_exl3(v.up, model::TpSplit::kColumn, ext.begin, ext.end(), true));
    m->owned.push_back(slice_exl3(v.down, model::TpSplit::kRow, ext.begin, ext.end(), rank == 0));
  }
  for (size_t i = 0; i < full->experts.size(); ++i) {
    m->views.push_back({m->owned[3 * i].view, m->owned[3 * i + 1].view, m->owned[3 * i + 2].view});
  }
  return m;
}

// ---- run ---------------------------------------------------------------------------------------

Act CpuBackend::act(model::Slot slot, int64_t width) {
  auto& v = slots_[static_cast<size_t>(slot)];
  v.resize(static_cast<size_t>(step_.n * width));
  return {v.data(), step_.n, width};
}

void CpuBackend::embed(const Module& embedding, Act x) {
  const auto& e = static_cast<const CpuEmbedding&>(embedding);
  for (int64_t t = 0; t < x.rows; ++t) {
    float* row = x.data + t * x.width;
    e.table->row(step_.tokens[static_cast<size_t>(t)], row);
    if (e.scale != 1.0f)
      for (int64_t i = 0; i < x.width; ++i) row[i] *= e.scale;
  }
}

void CpuBackend::add_rms_norm(Act x, const Act* residual, const Module& norm, Act out) {
  if (residual != nullptr) add(x, *residual);
  const auto& n = static_cast<const CpuNorm&>(norm);
  cpu_ops::rms_norm(x.data, n.weight.data(), x.rows, x.width, n.eps, out.data);
}

void CpuBackend::linears(std::span<const Module* const> linears, Act x, std::span<const Act> ys) {
  if (step_.observer != nullptr && x.width > 0) {
    std::vector<std::string> names;
    for (const Module* l : linears) names.push_back(static_cast<const CpuLinear*>(l)->name);
    step_.observer->observe(names, x.data, x.rows, x.width);
  }
  for (size_t i = 0; i < linears.size(); ++i) {
    static_cast<const CpuLinear*>(linears[i])->forward(x.data, x.rows, ys[i].data);
  }
}

void CpuBackend::attention(const Module& attn, Act q, Act k, Act v, Act out) {
  const auto& a = static_cast<const CpuGqa&>(attn);
  const int64_t m = q.rows, nh = a.q_heads.count, nkv = a.kv_heads.count, hd = a.spec.head_dim;
  PagedKvCache& cache = *step_.cache;
  const auto seq = step_.seq;
  const int64_t start = step_.start;
  const int layer = a.cache_layer;
  if (a.spec.qk_norm == model::QkNorm::kPerHead) {
    cpu_ops::rms_norm(q.data, a.q_norm.data(), m * nh, hd, a.eps, q.data);
    cpu_ops::rms_norm(k.data, a.k_norm.data(), m * nkv, hd, a.eps, k.data);
  }
  const int64_t half = a.rope->half();
  // An integer-format cache stores rotated keys; the queries get the same rotation, which leaves
  // every score as it was (exl3/cpu/kv_codec.hpp).
  const bool rotate = cpu::kv_rotates_keys(cache.format());
  tbb::parallel_for(int64_t{0}, m, [&](int64_t t) {
    std::vector<float> cs(static_cast<size_t>(2 * half));
    a.rope->at(start + t, cs.data(), cs.data() + half);
    float* qt = q.data + t * nh * hd;
    float* kt = k.data + t * nkv * hd;
    for (int64_t h = 0; h < nh; ++h)
      model::apply_rope(qt + h * hd, cs.data(), cs.data() + half, half);
    for (int64_t h = 0; h < nkv; ++h)
      model::apply_rope(kt + h * hd, cs.data(), cs.data() + half, half);
    if (rotate) {
      cpu_ops::rotate_heads(qt, nh, hd);
      cpu_ops::rotate_heads(kt, nkv, hd);
    }
    cache.store(layer, seq, start + t, kt, v.data + t * nkv * hd);
  });
  cpu_ops::GqaShape shape{nh, nkv, hd};
  shape.sliding_window = a.spec.sliding_window;
  shape.sinks = a.sinks.empty() ? nullptr : a.sinks.data();
  if (a.window) {
    shape.q_per_kv = a.spec.q_per_kv();
    shape.first_q_head = a.q_heads.begin;
  }
  cpu_ops::gqa_attention(q.data, m, start, cache, layer, seq, shape,
                         static_cast<float>(a.spec.scale), out.data);
}

// The expanded form: every cached latent goes through kv_b_proj into per-head keys and values,
// then plain causal attention. (The absorbed form that folds W_UK into q is a decode
// optimisation; as the fp32 reference this computes what transformers computes.)
void CpuBackend::mla_attention(const Module& attn, Act h, Act q_resid, Act q, Act kv_a, Act out) {
  const auto& a = static_cast<const CpuMla&>(attn);
  const MlaAttentionSpec& s = a.spec;
  const int64_t m = q.rows, nh = s.num_heads, nope = s.qk_nope_head_dim, rd = s.qk_rope_head_dim;
  const int64_t qk = s.qk_head_dim(), vd = s.v_head_dim, lora = s.kv_lora_rank;
  const int64_t half = a.rope->half(), width = lora + rd;
  PagedKvCache& cache = *step_.cache;
  const auto seq = step_.seq;
  const int64_t start = step_.start, total = start + m;
  const int layer = a.cache_layer;
  const bool full_indexer = a.wq_b.has_value();
  const int64_t ihd = s.indexer ? s.indexer->head_dim : 0, inh = s.indexer ? s.indexer->n_heads : 0;
  // Indexer queries and head weights of the new tokens, keys into the cache slot.
  std::vector<float> iq, iw, ik;
  if (full_indexer) {
    iq.resize(static_cast<size_t>(m * inh * ihd));
    iw.resize(static_cast<size_t>(m * inh));
    ik.resize(static_cast<size_t>(m * ihd));
    a.wq_b->forward(q_resid.data, m, iq.data());
    a.weights_proj->forward(h.data, m, iw.data());
    a.wk->forward(h.data, m, ik.data());
  }
  tbb::parallel_for(int64_t{0}, m, [&](int64_t t) {
    std::vector<float> cs(static_cast<size_t>(2 * half));
    a.rope->at(start + t, cs.data(), cs.data() + half);
    for (int64_t hh = 0; hh < nh; ++hh) {
      rope_mla(q.data + (t * nh + hh) * qk + nope, cs.data(), cs.data() + half, half,
               s.rope_interleave);
    }
    float* slot = cache.key(layer, seq, start + t);
    const float* kv = kv_a.data + t * width;
    cpu_ops::rms_norm(kv, a.kv_norm.data(), 1, lora, s.latent_norm_eps, slot);
    std::copy_n(kv + lora, rd, slot + lora);
    rope_mla(slot + lora, cs.data(), cs.data() + half, half, s.rope_interleave);
    if (!full_indexer) return;
    const bool il = s.indexer->rope_interleave;
    for (int64_t hh = 0; hh < inh; ++hh) {  // indexer q: [rope part, pass part]
      rope_mla(iq.data() + (t * inh + hh) * ihd, cs.data(), cs.data() + half, half, il);
    }
    float* k = ik.data() + t * ihd;  // LayerNorm (fp64 statistics), then RoPE
    double mean = 0.0, var = 0.0;
    for (int64_t d = 0; d < ihd; ++d) mean += k[d];
    mean /= static_cast<double>(ihd);
    for (int64_t d = 0; d < ihd; ++d) var += (k[d] - mean) * (k[d] - mean);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(ihd) + 1e-6);
    for (int64_t d = 0; d < ihd; ++d) {
      k[d] = static_cast<float>((k[d] - mean) * inv) * a.k_norm_w[static_cast<size_t>(d)] +
             a.k_norm_b[static_cast<size_t>(d)];
    }
    rope_mla(k, cs.data(), cs.data() + half, half, il);
    std::copy_n(k, ihd, slot + width);
  });
  // The positions each new token attends to: all earlier ones, or the indexer's top-k.
  if (full_indexer) {
    const int64_t keep = s.indexer->topk;
    const float kscale = 1.0f / std::sqrt(static_cast<float>(ihd));
    const float wscale = 1.0f / std::sqrt(static_cast<float>(inh));
    dsa_selection_.assign(static_cast<size_t>(m), {});
    tbb::parallel_for(int64_t{0}, m, [&](int64_t t) {
      const int64_t n = start + t + 1;
      std::vector<std::pair<float, int32_t>> scored(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = cache.key(layer, seq, j) + width;
        float score = 0.0f;
        for (int64_t hh = 0; hh < inh; ++hh) {
          const float* qh = iq.data() + (t * inh + hh) * ihd;
          float dot = 0.0f;
          for (int64_t d = 0; d < ihd; ++d) dot += qh[d] * kj[d];
          score += iw[static_cast<size_t>(t * inh + hh)] * wscale * std::max(dot * kscale, 0.0f);
        }
        scored[static_cast<size_t>(j)] = {score, static_cast<int32_t>(j)};
      }
      const auto k = static_cast<size_t>(std::min(keep, n));
      // Ties go to the lower position, so the CUDA backend's selection is the same set.
      std::partial_sort(scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(k),
                        scored.end(), [](const auto& x, const auto& y) {
                          return x.first > y.first || (x.first == y.first && x.second < y.second);
                        });
      auto& sel = dsa_selection_[static_cast<size_t>(t)];
      for (size_t i = 0; i < k; ++i) sel.push_back(scored[i].second);
      std::sort(sel.begin(), sel.end());
    });
  } else if (s.indexer && static_cast<int64_t>(dsa_selection_.size()) != m) {
    fail("{}: a shared DSA layer found no selection of this step's {} tokens from an earlier layer",
         s.prefix, m);
  }
  // Keys and values of every position the new tokens attend to.
  std::vector<float> latents(static_cast<size_t>(total * lora));
  for (int64_t j = 0; j < total; ++j) {
    std::copy_n(cache.key(layer, seq, j), lora, latents.data() + j * lora);
  }
  const int64_t kvw = nh * (nope + vd);
  std::vector<float> kvs(static_cast<size_t>(total * kvw));
  static_cast<const CpuLinear&>(*a.kv_b).forward(latents.data(), total, kvs.data());
  const auto scale = static_cast<float>(s.scale);
  tbb::parallel_for(int64_t{0}, m * nh, [&](int64_t task) {
    const int64_t t = task / nh, hh = task % nh;
    std::vector<int32_t> all;
    const std::vector<int32_t>* cols = nullptr;
    if (s.indexer) {
      cols = &dsa_selection_[static_cast<size_t>(t)];
    } else {
      all.resize(static_cast<size_t>(start + t + 1));
      for (size_t j = 0; j < all.size(); ++j) all[j] = static_cast<int32_t>(j);
      cols = &all;
    }
    const float* qv = q.data + (t * nh + hh) * qk;
    std::vector<float> p(cols->size());
    float mx = -INFINITY;
    for (size_t i = 0; i < cols->size(); ++i) {
      const int64_t j = (*cols)[i];
      const float* kn = kvs.data() + j * kvw + hh * (nope + vd);
      const float* kr = cache.key(layer, seq, j) + lora;
      float acc = 0.0f;
      for (int64_t d = 0; d < nope; ++d) acc += qv[d] * kn[d];
      for (int64_t d = 0; d < rd; ++d) acc += qv[nope + d] * kr[d];
      p[i] = acc * scale;
      mx = std::max(mx, p[i]);
    }
    float sum = 0.0f;
    for (auto& v : p) {
      v = std::exp(v - mx);
      sum += v;
    }
    float* o = out.data + (t * nh + hh) * vd;
    std::fill_n(o, vd, 0.0f);
    for (size_t i = 0; i < cols->size(); ++i) {
      const float w = p[i] / sum;
      const float* vv = kvs.data() + (*cols)[i] * kvw + hh * (nope + vd) + nope;
      for (int64_t d = 0; d < vd; ++d) o[d] += w * vv[d];
    }
  });
}

void CpuBackend::forget_sequence(PagedKvCache::SeqId seq) {
  for (const Module* m : delta_nets_) static_cast<const CpuDeltaNet*>(m)->seqs.erase(seq);
}

void CpuBackend::save_recurrent(PagedKvCache::SeqId seq, int64_t slot) {
  for (const Module* m : delta_nets_) {
    const auto& d = *static_cast<const CpuDeltaNet*>(m);
    const auto it = d.seqs.find(seq);
    if (it == d.seqs.end())
      fail("{}: sequence {} has no recurrent state to keep", d.w.spec.prefix, seq);
    d.snapshots.insert_or_assign(slot, it->second.state);
  }
}

void CpuBackend::restore_recurrent(PagedKvCache::SeqId seq, int64_t slot, uint64_t generation,
                                   int64_t length) {
  for (const Module* m : delta_nets_) {
    const auto& d = *static_cast<const CpuDeltaNet*>(m);
    const auto it = d.snapshots.find(slot);
    if (it == d.snapshots.end()) fail("{}: no recurrent-state snapshot {}", d.w.spec.prefix, slot);
    d.seqs.insert_or_assign(seq, CpuDeltaNet::Seq{generation, length, it->second});
  }
}

void CpuBackend::gated_delta_net(const Module& mixer, std::span<const Act> in, Act out) {
  const auto& d = static_cast<const CpuDeltaNet&>(mixer);
  const uint64_t generation = step_.cache->generation(step_.seq);
  auto it = d.seqs.find(step_.seq);
  if (step_.start == 0) {  // a sequence (re)starting: a fresh state
    if (it != d.seqs.end()) d.seqs.erase(it);
    it = d.seqs.emplace(step_.seq, CpuDeltaNet::Seq{generation, 0, DeltaNetState(d.w.spec)}).first;
  }
  if (it == d.seqs.end() || it->second.generation != generation ||
      it->second.length != step_.start) {
    fail(
        "{}: sequence {} continues at position {}, but this layer's recurrent state {}; a gated "
        "DeltaNet layer cannot rewind, and starts from cached pages only where the engine kept "
        "its state (hint: speculative decoding is off for such models; restart the sequence "
        "from position 0)",
        d.w.spec.prefix, step_.seq, step_.start,
        it == d.seqs.end() || it->second.generation != generation
            ? std::string("belongs to other tokens")
            : fmt::format("holds {} tokens", it->second.length));
  }
  const size_t want = d.w.spec.kimi ? 6 : (d.w.spec.split_inputs ? 4 : 2);
  if (in.size() != want) {
    fail("{}: {} input projections, expected {}", d.w.spec.prefix, in.size(), want);
  }
  DeltaNetInputs x;
  x.n = out.rows;
  for (size_t i = 0; i < want; ++i) x.p[i] = in[i].data;
  delta_net_forward(d.w, it->second.state, x, out.data);
  it->second.length += out.rows;
}

void CpuBackend::split_query_gate(Act qg, int64_t head_dim, Act q, Act gate) {
  const int64_t heads = q.width / head_dim;
  for (int64_t t = 0; t < qg.rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* src = qg.data + t * qg.width + h * 2 * head_dim;
      std::copy_n(src, head_dim, q.data + t * q.width + h * head_dim);
      std::copy_n(src + head_dim, head_dim, gate.data + t * gate.width + h * head_dim);
    }
  }
}

void CpuBackend::sigmoid_gate(Act y, Act gate) {
  for (int64_t t = 0; t < y.rows; ++t) {
    for (int64_t i = 0; i < y.width; ++i) {
      const float g = gate.data[t * gate.width + (gate.width == 1 ? 0 : i)];
      y.data[t * y.width + i] *= 1.0f / (1.0f + std::exp(-g));
    }
  }
}

void CpuBackend::glu(Act gate, Act up, model::Activation act) {
  if (act == model::Activation::kGeluTanh) {
    cpu_ops::gelu_tanh_mul(gate.data, up.data, gate.rows * gate.width);
  } else {
    cpu_ops::silu_mul(gate.data, up.data, gate.rows * gate.width);
  }
}

void CpuBackend::moe(const Module& moe, Act x, Act out) {
  const auto& l = static_cast<const CpuMoe&>(moe);
  const int64_t m = x.rows, e = l.spec.num_experts;
  LinearObserver* obs = step_.observer;
  if (obs != nullptr && l.dense.empty()) {
    fail(
        "{}: observing expert inputs needs the experts loaded as Linears (no MoE layout); "
        "hint: this is a calibration forward over an EXL3 layout",
        l.spec.prefix);
  }
  if (l.empty_rank) {
    std::fill_n(out.data, m * l.hidden, 0.0f);
    return;
  }
  std::vector<float> logits(static_cast<size_t>(m * e));
  l.router->matmul_t(x.data, m, logits.data(), l.router_bias);
  const moe::TopK routes = route_moe(l.spec, logits, m, l.correction_bias);
  if (!l.dense.empty()) {
    moe::routed_forward(static_cast<int>(e), l.hidden, routes, x.data, m, out.data,
                        [&](int id, const float* xs, int64_t rows, float* ys) {
                          l.dense[static_cast<size_t>(id)].forward(xs, rows, ys, obs);
                        });
  } else if (!l.views.empty()) {
    moe::moe_forward(l.views, routes, x.data, m, out.data);
  } else {
    moe::moe_forward_ranks(l.ranks, routes, x.data, m, out.data);
  }
}

void CpuBackend::add(Act y, Act x) {
  const int64_t n = y.rows * y.width;
  for (int64_t i = 0; i < n; ++i) y.data[i] += x.data[i];
}

void CpuBackend::all_reduce(Act y, const char* what) {
  (void)what;  // the in-process communicator names the collective itself
  if (step_.comm == nullptr) return;
  step_.comm->all_reduce_sum(std::span<float>(y.data, static_cast<size_t>(y.rows * y.width)));
}

void CpuBackend::logits(Act x, const Act* residual, const Module& norm, const Module& head) {
  if (residual != nullptr) add(x, *residual);
  const int64_t rows = step_.logit_rows, n = x.rows, hidden = x.width;
  const auto& fn = static_cast<const CpuNorm&>(norm);
  if (step_.hidden != nullptr) {
    cpu_ops::rms_norm(x.data, fn.weight.data(), n, hidden, fn.eps, step_.hidden);
  }
  if (rows == 0) return;
  std::vector<float> h(static_cast<size_t>(rows * hidden));
  cpu_ops::rms_norm(x.data + (n - rows) * hidden, fn.weight.data(), rows, hidden, fn.eps, h.data());
  const auto& l = static_cast<const CpuLinear&>(head);
  const int64_t out = l.out_features(), vocab = spec_.vocab_size;
  std::vector<float> local(static_cast<size_t>(rows * out));
  l.forward(h.data(), rows, local.data());
  if (spec_.final_logit_softcapping > 0.0) {
    cpu_ops::softcap(local.data(), rows * out, static_cast<float>(spec_.final_logit_softcapping));
  }
  if (step_.comm == nullptr) {  // the whole vocabulary (a tied head may cover padded rows)
    if (step_.logits == nullptr) return;
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(local.data() + r * out, vocab, step_.logits + r * vocab);
    return;
  }
  // Vocab-parallel: every rank's block padded to the widest so the gather is uniform.
  const auto& ranks = opts_.vocab;
  int64_t widest = 0;
  for (const auto& e : ranks) widest = std::max(widest, e.count);
  std::vector<float> block(static_cast<size_t>(rows * widest), 0.0f);
  for (int64_t t = 0; t < rows; ++t)
    std::copy_n(local.data() + t * out, out, block.data() + t * widest);
  std::vector<float> all(ranks.size() * block.size());
  step_.comm->all_gather(block, all);
  if (step_.logits == nullptr) return;
  for (size_t q = 0; q < ranks.size(); ++q) {
    const float* b = all.data() + q * block.size();
    for (int64_t t = 0; t < rows; ++t)
      std::copy_n(b + t * widest, ranks[q].count, step_.logits + t * vocab + ranks[q].begin);
  }
}

}  // namespace exl3::runtime
