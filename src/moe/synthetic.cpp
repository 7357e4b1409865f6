// Synthetic MoE checkpoint writer (see synthetic.hpp). Any int16 words form a valid tail-biting
// trellis, so random words are a valid EXL3 tensor. Rotation vectors are random signs times
// log-normal magnitudes: ~1 on the output side, ~1/(1.24*sqrt(in)) on the input side (as the
// quantizer's suh folds in the codebook scale), so activations stay O(1) and SiLU stays
// non-linear.
#include "exl3/moe/synthetic.hpp"

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/file_io.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3::moe {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

// One expert projection before slicing: trellis [in/16, out/16, 16K] and its vectors.
struct FullProj {
  int64_t in = 0, out = 0;
  int bits = 0;
  std::vector<uint16_t> trellis, suh, svh;
};

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  std::vector<uint16_t> words(size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& w : v) w = static_cast<uint16_t>(rng_());
    return v;
  }
  std::vector<uint16_t> scales(int64_t n, double base) {
    std::normal_distribution<double> nd(0.0, 0.25);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) {
      const double sign = (rng_() & 1u) ? -1.0 : 1.0;
      x = trellis::float_to_half(static_cast<float>(sign * base * std::exp(nd(rng_))));
    }
    return v;
  }
  std::vector<float> normal(size_t n, double scale) {
    std::normal_distribution<double> nd(0.0, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(nd(rng_));
    return v;
  }
  double in_scale(int64_t in) const { return 1.0 / (1.24 * std::sqrt(static_cast<double>(in))); }

 private:
  std::mt19937_64 rng_;
};

// Rows [r0, r1) of the tile grid's first dim (down: K-slice) or columns of the second (gate/up:
// N-slice), in tiles.
std::vector<uint16_t> slice_trellis(const FullProj& p, bool slice_rows, int64_t t0, int64_t t1) {
  const int64_t tk = p.in / 16, tn = p.out / 16, w = 16 * int64_t{p.bits};
  std::vector<uint16_t> out;
  for (int64_t i = 0; i < tk; ++i) {
    if (slice_rows && (i < t0 || i >= t1)) continue;
    const int64_t j0 = slice_rows ? 0 : t0, j1 = slice_rows ? tn : t1;
    const auto* b = p.trellis.data() + (i * tn + j0) * w;
    out.insert(out.end(), b, b + (j1 - j0) * w);
  }
  return out;
}

std::vector<uint16_t> slice(const std::vector<uint16_t>& v, int64_t b, int64_t n) {
  return {v.begin() + b, v.begin() + b + n};
}

class Writer {
 public:
  Writer(const fs::path& dir, const SyntheticMoeSpec& s) : dir_(dir), s_(s) {}

  SafetensorsWriter& file_for(int rank) {
    const std::string f = s_.one_file_per_rank && rank >= 0
                              ? fmt::format("model-rank{}.safetensors", rank)
                              : "model.safetensors";
    return files_[f];
  }
  void add(int rank, const std::string& name, DType dt, std::vector<int64_t> shape,
           const std::vector<uint16_t>& v) {
    file_for(rank).add<uint16_t>(name, dt, std::move(shape), v);
    record(rank, name, v.size() * 2);
  }
  void add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    file_for(-1).add<float>(name, DType::kF32, std::move(shape), v);
    record(-1, name, v.size() * 4);
  }
  void add_marker(int rank, const std::string& name, int32_t value) {
    file_for(rank).add<int32_t>(name, DType::kI32, {}, std::span<const int32_t>(&value, 1));
    record(rank, name, 4);
  }

  SyntheticMoeResult finish() {
    SyntheticMoeResult r;
    r.dir = dir_;
    r.num_tensors = static_cast<int64_t>(weight_map_.size());
    r.bytes = bytes_;
    for (const auto& [name, w] : files_) w.write(dir_ / name);
    if (files_.size() > 1) {
      ojson idx = {{"metadata", {{"total_size", bytes_}}}, {"weight_map", ojson::object()}};
      for (const auto& [t, f] : weight_map_) idx["weight_map"][t] = f;
      write_file_atomic(dir_ / "model.safetensors.index.json", idx.dump(2) + "\n");
    }
    return r;
  }

 private:
  void record(int rank, const std::string& name, uint64_t bytes) {
    weight_map_[name] = s_.one_file_per_rank && rank >= 0
                            ? fmt::format("model-rank{}.safetensors", rank)
                            : "model.safetensors";
    bytes_ += bytes;
  }
  fs::path dir_;
  const SyntheticMoeSpec& s_;
  std::map<std::string, SafetensorsWriter> files_;
  std::map<std::string, std::string> weight_map_;
  uint64_t bytes_ = 0;
};

