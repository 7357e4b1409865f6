// Tensor-parallel slicing rules (see tp_plan.hpp).
#include "exl3/model/tp_plan.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/moe/layout.hpp"

namespace exl3::model {
namespace {

// A plan or the reason there is none (so working_tp_sizes can probe without exceptions).
struct Attempt {
  TpPlan plan;
  std::string error;
};

// Empty when every non-empty extent of an EXL3 linear starts on a 128-channel block and ends on
// one (or at the axis end, whose last block the storage pads); else the message.
std::string check_blocks(const TpLinearPlan& l, int tp, std::string_view what) {
  if (!l.exl3) return {};
  const int64_t axis = l.split == TpSplit::kColumn ? l.out : l.in;
  for (size_t r = 0; r < l.ranks.size(); ++r) {
    const Extent& e = l.ranks[r];
    if (e.empty()) continue;
    if (e.begin % kTpBlock != 0 || (e.end() % kTpBlock != 0 && e.end() != axis)) {
      return fmt::format(
          "{}: TP {} gives rank {} {} = {} channels [{}, {}) of {}, which cuts a 128-channel EXL3 "
          "block "
          "(the Hadamard-128 rotations and 16x16 trellis tiles cannot be split)",
          l.prefix, tp, r, what, l.split == TpSplit::kColumn ? "output" : "input", e.begin, e.end(),
          axis);
    }
  }
  return {};
}

TpLinearPlan linear_plan(std::string prefix, TpSplit split, int64_t in, int64_t out,
                         const TpWeightInfo& w, std::vector<Extent> ranks) {
  TpLinearPlan l;
  l.exl3 = w.exl3.contains(prefix);
  l.prefix = std::move(prefix);
  l.split = split;
  l.in = in;
  l.out = out;
  l.ranks = std::move(ranks);
  return l;
}

std::vector<Extent> scaled(const std::vector<Extent>& heads, int64_t width) {
  std::vector<Extent> out;
  for (const auto& e : heads) out.push_back({e.begin * width, e.count * width});
  return out;
}

std::string plan_attention(const GqaAttentionSpec& a, int64_t hidden, int tp, const TpWeightInfo& w,
                           TpAttentionPlan& p) {
  const int64_t h = a.num_heads, hd = a.head_dim, qpk = a.q_per_kv();
  p.num_heads = h;
  p.num_kv_heads = a.num_kv_heads;
  p.head_dim = hd;
  const int64_t local = (h + tp - 1) / tp;
  p.padded_heads = local * tp;
  std::vector<int64_t> holders(static_cast<size_t>(a.num_kv_heads), 0);
  for (int r = 0; r < tp; ++r) {
    const int64_t b = std::min(r * local, h), e = std::min((r + 1) * local, h);
    p.q_heads.push_back({b, e - b});
    if (e == b) {
      p.kv_heads.push_back({0, 0});
      continue;
    }
    const int64_t kb = b / qpk, ke = (e - 1) / qpk + 1;
    p.kv_heads.push_back({kb, ke - kb});
    for (int64_t k = kb; k < ke; ++k) ++holders[static_cast<size_t>(k)];
  }
  p.kv_replicas = *std::max_element(holders.begin(), holders.end());
  const int64_t q_out = h * hd, kv_out = a.num_kv_heads * hd;
  p.q =
      linear_plan(a.prefix + ".q_proj", TpSplit::kColumn, hidden, q_out, w, scaled(p.q_heads, hd));
  p.k = linear_plan(a.prefix + ".k_proj", TpSplit::kColumn, hidden, kv_out, w,
                    scaled(p.kv_heads, hd));
  p.v = linear_plan(a.prefix + ".v_proj", TpSplit::kColumn, hidden, kv_out, w,
                    scaled(p.kv_heads, hd));
  p.o = linear_plan(a.prefix + ".o_proj", TpSplit::kRow, q_out, hidden, w, scaled(p.q_heads, hd));
  for (const auto* l : {&p.q, &p.o}) {
    if (auto err = check_blocks(*l, tp, "its q heads"); !err.empty()) return err;
  }
  // k/v are column-parallel and their heads are only read, so a rank whose kv heads do not fill
  // whole blocks computes the covering blocks (replicating a neighbour's kv head) instead of
  // cutting one.
  for (auto* l : {&p.k, &p.v}) {
    if (!l->exl3) continue;
    for (auto& e : l->ranks) {
      if (e.empty()) continue;
      const int64_t b = e.begin / kTpBlock * kTpBlock,
                    end = std::min((e.end() + kTpBlock - 1) / kTpBlock * kTpBlock, kv_out);
      e = {b, end - b};
    }
  }
  return {};
}

std::string plan_mla(const MlaAttentionSpec& m, int64_t hidden, int tp, const TpWeightInfo& w,
                     TpMlaPlan& p) {
  if (m.num_heads < tp) {
    return fmt::format("{}: TP {} leaves ranks without any of the {} MLA heads", m.prefix, tp,
                       m.num_heads);
  }
  p.heads = deal_extents(m.num_heads, tp, 1);
  const int64_t qk = m.qk_head_dim(), kvb = m.qk_nope_head_dim + m.v_head_dim;
  const bool lora = m.q_lora_rank > 0;
  p.q = linear_plan(m.prefix + (lora ? ".q_b_proj" : ".q_proj"), TpSplit::kColumn,
                    lora ? m.q_lora_rank : hidden, m.num_heads * qk, w, scaled(p.heads, qk));
  p.kv_b = linear_plan(m.prefix + ".kv_b_proj", TpSplit::kColumn, m.kv_lora_rank, m.num_heads * kvb,
                       w, scaled(p.heads, kvb));
  p.o = linear_plan(m.prefix + ".o_proj", TpSplit::kRow, m.num_heads * m.v_head_dim, hidden, w,
                    scaled(p.heads, m.v_head_dim));
  for (const auto* l : {&p.q, &p.kv_b, &p.o}) {
    if (auto err = check_blocks(*l, tp, "its MLA heads"); !err.empty()) return err;
  }
  return {};
}

TpMlpPlan plan_mlp(const std::string& prefix, int64_t inter, int64_t hidden, int tp,
                   const TpWeightInfo& w) {
  TpMlpPlan p;
  p.prefix = prefix;
  p.intermediate = inter;
  p.exl3 = w.exl3.contains(prefix + ".gate_proj") || w.exl3.contains(prefix + ".up_proj") ||
           w.exl3.contains(prefix + ".down_proj");
  p.ranks = deal_extents(inter, tp, p.exl3 ? kTpBlock : 1);
  p.gate = linear_plan(prefix + ".gate_proj", TpSplit::kColumn, hidden, inter, w, p.ranks);
  p.up = linear_plan(prefix + ".up_proj", TpSplit::kColumn, hidden, inter, w, p.ranks);
  p.down = linear_plan(prefix + ".down_proj", TpSplit::kRow, inter, hidden, w, p.ranks);
  return p;
}

std::string plan_moe(const MoeSpec& m, int64_t hidden, int tp, const TpWeightInfo& w,
                     TpMoePlan& p) {
  p.prefix = m.prefix;
  p.num_experts = m.num_experts;
  p.intermediate = m.intermediate;
  if (w.checkpoint_tp > 1 && tp > 1) {
    if (tp != w.checkpoint_tp) {
      return fmt::format(
          "{}: the experts are stored rank-sliced for TP {} (config.json hybrid_tr3_tail.tp), the "
          "runtime asks "
          "for TP {}; a rank-sliced checkpoint is never reshuffled",
          m.prefix, w.checkpoint_tp, tp);
    }
    p.rank_sliced = true;
    const int64_t loc = m.intermediate / tp;
    for (int r = 0; r < tp; ++r) p.ranks.push_back({loc * r, loc});
  } else {
    // EXL3 experts move in whole 128-channel blocks; unquantized ones split anywhere.
    p.ranks = deal_extents(m.intermediate, tp, w.exl3_experts ? kTpBlock : 1);
  }
  if (m.shared) p.shared = plan_mlp(m.shared->prefix, m.shared->intermediate, hidden, tp, w);
  return {};
}

Attempt try_plan(const ModelSpec& spec, int tp, const TpWeightInfo& w) {
  Attempt a;
  TpPlan& p = a.plan;
  p.tp = tp;
  p.vocab_size = spec.vocab_size;
  const bool head_exl3 = !spec.lm_head_tied && w.exl3.contains(spec.lm_head);
  p.vocab = deal_extents(spec.vocab_size, tp, head_exl3 ? kTpBlock : 1);
  p.lm_head = linear_plan(spec.lm_head_tied ? spec.embed_tokens : spec.lm_head, TpSplit::kColumn,
                          spec.hidden_size, spec.vocab_size, w, p.vocab);
  p.lm_head.exl3 = head_exl3;
  for (const auto& ls : spec.layers) {
    TpLayerPlan lp;
    lp.index = ls.index;
    if (const auto* d = std::get_if<GatedDeltaNetSpec>(&ls.attention)) {
      if (tp > 1) {
        a.error = fmt::format(
            "{}: gated DeltaNet layers are not cut for tensor parallelism yet (their recurrent "
            "state would be sliced by value heads); hint: --tp 1",
            d->prefix);
        return a;
      }
    } else if (const auto* gqa = std::get_if<GqaAttentionSpec>(&ls.attention)) {
      if (gqa->output_gate && tp > 1) {
        a.error = fmt::format(
            "{}: q_proj holds each head's query and output gate together (Qwen3-Next), which the "
            "plan does not slice yet; hint: --tp 1",
            gqa->prefix);
        return a;
      }
      if (a.error = plan_attention(*gqa, spec.hidden_size, tp, w, lp.attention); !a.error.empty())
        return a;
    } else {
      TpMlaPlan mp;
      if (a.error = plan_mla(std::get<MlaAttentionSpec>(ls.attention), spec.hidden_size, tp, w, mp);
          !a.error.empty())
        return a;
      lp.mla = std::move(mp);
    }
    if (const auto* d = std::get_if<DenseMlpSpec>(&ls.mlp)) {
      lp.mlp = plan_mlp(d->prefix, d->intermediate, spec.hidden_size, tp, w);
    } else {
      TpMoePlan mp;
      if (a.error = plan_moe(std::get<MoeSpec>(ls.mlp), spec.hidden_size, tp, w, mp);
          !a.error.empty())
        return a;
      lp.mlp = std::move(mp);
    }
    p.layers.push_back(std::move(lp));
  }
  return a;
}

nlohmann::json extents_json(const std::vector<Extent>& v) {
  auto j = nlohmann::json::array();
  for (const auto& e : v) j.push_back({e.begin, e.count});
  return j;
}

}  // namespace

std::string_view tp_split_name(TpSplit s) {
  return s == TpSplit::kColumn ? "column" : "row";
}

std::vector<Extent> deal_extents(int64_t count, int tp, int64_t block) {
  if (tp < 1 || block < 1 || count < 0)
    fail("deal_extents: {} units over {} ranks in blocks of {}", count, tp, block);
  const int64_t blocks = (count + block - 1) / block, q = blocks / tp, rem = blocks % tp;
  std::vector<Extent> out;
  int64_t at = 0;
  for (int r = 0; r < tp; ++r) {
    const int64_t n = (q + (r < rem ? 1 : 0)) * block;
    const int64_t b = std::min(at, count), e = std::min(at + n, count);
    out.push_back({b, e - b});
    at += n;
  }
  return out;
}

TpWeightInfo tp_weight_info(const Checkpoint& ckpt) {
  TpWeightInfo w;
  for (const auto& l : ckpt.linears()) w.exl3.insert(l.prefix);
  const auto layout = moe::read_moe_layout(ckpt);
  if (layout && layout->rank_sliced()) w.checkpoint_tp = layout->tp;
  w.exl3_experts = layout.has_value();
  return w;
}

std::vector<int> working_tp_sizes(const ModelSpec& spec, const TpWeightInfo& weights, int max_tp) {
  std::vector<int> out;
  for (int tp = 1; tp <= max_tp; ++tp) {
    if (try_plan(spec, tp, weights).error.empty()) out.push_back(tp);
  }
  return out;
}

TpPlan plan_tensor_parallel(const ModelSpec& spec, int tp, const TpWeightInfo& weights) {
  if (tp < 1 || tp > kMaxTp) fail("tensor parallel: TP {} is outside 1..{}", tp, kMaxTp);
  Attempt a = try_plan(spec, tp, weights);
  if (!a.error.empty()) {
    const auto ok = working_tp_sizes(spec, weights);
    fail("{} ({}); hint: TP sizes that work for this model: {}", spec.label, a.error,
         fmt::join(ok, ", "));
  }
  return std::move(a.plan);
}

nlohmann::json tp_plan_summary(const TpPlan& plan) {
  nlohmann::json j = {{"tp", plan.tp}, {"vocab", extents_json(plan.vocab)}};
  auto layers = nlohmann::json::array();
  for (const auto& l : plan.layers) {
    const auto& a = l.attention;
    nlohmann::json lj = {{"layer", l.index}};
    if (l.mla) {
      lj["mla_heads"] = extents_json(l.mla->heads);
    } else {
      lj["padded_heads"] = a.padded_heads;
      lj["kv_replicas"] = a.kv_replicas;
      lj["q_heads"] = extents_json(a.q_heads);
      lj["kv_heads"] = extents_json(a.kv_heads);
    }
    if (const auto* d = std::get_if<TpMlpPlan>(&l.mlp)) {
      lj["mlp"] = extents_json(d->ranks);
    } else {
      const auto& m = std::get<TpMoePlan>(l.mlp);
      lj["experts"] = extents_json(m.ranks);
      lj["rank_sliced"] = m.rank_sliced;
      if (m.shared) lj["shared"] = extents_json(m.shared->ranks);
    }
    layers.push_back(std::move(lj));
  }
  j["layers"] = std::move(layers);
  return j;
}

}  // namespace exl3::model
