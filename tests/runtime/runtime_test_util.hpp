// Helpers for the runtime tests: small configs, synthetic checkpoints of every supported
// architecture (experts as EXL3 so MoE layers run through exl3::moe), and an independent fp64
// reference forward pass written as plainly as possible (full sequence, no cache, every weight
// as a dense fp64 matrix; EXL3 linears reconstructed with cpu::reconstruct_weight).
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/cpu/linear.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/format/synthetic_hf.hpp"
#include "exl3/model/rope.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/trellis/codebook.hpp"
#include "exl3/trellis/half.hpp"
#include "test_support.hpp"

namespace exl3::runtime::test {

using exl3::test::error_of;  // (test_support.hpp)

// n random token ids below `vocab`.
inline std::vector<int32_t> random_ids(std::mt19937_64& rng, int n, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i)
    ids.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
  return ids;
}

// Each row's argmax of `got` equals `want`'s wherever want's top-2 margin is clear (ties within
// noise may flip).
inline void expect_same_argmax(const std::vector<float>& got, const std::vector<float>& want,
                               size_t vocab, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t t = 0; t * vocab < want.size(); ++t) {
    std::vector<float> row(want.begin() + static_cast<std::ptrdiff_t>(t * vocab),
                           want.begin() + static_cast<std::ptrdiff_t>((t + 1) * vocab));
    const int best = argmax(row);
    const float top = row[static_cast<size_t>(best)];
    row[static_cast<size_t>(best)] = -INFINITY;
    const float second = row[static_cast<size_t>(argmax(row))];
    if (top - second > 1e-2f * std::max(1.0f, std::abs(top))) {
      EXPECT_EQ(argmax(std::span<const float>(got).subspan(t * vocab, vocab)), best)
          << what << " position " << t;
    }
  }
}

// forward_batch_argmax against the argmax of forward_batch's rows: two sets of sequences get the
// same prompts and then the same mixed batches (a decode token, a multi-token kAll run, a kLast
// run; two rounds, so decode steps repeat shapes), one set through each call. The ids must be
// the scan's own, row for row.
inline void expect_argmax_ids_match_logits(Engine& engine, std::mt19937_64& rng,
                                           const std::string& what) {
  const int64_t vocab = engine.spec().vocab_size;
  std::vector<Engine::SeqId> by_logits, by_ids;
  for (int p : {7, 12, 3}) {
    const auto prompt = random_ids(rng, p, vocab);
    by_logits.push_back(engine.new_sequence());
    by_ids.push_back(engine.new_sequence());
    engine.forward(by_logits.back(), prompt, LogitsMode::kLast);
    engine.forward(by_ids.back(), prompt, LogitsMode::kLast);
  }
  for (int round = 0; round < 2; ++round) {
    const auto a = random_ids(rng, 1, vocab), b = random_ids(rng, 4, vocab),
               c = random_ids(rng, 5, vocab);
    const auto batch = [&](const std::vector<Engine::SeqId>& s) {
      return std::vector<Engine::BatchEntry>{
          {s[0], a, LogitsMode::kLast}, {s[1], b, LogitsMode::kAll}, {s[2], c, LogitsMode::kLast}};
    };
    const auto logits = engine.forward_batch(batch(by_logits));
    const auto ids = engine.forward_batch_argmax(batch(by_ids));
    ASSERT_EQ(ids.size(), logits.size()) << what;
    for (size_t e = 0; e < ids.size(); ++e) {
      const std::span<const float> rows(logits[e]);
      ASSERT_EQ(ids[e].size() * static_cast<size_t>(vocab), rows.size()) << what << " entry " << e;
      for (size_t r = 0; r < ids[e].size(); ++r) {
        EXPECT_EQ(ids[e][r],
                  argmax(rows.subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab))))
            << what << ": round " << round << ", entry " << e << ", row " << r;
      }
    }
  }
  for (size_t i = 0; i < by_ids.size(); ++i) {
    EXPECT_EQ(engine.sequence_length(by_ids[i]), engine.sequence_length(by_logits[i])) << what;
    engine.drop_sequence(by_ids[i]);
    engine.drop_sequence(by_logits[i]);
  }
}

