// The decoder written once over the backend op layer (see exl3/model/decoder.hpp): which modules
// a layer loads (whole, or one rank's slice as the TpPlan cuts it) and the order its ops run in.
#include "exl3/model/decoder.hpp"

#include <fmt/format.h>

#include "exl3/error.hpp"

namespace exl3::model {
namespace {

LinearSource whole(std::string prefix, int64_t in, int64_t out) {
  return {std::move(prefix), in, out};
}

LinearSource sliced(const TpLinearPlan& p, int rank, int64_t out_offset = 0,
                    int64_t out_count = -1) {
  return {p.prefix, p.in, p.out, &p, rank, out_offset, out_count};
}

GqaModules load_gqa(Backend& b, const ModelSpec& model, const GqaAttentionSpec& s, int cache_layer,
                    const TpAttentionPlan* ap, int rank) {
  const int64_t hidden = model.hidden_size, hd = s.head_dim;
  GqaModules m;
  m.head_dim = hd;
  m.output_gate = s.output_gate;
  if (ap == nullptr) {
    m.q_heads = {0, s.num_heads};
    m.kv_heads = {0, s.num_kv_heads};
    m.q = b.load_linear(
        whole(s.prefix + ".q_proj", hidden, s.num_heads * hd * (s.output_gate ? 2 : 1)));
    m.k = b.load_linear(whole(s.prefix + ".k_proj", hidden, s.num_kv_heads * hd));
    m.v = b.load_linear(whole(s.prefix + ".v_proj", hidden, s.num_kv_heads * hd));
    m.o = b.load_linear(whole(s.prefix + ".o_proj", s.num_heads * hd, hidden));
  } else {
    const auto r = static_cast<size_t>(rank);
    m.q_heads = ap->q_heads[r];
    m.kv_heads = ap->kv_heads[r];
    if (ap->k.ranks[r] != ap->v.ranks[r]) {
      fail(
          "{}: k_proj and v_proj are stored differently (one EXL3, one not); hint: tensor "
          "parallelism needs both in one form",
          s.prefix);
    }
    // An EXL3 k/v slice covers whole 128-channel blocks: the rank's kv heads start kv_offset in.
    const int64_t kv_offset = m.kv_heads.begin * hd - ap->k.ranks[r].begin;
    const int64_t kv_width = m.kv_heads.count * hd;
    m.q = b.load_linear(sliced(ap->q, rank, 0, m.q_heads.count * hd));
    m.k = b.load_linear(sliced(ap->k, rank, kv_offset, kv_width));
    m.v = b.load_linear(sliced(ap->v, rank, kv_offset, kv_width));
    m.o = b.load_linear(sliced(ap->o, rank));
  }
  m.attention = b.load_gqa(s, m.q_heads, m.kv_heads, cache_layer);
  if (s.qk_norm == QkNorm::kAcrossHeads) {
    // One mean square over every head of a token: a rank holding some heads cannot form it alone.
    if (ap != nullptr) {
      fail(
          "{}: q_norm / k_norm normalise all {} heads of a token together (MiniMax-M2), which "
          "tensor parallelism by heads would need one more collective for; hint: --tp 1",
          s.prefix, s.num_heads);
    }
    m.q_norm = b.load_norm(s.prefix + ".q_norm.weight", s.num_heads * hd);
    m.k_norm = b.load_norm(s.prefix + ".k_norm.weight", s.num_kv_heads * hd);
    b.reserve(Slot::kQNormed, s.num_heads * hd);
    b.reserve(Slot::kKNormed, s.num_kv_heads * hd);
  }
  const Module* qkv[] = {m.q.get(), m.k.get(), m.v.get()};
  b.reserve_group(qkv);
  b.reserve(Slot::kQ, m.q_heads.count * hd);
  b.reserve(Slot::kAttn, m.q_heads.count * hd);
  b.reserve(Slot::kK, m.kv_heads.count * hd);
  b.reserve(Slot::kV, m.kv_heads.count * hd);
  if (s.output_gate) {
    b.reserve(Slot::kQueryGate, 2 * m.q_heads.count * hd);
    b.reserve(Slot::kOutputGate, m.q_heads.count * hd);
  }
  return m;
}

GatedDeltaNetModules load_delta_net(Backend& b, const ModelSpec& model, const GatedDeltaNetSpec& s,
                                    int cache_layer, bool sliced) {
  if (sliced) fail("{}: gated DeltaNet layers have no tensor-parallel slices", s.prefix);
  const int64_t hidden = model.hidden_size;
  GatedDeltaNetModules m;
  m.value_dim = s.value_dim();
  const auto input = [&](const char* name, Slot slot, int64_t width) {
    m.in.push_back(b.load_linear(whole(s.prefix + "." + name, hidden, width)));
    m.slots.push_back(slot);
    m.widths.push_back(width);
    b.reserve(slot, width);
  };
  if (s.kimi) {
    // q, k, v, b read h; f and g are two-step (f_a -> f_b, g_a -> g_b), their first steps here.
    input("q_proj", Slot::kQ, s.key_dim());
    input("k_proj", Slot::kK, s.key_dim());
    input("v_proj", Slot::kV, s.value_dim());
    input("b_proj", Slot::kMixerGates, s.num_v_heads);
    input("f_a_proj", Slot::kLatentQ, s.head_k_dim);
    input("g_a_proj", Slot::kLatentKv, s.head_k_dim);
    m.f_b = b.load_linear(whole(s.prefix + ".f_b_proj", s.head_k_dim, s.key_dim()));
    m.f_b_width = s.key_dim();
    m.g_b = b.load_linear(whole(s.prefix + ".g_b_proj", s.head_k_dim, s.value_dim()));
    b.reserve(Slot::kMixerA, s.key_dim());
    b.reserve(Slot::kMixerZ, s.value_dim());
  } else if (s.split_inputs) {
    input("in_proj_qkv", Slot::kMixerIn, s.qkv_width());
    input("in_proj_z", Slot::kMixerZ, s.value_dim());
    input("in_proj_b", Slot::kMixerGates, s.num_v_heads);
    input("in_proj_a", Slot::kMixerA, s.num_v_heads);
  } else {
    input("in_proj_qkvz", Slot::kMixerIn, s.qkvz_width());
    input("in_proj_ba", Slot::kMixerGates, s.ba_width());
  }
  m.out = b.load_linear(whole(s.prefix + (s.kimi ? ".o_proj" : ".out_proj"), m.value_dim, hidden));
  m.mixer = b.load_gated_delta_net(s, cache_layer);
  std::vector<const Module*> in;
  for (const auto& l : m.in) in.push_back(l.get());
  b.reserve_group(in);
  b.reserve(Slot::kAttn, m.value_dim);
  return m;
}

MlaModules load_mla(Backend& b, const ModelSpec& model, const MlaAttentionSpec& whole_spec,
                    int cache_layer, const TpMlaPlan* p, int rank) {
  const int64_t hidden = model.hidden_size;
  MlaAttentionSpec s = whole_spec;  // this rank's heads
  if (p != nullptr) s.num_heads = p->heads[static_cast<size_t>(rank)].count;
  MlaModules m;
  m.heads = s.num_heads;
  m.q_lora_rank = s.q_lora_rank;
  m.qk_head_dim = s.qk_head_dim();
  m.kv_a_width = s.kv_lora_rank + s.qk_rope_head_dim;
  m.v_head_dim = s.v_head_dim;
  const int64_t q_width = s.num_heads * s.qk_head_dim();
  const int64_t kv_b_width = s.num_heads * (s.qk_nope_head_dim + s.v_head_dim);
  // The latent path is whole on every rank; q, kv_b and o are cut by heads.
  if (s.q_lora_rank > 0) {
    m.q_a = b.load_linear(whole(s.prefix + ".q_a_proj", hidden, s.q_lora_rank));
    m.q_a_norm = b.load_norm(s.prefix + ".q_a_layernorm.weight", s.q_lora_rank, s.latent_norm_eps);
    m.q = b.load_linear(p ? sliced(p->q, rank)
                          : whole(s.prefix + ".q_b_proj", s.q_lora_rank, q_width));
    b.reserve(Slot::kLatentQ, s.q_lora_rank);
    b.reserve(Slot::kLatentQNormed, s.q_lora_rank);
  } else {
    m.q = b.load_linear(p ? sliced(p->q, rank) : whole(s.prefix + ".q_proj", hidden, q_width));
  }
  m.kv_a = b.load_linear(whole(s.prefix + ".kv_a_proj_with_mqa", hidden, m.kv_a_width));
  m.o = b.load_linear(p ? sliced(p->o, rank)
                        : whole(s.prefix + ".o_proj", s.num_heads * s.v_head_dim, hidden));
  m.attention = b.load_mla(
      s, cache_layer,
      p ? sliced(p->kv_b, rank) : whole(s.prefix + ".kv_b_proj", s.kv_lora_rank, kv_b_width));
  const Module* first[] = {m.q_a ? m.q_a.get() : m.q.get(), m.kv_a.get()};  // both read h
  b.reserve_group(first);
  b.reserve(Slot::kQ, q_width);
  b.reserve(Slot::kLatentKv, m.kv_a_width);
  b.reserve(Slot::kAttn, s.num_heads * s.v_head_dim);
  return m;
}

DenseMlpModules load_dense(Backend& b, const std::string& prefix, int64_t hidden, int64_t inter,
                           const TpMlpPlan* p, int rank, Activation act = Activation::kSilu) {
  DenseMlpModules m;
  m.activation = act;
  if (p == nullptr) {
    m.intermediate = inter;
    m.gate = b.load_linear(whole(prefix + ".gate_proj", hidden, inter));
    m.up = b.load_linear(whole(prefix + ".up_proj", hidden, inter));
    m.down = b.load_linear(whole(prefix + ".down_proj", inter, hidden));
  } else {
    m.intermediate = p->ranks[static_cast<size_t>(rank)].count;
    m.gate = b.load_linear(sliced(p->gate, rank));
    m.up = b.load_linear(sliced(p->up, rank));
    m.down = b.load_linear(sliced(p->down, rank));
  }
  const Module* gate_up[] = {m.gate.get(), m.up.get()};
  b.reserve_group(gate_up);
  b.reserve(Slot::kGate, m.intermediate);
  b.reserve(Slot::kUp, m.intermediate);
  return m;
}

// y = down(act(gate(h)) * up(h)).
void dense_mlp(Backend& b, const DenseMlpModules& m, Act h, Act y) {
  const Act g = b.act(Slot::kGate, m.intermediate), u = b.act(Slot::kUp, m.intermediate);
  const Module* gate_up[] = {m.gate.get(), m.up.get()};
  const Act outs[] = {g, u};
  b.linears(gate_up, h, outs);
  b.glu(g, u, m.activation);
  b.linear(*m.down, g, y);
}

// y = o(attention(q(h), k(h), v(h))) over this rank's heads.
void gqa_attention(Backend& b, const GqaModules& a, Act h, Act y) {
  const int64_t qw = a.q_heads.count * a.head_dim, kvw = a.kv_heads.count * a.head_dim;
  if (a.q_heads.count == 0) {  // a rank holding only padding heads: o_proj's bias or zeros
    b.linear(*a.o, Act{nullptr, h.rows, 0}, y);
    return;
  }
  Act q = b.act(Slot::kQ, qw), k = b.act(Slot::kK, kvw);
  const Act v = b.act(Slot::kV, kvw);
  const Module* qkv[] = {a.q.get(), a.k.get(), a.v.get()};
  // With an output gate q_proj writes [query, gate] per head, split after the projections.
  const Act q_out = a.output_gate ? b.act(Slot::kQueryGate, 2 * qw) : q;
  const Act outs[] = {q_out, k, v};
  b.linears(qkv, h, outs);
  const Act gate = a.output_gate ? b.act(Slot::kOutputGate, qw) : Act{};
  if (a.output_gate) b.split_query_gate(q_out, a.head_dim, q, gate);
  if (a.q_norm) {
    const Act qn = b.act(Slot::kQNormed, qw), kn = b.act(Slot::kKNormed, kvw);
    b.add_rms_norm(q, nullptr, *a.q_norm, qn);
    b.add_rms_norm(k, nullptr, *a.k_norm, kn);
    q = qn;
    k = kn;
  }
  const Act attn = b.act(Slot::kAttn, qw);
  b.attention(*a.attention, q, k, v, attn);
  if (a.output_gate) b.sigmoid_gate(attn, gate);
  b.linear(*a.o, attn, y);
}

// y = out_proj(gated norm(delta rule(conv(qkv)), z)) with this layer's recurrent state.
void delta_net(Backend& b, const GatedDeltaNetModules& a, Act h, Act y) {
  std::vector<const Module*> in;
  std::vector<Act> outs;
  for (size_t i = 0; i < a.in.size(); ++i) {
    in.push_back(a.in[i].get());
    outs.push_back(b.act(a.slots[i], a.widths[i]));
  }
  b.linears(in, h, outs);
  if (a.f_b) {  // KDA: [q, k, v, b, f_a(h), g_a(h)] -> [q, k, v, b, f, g]
    const Act f = b.act(Slot::kMixerA, a.f_b_width), g = b.act(Slot::kMixerZ, a.value_dim);
    b.linear(*a.f_b, outs[4], f);
    b.linear(*a.g_b, outs[5], g);
    outs[4] = f;
    outs[5] = g;
  }
  const Act core = b.act(Slot::kAttn, a.value_dim);
  b.gated_delta_net(*a.mixer, outs, core);
  b.linear(*a.out, core, y);
}

// y = o(attention over the latent cache of q(h) and kv_a(h)).
void mla_attention(Backend& b, const MlaModules& a, Act h, Act y) {
  const Act q = b.act(Slot::kQ, a.heads * a.qk_head_dim), kv = b.act(Slot::kLatentKv, a.kv_a_width);
  Act q_resid{nullptr, h.rows, 0};  // the normed q LoRA latent (a DSA indexer reads it)
  if (a.q_a) {                      // the q LoRA and kv_a both read h
    const Act qa = b.act(Slot::kLatentQ, a.q_lora_rank);
    const Module* first[] = {a.q_a.get(), a.kv_a.get()};
    const Act outs[] = {qa, kv};
    b.linears(first, h, outs);
    q_resid = b.act(Slot::kLatentQNormed, a.q_lora_rank);
    b.add_rms_norm(qa, nullptr, *a.q_a_norm, q_resid);
    b.linear(*a.q, q_resid, q);
  } else {
    const Module* first[] = {a.q.get(), a.kv_a.get()};
    const Act outs[] = {q, kv};
    b.linears(first, h, outs);
  }
  const Act attn = b.act(Slot::kAttn, a.heads * a.v_head_dim);
  b.mla_attention(*a.attention, h, q_resid, q, kv, attn);
  b.linear(*a.o, attn, y);
}

void attention(Backend& b, const GqaModules& a, Act h, Act y) {
  gqa_attention(b, a, h, y);
}
void attention(Backend& b, const MlaModules& a, Act h, Act y) {
  mla_attention(b, a, h, y);
}
void attention(Backend& b, const GatedDeltaNetModules& a, Act h, Act y) {
  delta_net(b, a, h, y);
}

}  // namespace

LayerModules load_layer(Backend& b, const ModelSpec& model, const LayerSpec& ls, int cache_layer,
                        RankOf rank) {
  const int64_t hidden = model.hidden_size;
  const TpLayerPlan* lp = nullptr;
  if (rank.plan != nullptr) lp = &rank.plan->layers[static_cast<size_t>(cache_layer)];
  LayerModules l;
  l.input_norm = b.load_norm(ls.input_norm, hidden);
  l.post_norm = b.load_norm(ls.post_attention_norm, hidden);
  if (!ls.attention_output_norm.empty()) {
    l.attention_output_norm = b.load_norm(ls.attention_output_norm, hidden);
    l.mlp_output_norm = b.load_norm(ls.mlp_output_norm, hidden);
    b.reserve(Slot::kNormedY, hidden);
  }
  if (const auto* a = std::get_if<GqaAttentionSpec>(&ls.attention)) {
    l.attention = load_gqa(b, model, *a, cache_layer, lp ? &lp->attention : nullptr, rank.rank);
  } else if (const auto* d = std::get_if<GatedDeltaNetSpec>(&ls.attention)) {
    l.attention = load_delta_net(b, model, *d, cache_layer, lp != nullptr);
  } else {
    l.attention = load_mla(b, model, std::get<MlaAttentionSpec>(ls.attention), cache_layer,
                           lp && lp->mla ? &*lp->mla : nullptr, rank.rank);
  }
  if (const auto* d = std::get_if<DenseMlpSpec>(&ls.mlp)) {
    l.mlp = load_dense(b, d->prefix, hidden, d->intermediate,
                       lp ? &std::get<TpMlpPlan>(lp->mlp) : nullptr, rank.rank, d->activation);
  } else {
    const auto& s = std::get<MoeSpec>(ls.mlp);
    const TpMoePlan* mp = lp ? &std::get<TpMoePlan>(lp->mlp) : nullptr;
    MoeModules m;
    m.routed = b.load_moe(s, ls.index, mp, rank.rank);
    if (s.shared) {
      m.shared = load_dense(b, s.shared->prefix, hidden, s.shared->intermediate,
                            mp && mp->shared ? &*mp->shared : nullptr, rank.rank);
      b.reserve(Slot::kShared, hidden);
      if (!s.shared_gate.empty()) {
        // Every rank gates its partial sum by the same factor, so the all-reduce sums it right.
        m.shared_gate = b.load_linear(whole(s.prefix + "." + s.shared_gate, hidden, 1));
        b.reserve(Slot::kOutputGate, 1);
      }
    }
    l.mlp = std::move(m);
  }
  for (const Slot s : {Slot::kX, Slot::kH, Slot::kY}) b.reserve(s, hidden);
  return l;
}

DecoderModules load_decoder_head(Backend& b, const ModelSpec& model, RankOf rank) {
  DecoderModules m;
  m.embedding = b.load_embedding();
  m.final_norm = b.load_norm(model.final_norm, model.hidden_size);
  if (rank.plan == nullptr) {
    m.head = model.lm_head_tied
                 ? b.load_tied_head({0, model.vocab_size})
                 : b.load_linear(whole(model.lm_head, model.hidden_size, model.vocab_size));
  } else {
    m.head = model.lm_head_tied ? b.load_tied_head(rank.plan->vocab[static_cast<size_t>(rank.rank)])
                                : b.load_linear(sliced(rank.plan->lm_head, rank.rank));
  }
  return m;
}

Act layer_forward(Backend& b, const LayerModules& l, int64_t hidden, Act x, const Act* pending) {
  const Act h = b.act(Slot::kH, hidden);
  const Act y = b.act(Slot::kY, hidden);
  b.add_rms_norm(x, pending, *l.input_norm, h);
  std::visit([&](const auto& a) { attention(b, a, h, y); }, l.attention);
  b.all_reduce(y, "attention output");
  // A sandwich norm needs the whole sum, so it runs after the all-reduce, on every rank alike.
  const Act normed = l.attention_output_norm ? b.act(Slot::kNormedY, hidden) : y;
  if (l.attention_output_norm) b.add_rms_norm(y, nullptr, *l.attention_output_norm, normed);
  b.add_rms_norm(x, &normed, *l.post_norm, h);
  if (const auto* d = std::get_if<DenseMlpModules>(&l.mlp)) {
    dense_mlp(b, *d, h, y);
  } else {
    const auto& m = std::get<MoeModules>(l.mlp);
    b.moe(*m.routed, h, y);
    if (m.shared) {
      const Act s = b.act(Slot::kShared, hidden);
      dense_mlp(b, *m.shared, h, s);
      if (m.shared_gate) {
        const Act g = b.act(Slot::kOutputGate, 1);
        b.linear(*m.shared_gate, h, g);
        b.sigmoid_gate(s, g);
      }
      b.add(y, s);
    }
  }
  b.all_reduce(y, "MLP output");
  if (!l.mlp_output_norm) return y;
  b.add_rms_norm(y, nullptr, *l.mlp_output_norm, normed);
  return normed;
}

void decoder_forward(Backend& b, const DecoderModules& m, int64_t hidden) {
  const Act x = b.act(Slot::kX, hidden);
  b.embed(*m.embedding, x);
  std::optional<Act> pending;
  for (const auto& l : m.layers)
    pending = layer_forward(b, l, hidden, x, pending ? &*pending : nullptr);
  b.logits(x, pending ? &*pending : nullptr, *m.final_norm, *m.head);
}

}  // namespace exl3::model