void validate(SyntheticMoeSpec& s) {
  const bool sliced = s.rotation != RotationLayout::kPlain;
  if (s.hidden_size <= 0 || s.hidden_size % 128 != 0)
    fail("synthetic MoE: H {} must be a positive multiple of 128", s.hidden_size);
  if (s.tp <= 0 || (!sliced && s.tp != 1))
    fail("synthetic MoE: tp {} (plain layouts are TP 1)", s.tp);
  if (s.intermediate_size <= 0 || s.intermediate_size % (128 * s.tp) != 0) {
    fail("synthetic MoE: I {} must be a multiple of 128 * tp ({})", s.intermediate_size,
         128 * s.tp);
  }
  if (s.num_experts <= 0 || s.top_k <= 0 || s.top_k > s.num_experts) {
    fail("synthetic MoE: {} experts, top-{}", s.num_experts, s.top_k);
  }
  if (s.first_layer < 0 || s.last_layer < s.first_layer)
    fail("synthetic MoE: layers {}..{}", s.first_layer, s.last_layer);
  if (s.expert_bits.empty()) s.expert_bits.assign(static_cast<size_t>(s.num_experts), s.bits);
  if (s.expert_bits.size() != static_cast<size_t>(s.num_experts)) {
    fail("synthetic MoE: {} per-expert K for {} experts", s.expert_bits.size(), s.num_experts);
  }
  for (const int k : s.expert_bits) {
    if (!trellis::valid_bits(k)) fail("synthetic MoE: K {} outside 1..8", k);
  }
  if (sliced && s.codebook != trellis::Codebook::kMcg)
    fail("synthetic MoE: rank-sliced checkpoints use mcg");
  if (s.rotation == RotationLayout::kSharedH) s.shared_h_values = true;
}

ojson make_config(const SyntheticMoeSpec& s, const std::set<int>& ks) {
  ojson c = {{"architectures", {"Glm4MoeForCausalLM"}},
             {"model_type", "glm4_moe"},
             {"hidden_size", s.hidden_size},
             {"moe_intermediate_size", s.intermediate_size},
             {"n_routed_experts", s.num_experts},
             {"num_experts_per_tok", s.top_k},
             {"num_hidden_layers", s.last_layer + 1},
             {"first_k_dense_replace", s.first_layer},
             {"norm_topk_prob", true},
             {"n_group", 1},
             {"topk_group", 1},
             {"routed_scaling_factor", 1.0},
             {"hidden_act", "silu"}};
  c["quantization_config"] = {{"quant_method", "exl3"},
                              {"version", "exl3-synthetic"},
                              {"bits", *ks.begin()},
                              {"codebook", trellis::codebook_name(s.codebook)}};
  if (s.rotation == RotationLayout::kPlain) return c;
  ojson t = {{"format", "exl3-trellis"}, {"producer", "exl3 synthetic (random valid trellis)"}};
  if (ks.size() > 1) {
    t["bits"] = "mixed";
    t["k_values"] = std::vector<int>(ks.begin(), ks.end());
    t["bits_per_expert"] = "tier_bitmap.json:k";
  } else {
    t["bits"] = *ks.begin();
  }
  t["codebook"] = "mcg";
  t["mcg_multiplier"] = kMcgMultiplier;
  t["experts_per_layer"] = s.num_experts;
  t["moe_layers"] = {s.first_layer, s.last_layer};
  t["tp"] = s.tp;
  t["tensor_schema"] = kRankSlicedSchema;
  t["rotation_layout"] = rotation_layout_name(s.rotation);
  if (s.rotation == RotationLayout::kSharedH) t["shared_h_tensor_schema"] = kSharedHSchema;
  c["hybrid_tr3_tail"] = std::move(t);
  return c;
}

}  // namespace