// A new sequence prefilled with the first `prefill` ids, then one id per step (pure decode steps:
// the CUDA engine replays graphs): the logits of every position, concatenated. The sequence ends
// holding all ids and is dropped.
template <typename EngineT>
std::vector<float> prefill_then_decode(EngineT& engine, std::span<const int32_t> ids,
                                       size_t prefill) {
  const auto seq = engine.new_sequence();
  auto out = engine.forward(seq, ids.first(prefill));
  for (size_t t = prefill; t < ids.size(); ++t) {
    const auto row = engine.forward(seq, ids.subspan(t, 1), LogitsMode::kLast);
    out.insert(out.end(), row.begin(), row.end());
  }
  EXPECT_EQ(engine.sequence_length(seq), static_cast<int64_t>(ids.size()));
  engine.drop_sequence(seq);
  return out;
}

inline std::filesystem::path tiny_model(const std::filesystem::path& conformance) {
  return conformance / "models" / "tiny-qwen3moe-exl3";
}

// ModelConfig from a JSON object, labelled "m/config.json".
inline ModelConfig config_of(const nlohmann::json& j) {
  return parse_model_config(j.dump(), "m/config.json");
}

// A small valid config of each architecture.
inline nlohmann::json base_config(const std::string& arch) {
  nlohmann::json c = {
      {"architectures", {arch}}, {"hidden_size", 256},       {"intermediate_size", 512},
      {"num_hidden_layers", 4},  {"num_attention_heads", 4}, {"num_key_value_heads", 2},
      {"head_dim", 64},          {"vocab_size", 512},        {"rms_norm_eps", 1e-6},
      {"rope_theta", 10000.0},   {"hidden_act", "silu"},     {"max_position_embeddings", 4096},
      {"eos_token_id", 2}};
  if (arch == "Qwen3MoeForCausalLM") {
    c["num_experts"] = 8;
    c["num_experts_per_tok"] = 2;
    c["moe_intermediate_size"] = 128;
    c["norm_topk_prob"] = true;
  }
  if (arch == "Glm4MoeForCausalLM") {
    c["n_routed_experts"] = 8;
    c["num_experts_per_tok"] = 2;
    c["moe_intermediate_size"] = 128;
    c["n_shared_experts"] = 1;
    c["first_k_dense_replace"] = 1;
    c["n_group"] = 2;
    c["topk_group"] = 1;
    c["routed_scaling_factor"] = 2.5;
    c["partial_rotary_factor"] = 0.5;
    c["use_qk_norm"] = false;
  }
  return c;
}

// Rewrites a synthetic HF model folder so every routed expert projection (or those `which`
// accepts, by prefix) is a random EXL3 linear (K = 4, MUL1), optionally patching config.json;
// other tensors stay unquantized as written.
inline void exl3_experts(const std::filesystem::path& dir, uint64_t seed,
                         const nlohmann::json& config_patch = nlohmann::json::object(),
                         const std::function<bool(const std::string&)>& which = {}) {
  const auto store = TensorStore::open(dir);
  SafetensorsWriter w;
  std::mt19937_64 rng(seed);
  auto half_vec = [&](int64_t n, double mag) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    std::uniform_real_distribution<double> u(0.5, 1.5);
    for (auto& x : v)
      x = trellis::float_to_half(static_cast<float>((rng() & 1 ? 1 : -1) * mag * u(rng)));
    return v;
  };
  for (const auto& name : store.names()) {
    const TensorRef& ref = store.at(name);
    const std::string prefix = name.substr(0, name.size() - std::min<size_t>(name.size(), 7));
    const bool expert = name.find(".mlp.experts.") != std::string::npos ||
                        name.find(".block_sparse_moe.experts.") != std::string::npos;
    if (expert && name.ends_with(".weight") && (!which || which(prefix))) {
      const int64_t out = ref.info->shape[0], in = ref.info->shape[1];
      const int k = 4;
      std::vector<uint16_t> tr(static_cast<size_t>(in / 16 * out / 16 * 16 * k));
      for (auto& x : tr) x = static_cast<uint16_t>(rng());
      w.add(prefix + ".trellis", DType::kI16, {in / 16, out / 16, 16 * k},
            std::span<const uint16_t>(tr));
      const auto suh = half_vec(in, 0.05), svh = half_vec(out, 1.0);
      w.add(prefix + ".suh", DType::kF16, {in}, std::span<const uint16_t>(suh));
      w.add(prefix + ".svh", DType::kF16, {out}, std::span<const uint16_t>(svh));
      const int32_t marker = trellis::kMul1Marker;
      w.add(prefix + ".mul1", DType::kI32, {}, std::span<const int32_t>(&marker, 1));
      continue;
    }
    const auto bytes = ref.bytes();
    w.add(name, ref.info->dtype, ref.info->shape, bytes);
  }
  const std::string blob = w.serialize();
  std::filesystem::remove(dir / "model.safetensors");
  write_file_atomic(dir / "model.safetensors", std::string_view(blob));
  auto cfg = nlohmann::json::parse(read_text_file(dir / "config.json"));
  cfg.merge_patch(config_patch);
  write_file_atomic(dir / "config.json", cfg.dump(2));
}

