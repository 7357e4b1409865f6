// Per-rank linear slices (see tp_linear.hpp).
#include "exl3/runtime/tp_linear.hpp"

#include <algorithm>
#include <optional>

#include "exl3/error.hpp"

namespace exl3::runtime {
namespace {

int64_t round_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace

Exl3Slice slice_exl3(const cpu::LinearView& full, TpSplit split, int64_t begin, int64_t end,
                     bool with_bias) {
  const int64_t axis = split == TpSplit::kColumn ? full.out_features : full.in_features;
  if (begin < 0 || end <= begin || end > axis || begin % 16 != 0 || end % 16 != 0) {
    fail(
        "slice_exl3: channels [{}, {}) are not whole 16-channel tiles inside the {} stored {} "
        "features",
        begin, end, axis, split == TpSplit::kColumn ? "output" : "input");
  }
  Exl3Slice s;
  s.view = full;
  const auto tile_words = static_cast<size_t>(16 * full.bits);
  const auto tiles_out = static_cast<size_t>(full.out_features / 16);
  const auto b = static_cast<size_t>(begin), e = static_cast<size_t>(end);
  if (split == TpSplit::kColumn) {
    const size_t rows = static_cast<size_t>(full.in_features / 16), cols = (e - b) / 16;
    s.trellis.resize(rows * cols * tile_words);
    for (size_t i = 0; i < rows; ++i) {
      std::copy_n(
          full.trellis.begin() + static_cast<ptrdiff_t>((i * tiles_out + b / 16) * tile_words),
          cols * tile_words, s.trellis.begin() + static_cast<ptrdiff_t>(i * cols * tile_words));
    }
    s.view.trellis = s.trellis;
    s.view.out_features = end - begin;
    s.view.svh = full.svh.subspan(b, e - b);
    if (!full.bias.empty())
      s.bias.assign(full.bias.begin() + static_cast<ptrdiff_t>(b),
                    full.bias.begin() + static_cast<ptrdiff_t>(e));
  } else {
    s.view.trellis = full.trellis.subspan(b / 16 * tiles_out * tile_words,
                                          (e - b) / 16 * tiles_out * tile_words);
    s.view.in_features = end - begin;
    s.view.suh = full.suh.subspan(b, e - b);
    if (with_bias) s.bias.assign(full.bias.begin(), full.bias.end());
  }
  s.view.bias = s.bias;
  s.view.validate();
  return s;
}

moe::MoeLayerWeights slice_moe_layer(const moe::MoeLayerWeights& full, Extent ext, int rank,
                                     int tp) {
  const int64_t H = full.hidden, I = full.intermediate, b = ext.begin, n = ext.count;
  if (full.tp != 1)
    fail("MoE layer {}: slicing needs the whole experts, but they are sliced for TP {}", full.layer,
         full.tp);
  if (n <= 0 || b < 0 || ext.end() > I || b % kTpBlock != 0 ||
      (n % kTpBlock != 0 && ext.end() != I)) {
    fail("MoE layer {}: intermediate channels [{}, {}) are not whole 128-channel blocks of its {}",
         full.layer, b, ext.end(), I);
  }
  moe::MoeLayerWeights w;
  w.layer = full.layer;
  w.rank = rank;
  w.tp = tp;
  w.rotation = full.rotation;
  w.codebook = full.codebook;
  w.hidden = H;
  w.intermediate = n;
  w.tensors_read = full.tensors_read;
  w.mapped_files = full.mapped_files;
  const auto& fr = full.rotations;
  w.rotations.h_rows = fr.h_rows;
  w.rotations.gate_suh = fr.gate_suh;
  w.rotations.up_suh = fr.up_suh;
  w.rotations.down_svh = fr.down_svh;
  const auto E = static_cast<size_t>(full.num_experts());
  w.rotations.intermediate.resize(E * static_cast<size_t>(3 * n));
  for (size_t e = 0; e < E; ++e) {
    for (int part = 0; part < 3; ++part) {  // gate_svh | up_svh | down_suh
      const auto* src = fr.intermediate.data() + e * static_cast<size_t>(3 * I) +
                        static_cast<size_t>(part * I + b);
      std::copy_n(src, n,
                  w.rotations.intermediate.data() + e * static_cast<size_t>(3 * n) +
                      static_cast<size_t>(part * n));
    }
  }
  // The hidden-side row an expert's span points at (one shared row under shared-H).
  const auto row_of = [&](std::span<const uint16_t> span, const std::vector<uint16_t>& table) {
    return static_cast<size_t>((span.data() - table.data()) / H);
  };
  const auto own = [&](std::span<const uint16_t> t) -> std::span<const uint16_t> {
    w.trellis_copies.emplace_back(t.begin(), t.end());
    return w.trellis_copies.back();
  };
  w.trellis_copies.reserve(3 * E);
  for (size_t e = 0; e < E; ++e) {
    const moe::ExpertWeights& fe = full.experts[e];
    moe::ExpertWeights x;
    const auto* inter = w.rotations.intermediate.data() + e * static_cast<size_t>(3 * n);
    const auto gate = slice_exl3(fe.gate.view(full.codebook), TpSplit::kColumn, b, b + n, false);
    const auto up = slice_exl3(fe.up.view(full.codebook), TpSplit::kColumn, b, b + n, false);
    const auto down = slice_exl3(fe.down.view(full.codebook), TpSplit::kRow, b, b + n, false);
    x.gate = {own(gate.view.trellis),
              fe.gate.bits,
              H,
              n,
              std::span<const uint16_t>(w.rotations.gate_suh)
                  .subspan(row_of(fe.gate.suh, fr.gate_suh) * H, H),
              std::span<const uint16_t>(inter, n)};
    x.up = {
        own(up.view.trellis),
        fe.up.bits,
        H,
        n,
        std::span<const uint16_t>(w.rotations.up_suh).subspan(row_of(fe.up.suh, fr.up_suh) * H, H),
        std::span<const uint16_t>(inter + n, n)};
    x.down = {own(down.view.trellis),
              fe.down.bits,
              n,
              H,
              std::span<const uint16_t>(inter + 2 * n, n),
              std::span<const uint16_t>(w.rotations.down_svh)
                  .subspan(row_of(fe.down.svh, fr.down_svh) * H, H)};
    w.experts.push_back(x);
  }
  return w;
}

struct RankLinear::Source {
  std::shared_ptr<const Exl3LinearData> data;  // EXL3
  std::optional<DenseMatrix> w;                // unquantized [out, in]
  std::vector<float> bias;                     // unquantized
};

RankLinear::Source RankLinear::load_source(const Checkpoint& ckpt, const TpLinearPlan& plan) {
  Source src;
  if (plan.exl3) {
    src.data = std::make_shared<const Exl3LinearData>(Exl3LinearData::load(ckpt, plan.prefix));
    return src;
  }
  src.w.emplace(DenseMatrix::load(ckpt.store(), plan.prefix + ".weight", plan.out, plan.in));
  if (ckpt.store().contains(plan.prefix + ".bias"))
    src.bias = load_vector(ckpt.store(), plan.prefix + ".bias", plan.out);
  return src;
}

RankLinear RankLinear::cut(const Source& src, const TpLinearPlan& plan, size_t r) {
  const bool column = plan.split == TpSplit::kColumn;
  const Extent& e = plan.ranks[r];
  if (src.data) {
    const auto full = cpu::LinearView::of(*src.data);
    const int64_t stored = column ? full.out_features : full.in_features;
    RankLinear l;
    l.in_ = column ? plan.in : e.count;
    l.out_ = column ? e.count : plan.out;
    l.parent_ = src.data;
    if (!e.empty()) {
      const int64_t end = std::min(round_up(e.end(), kTpBlock), stored);
      l.exl3_ =
          std::make_shared<const Exl3Slice>(slice_exl3(full, plan.split, e.begin, end, r == 0));
    } else if (!column && r == 0) {
      l.bias_ = src.data->bias();
    }
    return l;
  }
  const DenseMatrix& w = *src.w;
  if (column) {
    RankLinear l = std::move(slice_dense(w, {e}).front());
    if (!src.bias.empty()) l.bias_.assign(src.bias.begin() + e.begin, src.bias.begin() + e.end());
    return l;
  }
  RankLinear l;
  l.in_ = e.count;
  l.out_ = plan.out;
  if (r == 0) l.bias_ = src.bias;
  if (!e.empty()) {
    std::vector<float> row(static_cast<size_t>(plan.in)),
        v(static_cast<size_t>(plan.out * e.count));
    for (int64_t o = 0; o < plan.out; ++o) {
      w.row(o, row.data());
      std::copy_n(row.begin() + e.begin, e.count, v.begin() + o * e.count);
    }
    l.dense_ = std::make_shared<const DenseMatrix>(DenseMatrix::from_f32(
        std::move(v), plan.out, e.count, fmt::format("{}[:, {}:{}]", w.name(), e.begin, e.end())));
  }
  return l;
}

std::vector<RankLinear> RankLinear::slice_all(const Checkpoint& ckpt, const TpLinearPlan& plan) {
  const Source src = load_source(ckpt, plan);
  std::vector<RankLinear> out;
  for (size_t r = 0; r < plan.ranks.size(); ++r) out.push_back(cut(src, plan, r));
  return out;
}

RankLinear RankLinear::slice(const Checkpoint& ckpt, const TpLinearPlan& plan, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= plan.ranks.size()) {
    fail("{}: rank {} is outside the plan's {} ranks", plan.prefix, rank, plan.ranks.size());
  }
  return cut(load_source(ckpt, plan), plan, static_cast<size_t>(rank));
}

std::vector<RankLinear> RankLinear::slice_dense(const DenseMatrix& w,
                                                const std::vector<Extent>& ranks) {
  std::vector<RankLinear> out;
  for (const Extent& e : ranks) {
    if (e.end() > w.rows())
      fail("{}: rows [{}, {}) are outside its {} rows", w.name(), e.begin, e.end(), w.rows());
    RankLinear l;
    l.in_ = w.cols();
    l.out_ = e.count;
    if (!e.empty()) {
      std::vector<float> v(static_cast<size_t>(e.count * w.cols()));
      for (int64_t o = 0; o < e.count; ++o) w.row(e.begin + o, v.data() + o * w.cols());
      l.dense_ = std::make_shared<const DenseMatrix>(DenseMatrix::from_f32(
          std::move(v), e.count, w.cols(), fmt::format("{}[{}:{}]", w.name(), e.begin, e.end())));
    }
    out.push_back(std::move(l));
  }
  return out;
}

void RankLinear::forward(const float* x, int64_t m, float* y) const {
  if (m <= 0 || out_ == 0) return;
  if (dense_) {
    dense_->matmul_t(x, m, y, bias_);
    return;
  }
  if (!exl3_) {  // an empty row slice: rank 0 adds the bias, the others nothing
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t o = 0; o < out_; ++o)
        y[t * out_ + o] = bias_.empty() ? 0.0f : bias_[static_cast<size_t>(o)];
    }
    return;
  }
  const auto& v = exl3_->view;
  const int64_t sin = v.in_features, sout = v.out_features;
  if (sin == in_ && sout == out_) {
    cpu::linear_forward(v, x, cpu::ActDType::kF32, m, y);
    return;
  }
  std::vector<float> xp(static_cast<size_t>(m * sin), 0.0f), yp(static_cast<size_t>(m * sout));
  for (int64_t r = 0; r < m; ++r) std::copy_n(x + r * in_, in_, xp.data() + r * sin);
  cpu::linear_forward(v, xp.data(), cpu::ActDType::kF32, m, yp.data());
  for (int64_t r = 0; r < m; ++r) std::copy_n(yp.data() + r * sout, out_, y + r * out_);
}

}  // namespace exl3::runtime