SyntheticMoeResult write_synthetic_moe(const std::filesystem::path& dir, SyntheticMoeSpec s) {
  validate(s);
  create_output_folder(dir);
  const int64_t h = s.hidden_size, i_full = s.intermediate_size, i_loc = i_full / s.tp;
  const bool sliced = s.rotation != RotationLayout::kPlain;
  Generator gen(s.seed);
  Writer out(dir, s);
  for (int layer = s.first_layer; layer <= s.last_layer; ++layer) {
    out.add_f32(fmt::format("model.layers.{}.mlp.gate.weight", layer), {s.num_experts, h},
                gen.normal(static_cast<size_t>(s.num_experts * h),
                           1.0 / std::sqrt(static_cast<double>(h))));
    // Hidden side: gate suh, up suh, down svh (drawn once per layer when shared).
    std::vector<uint16_t> shared_hid[3];
    if (s.shared_h_values) {
      for (const Proj p : kProjs)
        shared_hid[static_cast<int>(p)] = gen.scales(h, p == Proj::kDown ? 1.0 : gen.in_scale(h));
    }
    for (int e = 0; e < s.num_experts; ++e) {
      const int k = s.expert_bits[static_cast<size_t>(e)];
      FullProj full[3];
      for (const Proj p : kProjs) {
        auto& f = full[static_cast<int>(p)];
        f.in = p == Proj::kDown ? i_full : h;
        f.out = p == Proj::kDown ? h : i_full;
        f.bits = k;
        f.trellis = gen.words(static_cast<size_t>(f.in / 16 * (f.out / 16) * 16 * k));
      }
      for (const Proj p : kProjs) {
        auto& f = full[static_cast<int>(p)];
        auto& hid = p == Proj::kDown ? f.svh : f.suh;
        hid = s.shared_h_values ? shared_hid[static_cast<int>(p)]
                                : gen.scales(h, p == Proj::kDown ? 1.0 : gen.in_scale(h));
      }
      for (const Proj p : kProjs) {
        auto& f = full[static_cast<int>(p)];
        auto& mid = p == Proj::kDown ? f.suh : f.svh;
        mid = gen.scales(i_full, p == Proj::kDown ? gen.in_scale(i_full) : 1.0);
      }
      for (int r = 0; r < s.tp; ++r) {
        for (const Proj p : kProjs) {
          const auto& f = full[static_cast<int>(p)];
          const bool down = p == Proj::kDown;
          const std::string prefix = expert_prefix(layer, e, p, sliced ? r : -1);
          const int64_t t0 = r * i_loc / 16, t1 = (r + 1) * i_loc / 16;
          const int64_t in = down ? i_loc : h, o = down ? h : i_loc;
          out.add(r, prefix + ".trellis", DType::kI16, {in / 16, o / 16, 16 * int64_t{k}},
                  slice_trellis(f, down, t0, t1));
          const auto& hid = down ? f.svh : f.suh;
          const auto mid = slice(down ? f.suh : f.svh, r * i_loc, i_loc);
          const std::string hid_field(hidden_side_field(p)), mid_field(intermediate_side_field(p));
          out.add(r, prefix + "." + mid_field, DType::kF16, {i_loc}, mid);
          if (s.rotation != RotationLayout::kSharedH) {
            out.add(r, prefix + "." + hid_field, DType::kF16, {h}, hid);
          } else if (e == 0) {
            out.add(r, shared_h_name(layer, p, r), DType::kF16, {h}, hid);
          }
          if (s.codebook != trellis::Codebook::k3Inst) {
            const bool mcg = s.codebook == trellis::Codebook::kMcg;
            out.add_marker(r, prefix + (mcg ? ".mcg" : ".mul1"),
                           mcg ? trellis::kMcgMarker : trellis::kMul1Marker);
          }
        }
      }
    }
  }
  const std::set<int> ks(s.expert_bits.begin(), s.expert_bits.end());
  write_file_atomic(dir / "config.json", make_config(s, ks).dump(2) + "\n");
  if (sliced && ks.size() > 1) {
    ojson bitmap = ojson::object();
    for (int layer = s.first_layer; layer <= s.last_layer; ++layer) {
      bitmap[std::to_string(layer)] = {{"k", s.expert_bits}};
    }
    write_file_atomic(dir / "tier_bitmap.json", bitmap.dump(2) + "\n");
  }
  return out.finish();
}

}  // namespace exl3::moe