// A copy of the transformers reference checkpoint `name` (tests/model/data) in tmp / `as` (default
// `name`) with random EXL3 experts, for the CUDA engine, which runs quantized experts only;
// attention and dense MLPs stay unquantized.
inline std::filesystem::path with_exl3_experts(
    const exl3::test::TempDir& tmp, const std::string& name,
    const nlohmann::json& config_patch = nlohmann::json::object(), const std::string& as = "") {
  const auto src = exl3::test::model_data_dir() / name, dir = tmp / (as.empty() ? name : as);
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(src / f, dir / f);
  exl3_experts(dir, 23, config_patch);
  return dir;
}

// The transformers gpt_oss reference checkpoint (tests/model/data/gpt_oss: hidden 128, 128 expert
// channels) cut to its first `hidden` hidden and `inter` expert channels, written to dir (fp32):
// released gpt-oss models have 2880 of each, which EXL3 linears pad to 2944, and a cut below 128
// makes the tiny model padded the same way when it is converted. gate_up_proj interleaves gate
// and up channels, so its first 2 * inter columns are channels 0 .. inter - 1 of both.
inline void write_gpt_oss_cut(const std::filesystem::path& dir, int64_t hidden, int64_t inter) {
  const auto src = exl3::test::model_data_dir() / "gpt_oss";
  const auto store = TensorStore::open(src / "model.safetensors");
  // Keeps the first n entries along `axis` of a row-major tensor.
  const auto cut = [](std::vector<float>& v, std::vector<int64_t>& shape, size_t axis, int64_t n) {
    int64_t outer = 1, inner = 1;
    for (size_t i = 0; i < axis; ++i) outer *= shape[i];
    for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
    std::vector<float> out;
    for (int64_t o = 0; o < outer; ++o) {
      const auto first = v.begin() + o * shape[axis] * inner;
      out.insert(out.end(), first, first + n * inner);
    }
    v = std::move(out);
    shape[axis] = n;
  };
  // Per tensor-name suffix: the axes that are hidden channels ('h'), expert channels ('i') or
  // interleaved gate/up expert channels ('g').
  const std::pair<const char*, const char*> axes[] = {{"embed_tokens.weight", ".h"},
                                                      {"lm_head.weight", ".h"},
                                                      {"layernorm.weight", "h"},
                                                      {"model.norm.weight", "h"},
                                                      {"q_proj.weight", ".h"},
                                                      {"k_proj.weight", ".h"},
                                                      {"v_proj.weight", ".h"},
                                                      {"o_proj.weight", "h."},
                                                      {"o_proj.bias", "h"},
                                                      {"router.weight", ".h"},
                                                      {"experts.gate_up_proj", ".hg"},
                                                      {"experts.gate_up_proj_bias", ".g"},
                                                      {"experts.down_proj", ".ih"},
                                                      {"experts.down_proj_bias", ".h"}};
  SafetensorsWriter w;
  for (const auto& n : store.names()) {
    std::vector<float> v = read_as_float(store.at(n));
    std::vector<int64_t> shape = store.at(n).info->shape;
    for (const auto& [suffix, kinds] : axes) {
      if (!n.ends_with(suffix)) continue;
      for (size_t a = 0; kinds[a] != '\0'; ++a) {
        if (kinds[a] == 'h') cut(v, shape, a, hidden);
        if (kinds[a] == 'i') cut(v, shape, a, inter);
        if (kinds[a] == 'g') cut(v, shape, a, 2 * inter);
      }
    }
    w.add<float>(n, DType::kF32, shape, v);
  }
  std::filesystem::create_directories(dir);
  w.write(dir / "model.safetensors");
  auto cfg = nlohmann::json::parse(exl3::test::read_file(src / "config.json"));
  cfg["hidden_size"] = hidden;
  cfg["intermediate_size"] = inter;
  exl3::test::write_file(dir / "config.json", cfg.dump(2));
}

