// Helpers for the MoE tests: small synthetic checkpoints, edits of their config.json / tier
// bitmap / tensors, and dense fp64 references.
#pragma once

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../format/format_test_util.hpp"
#include "exl3/cpu/linear.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/moe/reference.hpp"
#include "exl3/moe/synthetic.hpp"
#include "test_support.hpp"

namespace exl3::moe::test {

using namespace exl3::test;  // TempDir, make_rng, rel_l2, TensorMap, error_of, ...

// The one MoE layer of small_spec's checkpoints.
constexpr int kLayer = 1;

// H 256, I 256, 4 experts top-2, MoE layer 1 only, K3 MCG.
inline SyntheticMoeSpec small_spec(RotationLayout rotation, int tp) {
  SyntheticMoeSpec s;
  s.rotation = rotation;
  s.tp = tp;
  s.seed = make_rng()();
  return s;
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  return nlohmann::json::parse(read_file(p));
}
inline void write_json(const std::filesystem::path& p, const nlohmann::json& j) {
  write_file(p, j.dump(2));
}
// Applies `edit` to config.json's hybrid_tr3_tail block (or, with whole = true, to config.json).
inline void edit_config(const std::filesystem::path& dir,
                        const std::function<void(nlohmann::json&)>& edit, bool whole = false) {
  auto j = read_json(dir / "config.json");
  edit(whole ? j : j["hybrid_tr3_tail"]);
  write_json(dir / "config.json", j);
}

// Every tensor of one safetensors file, editable and written back.
inline TensorMap read_tensors(const std::filesystem::path& file) {
  TensorMap m;
  const auto store = TensorStore::open(file);
  for (const auto& name : store.names()) {
    const auto& ref = store.at(name);
    const auto b = ref.bytes();
    m[name] = TestTensor{ref.info->dtype, ref.info->shape, {b.begin(), b.end()}};
  }
  return m;
}
inline void edit_tensors(const std::filesystem::path& file,
                         const std::function<void(TensorMap&)>& edit) {
  auto m = read_tensors(file);
  edit(m);
  write_tensors(file, m);
}

inline std::vector<float> random_normal(size_t n, double scale = 1.0) {
  auto rng = make_rng();
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(nd(rng));
  return v;
}

// Dense fp64 SwiGLU MLP from reconstructed (original-basis) weights.
struct DenseMlp {
  int64_t h = 0, i = 0;
  std::vector<float> gate, up, down;  // [H, I], [H, I], [I, H]

  static DenseMlp of(const MlpView& v) {
    return {v.gate.in_features, v.gate.out_features, cpu::reconstruct_weight(v.gate),
            cpu::reconstruct_weight(v.up), cpu::reconstruct_weight(v.down)};
  }
  // y[H] += w * mlp(x[H]) in fp64.
  void accumulate(const float* x, double w, double* y) const {
    std::vector<double> a(static_cast<size_t>(i));
    for (int64_t c = 0; c < i; ++c) {
      double g = 0.0, u = 0.0;
      for (int64_t r = 0; r < h; ++r) {
        g += static_cast<double>(x[r]) * gate[static_cast<size_t>(r * i + c)];
        u += static_cast<double>(x[r]) * up[static_cast<size_t>(r * i + c)];
      }
      a[static_cast<size_t>(c)] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int64_t c = 0; c < h; ++c) {
      double d = 0.0;
      for (int64_t r = 0; r < i; ++r)
        d += a[static_cast<size_t>(r)] * down[static_cast<size_t>(r * h + c)];
      y[c] += w * d;
    }
  }
};

}  // namespace exl3::moe::test