// Writes a synthetic model of `arch` into dir (MoE experts as EXL3 unless `plain_experts`).
inline void write_model(const std::filesystem::path& dir, HfArch arch, uint64_t seed,
                        const nlohmann::json& config_patch = nlohmann::json::object(),
                        bool tie = false, bool plain_experts = false) {
  SyntheticHfSpec s;
  s.arch = arch;
  s.seed = seed;
  s.init_std = 0.05;
  s.num_layers = 2;
  s.tie_word_embeddings = tie;
  if (arch == HfArch::kGlm4Moe) s.num_layers = 3;  // one dense + two MoE layers
  write_synthetic_hf_model(dir, s);
  exl3_experts(dir, seed + 100, config_patch,
               plain_experts ? [](const std::string&) { return false; }
                             : std::function<bool(const std::string&)>{});
}

// ---- the fp64 reference forward ----------------------------------------------------------------

class ReferenceModel {
 public:
  explicit ReferenceModel(const std::filesystem::path& dir)
      : ckpt_(Checkpoint::open(dir)), spec_(describe_model(ckpt_)) {}

  const ModelSpec& spec() const { return spec_; }

  // Called with every linear's input x[rows, cols] (fp64) as the forward applies it, named by
  // the linear's prefix (routed experts see one token row at a time). Calibration tests use it
  // for an independent X^T X.
  std::function<void(const std::string& linear, int64_t rows, int64_t cols,
                     const std::vector<double>& x)>
      tap;

  // logits [n, vocab] of one full pass.
  std::vector<double> forward(const std::vector<int32_t>& tokens) const {
    const auto n = static_cast<int64_t>(tokens.size());
    const int64_t hs = spec_.hidden_size;
    Mat x(n, hs);
    const auto emb = dense(spec_.embed_tokens);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < hs; ++c) x.at(t, c) = emb.at(tokens[static_cast<size_t>(t)], c);
    for (const auto& layer : spec_.layers) {
      auto h = norm(x, vec(layer.input_norm));
      x = add(x, attention(std::get<GqaAttentionSpec>(layer.attention), h));
      h = norm(x, vec(layer.post_attention_norm));
      if (const auto* d = std::get_if<DenseMlpSpec>(&layer.mlp)) {
        x = add(x, mlp(d->prefix, h));
      } else {
        x = add(x, moe(std::get<MoeSpec>(layer.mlp), h));
      }
    }
    const auto h = norm(x, vec(spec_.final_norm));
    const auto head = spec_.lm_head_tied ? dense(spec_.embed_tokens) : linear(spec_.lm_head).w;
    std::vector<double> logits(static_cast<size_t>(n * spec_.vocab_size));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t v = 0; v < spec_.vocab_size; ++v) {
        double s = 0;
        for (int64_t c = 0; c < hs; ++c) s += h.at(t, c) * head.at(v, c);
        logits[static_cast<size_t>(t * spec_.vocab_size + v)] = s;
      }
    return logits;
  }

 private:
  struct Mat {
    int64_t r = 0, c = 0;
    std::vector<double> d;
    Mat() = default;
    Mat(int64_t rows, int64_t cols) : r(rows), c(cols), d(static_cast<size_t>(rows * cols)) {}
    double& at(int64_t i, int64_t j) { return d[static_cast<size_t>(i * c + j)]; }
    double at(int64_t i, int64_t j) const { return d[static_cast<size_t>(i * c + j)]; }
  };
  struct Lin {
    Mat w;  // [out, in]
    std::vector<double> b;
    std::string name;  // prefix (empty for the router)
  };

  Mat dense(const std::string& name) const {
    const auto& ref = ckpt_.store().at(name);
    Mat m(ref.info->shape[0], ref.info->shape[1]);
    m.d = read_as_double(ref);
    return m;
  }
  std::vector<double> vec(const std::string& name) const {
    return read_as_double(ckpt_.store().at(name));
  }

  Lin linear(const std::string& prefix) const {
    Lin l;
    l.name = prefix;
    if (ckpt_.find_linear(prefix) != nullptr) {
      const auto data = Exl3LinearData::load(ckpt_, prefix);
      const auto view = cpu::LinearView::of(data);
      const auto w = cpu::reconstruct_weight(view);  // [in, out]
      l.w = Mat(view.out_features, view.in_features);
      for (int64_t i = 0; i < view.in_features; ++i)
        for (int64_t o = 0; o < view.out_features; ++o)
          l.w.at(o, i) = w[static_cast<size_t>(i * view.out_features + o)];
      for (const float b : data.bias()) l.b.push_back(b);
    } else {
      l.w = dense(prefix + ".weight");
      if (ckpt_.store().contains(prefix + ".bias")) l.b = vec(prefix + ".bias");
    }
    return l;
  }

  Mat apply(const Lin& l, const Mat& x) const {
    if (tap && !l.name.empty()) tap(l.name, x.r, x.c, x.d);
    Mat y(x.r, l.w.r);
    for (int64_t t = 0; t < x.r; ++t)
      for (int64_t o = 0; o < l.w.r; ++o) {
        double s = l.b.empty() ? 0.0 : l.b[static_cast<size_t>(o)];
        for (int64_t i = 0; i < x.c; ++i) s += x.at(t, i) * l.w.at(o, i);
        y.at(t, o) = s;
      }
    return y;
  }
  static Mat add(Mat a, const Mat& b) {
    for (size_t i = 0; i < a.d.size(); ++i) a.d[i] += b.d[i];
    return a;
  }
  // RMSNorm over consecutive groups of w.size() values.
  Mat norm(Mat x, const std::vector<double>& w) const {
    const size_t n = w.size();
    for (size_t g = 0; g < x.d.size() / n; ++g) {
      double ss = 0;
      for (size_t i = 0; i < n; ++i) ss += x.d[g * n + i] * x.d[g * n + i];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + spec_.rms_norm_eps);
      for (size_t i = 0; i < n; ++i) x.d[g * n + i] = x.d[g * n + i] * inv * w[i];
    }
    return x;
  }

  Mat attention(const GqaAttentionSpec& a, const Mat& h) const {
    const int64_t n = h.r, nh = a.num_heads, nkv = a.num_kv_heads, hd = a.head_dim;
    Mat q = apply(linear(a.prefix + ".q_proj"), h), k = apply(linear(a.prefix + ".k_proj"), h),
        v = apply(linear(a.prefix + ".v_proj"), h);
    if (a.qk_norm != model::QkNorm::kNone) {  // per head or across heads: the weight's length says
      q = norm(q, vec(a.prefix + ".q_norm.weight"));
      k = norm(k, vec(a.prefix + ".k_norm.weight"));
    }
    const auto inv = rope_inv_freq(a.rope);
    const int64_t half = a.rope.half();
    const double scale = a.rope.type == RopeType::kYarn ? a.rope.attention_factor : 1.0;
    auto rope = [&](Mat& m, int64_t heads) {
      for (int64_t t = 0; t < n; ++t)
        for (int64_t hh = 0; hh < heads; ++hh) {
          double* p = &m.at(t, hh * hd);
          for (int64_t i = 0; i < half; ++i) {
            const double ang = static_cast<double>(t) * inv[static_cast<size_t>(i)];
            const double c = std::cos(ang) * scale, s = std::sin(ang) * scale;
            const double x1 = p[i], x2 = p[i + half];
            p[i] = x1 * c - x2 * s;
            p[i + half] = x2 * c + x1 * s;
          }
        }
    };
    rope(q, nh);
    rope(k, nkv);
    Mat o(n, nh * hd);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t hh = 0; hh < nh; ++hh) {
        const int64_t g = hh / (nh / nkv);  // repeat_kv
        std::vector<double> s(static_cast<size_t>(t + 1));
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t c = 0; c < hd; ++c) d += q.at(t, hh * hd + c) * k.at(j, g * hd + c);
          s[static_cast<size_t>(j)] = d / std::sqrt(static_cast<double>(hd));
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t c = 0; c < hd; ++c)
            o.at(t, hh * hd + c) += s[static_cast<size_t>(j)] / sum * v.at(j, g * hd + c);
      }
    return apply(linear(a.prefix + ".o_proj"), o);
  }

  Mat mlp(const std::string& prefix, const Mat& h) const {
    Mat g = apply(linear(prefix + ".gate_proj"), h);
    const Mat u = apply(linear(prefix + ".up_proj"), h);
    for (size_t i = 0; i < g.d.size(); ++i) g.d[i] = g.d[i] / (1.0 + std::exp(-g.d[i])) * u.d[i];
    return apply(linear(prefix + ".down_proj"), g);
  }

  Mat moe(const MoeSpec& m, const Mat& h) const {
    const Lin router{dense(m.prefix + ".gate.weight"), {}, ""};
    const Mat logits = apply(router, h);
    std::vector<double> bias(static_cast<size_t>(m.num_experts), 0.0);
    if (m.correction_bias) bias = vec(m.prefix + ".gate.e_score_correction_bias");
    Mat out(h.r, h.c);
    for (int64_t t = 0; t < h.r; ++t) {
      std::vector<double> p(static_cast<size_t>(m.num_experts)), choice(p.size());
      std::vector<bool> eligible(p.size(), true);
      if (m.router == RouterKind::kSoftmax) {
        double mx = -1e300, sum = 0;
        for (int64_t e = 0; e < m.num_experts; ++e) mx = std::max(mx, logits.at(t, e));
        for (int64_t e = 0; e < m.num_experts; ++e)
          sum += p[static_cast<size_t>(e)] = std::exp(logits.at(t, e) - mx);
        for (auto& e : p) e /= sum;
        choice = p;
      } else {
        for (int64_t e = 0; e < m.num_experts; ++e) {
          p[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-logits.at(t, e)));
          choice[static_cast<size_t>(e)] = p[static_cast<size_t>(e)] + bias[static_cast<size_t>(e)];
        }
        // Groups: score = sum of the top-2 choice values; keep the topk_group best.
        const int64_t per = m.num_experts / m.n_group;
        std::vector<std::pair<double, int>> gs;
        for (int g = 0; g < m.n_group; ++g) {
          std::vector<double> c(choice.begin() + g * per, choice.begin() + (g + 1) * per);
          std::sort(c.rbegin(), c.rend());
          gs.push_back({-(c[0] + (per > 1 ? c[1] : 0.0)), g});
        }
        std::sort(gs.begin(), gs.end());
        std::fill(eligible.begin(), eligible.end(), false);
        for (int i = 0; i < m.topk_group; ++i)
          for (int64_t e = 0; e < per; ++e)
            eligible[static_cast<size_t>(gs[static_cast<size_t>(i)].second * per + e)] = true;
      }
      std::vector<int> order;
      for (int e = 0; e < m.num_experts; ++e)
        if (eligible[static_cast<size_t>(e)]) order.push_back(e);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return choice[static_cast<size_t>(a)] > choice[static_cast<size_t>(b)];
      });
      order.resize(static_cast<size_t>(m.top_k));
      double wsum = 0;
      for (const int e : order) wsum += p[static_cast<size_t>(e)];
      Mat row(1, h.c);
      for (int64_t c = 0; c < h.c; ++c) row.at(0, c) = h.at(t, c);
      for (const int e : order) {
        double wt = p[static_cast<size_t>(e)];
        if (m.renormalize) wt /= (m.router == RouterKind::kSoftmax ? wsum : wsum + 1e-20);
        if (m.router == RouterKind::kSigmoidGrouped) wt *= m.routed_scaling_factor;
        const Mat y = mlp(fmt::format("{}.experts.{}", m.prefix, e), row);
        for (int64_t c = 0; c < h.c; ++c) out.at(t, c) += wt * y.at(0, c);
      }
    }
    if (m.shared) out = add(out, mlp(m.shared->prefix, h));
    return out;
  }

  Checkpoint ckpt_;
  ModelSpec spec_;
};

inline double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace exl3::runtime::test
