// The MXFP8 overlay in the runtime: policy parsing (CLI spec and JSON config) with every error,
// ignore matching, the per-linear plan (eligibility, lm_head, width fallback, fused groups that
// fail closed), and the engine: overlaid logits equal an unoverlaid engine over the dequantized
// weights (the overlay computes x @ dq(W)^T), a checkpoint storing MXFP8 loads to the same
// result, and the KL divergence against the BF16 model is small (printed).
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/mxfp8/weight.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/overlay.hpp"
#include "runtime_test_util.hpp"
#include "test_support.hpp"

namespace exl3::runtime {
namespace {

using ::testing::HasSubstr;

void expect_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    FAIL() << "expected an error containing '" << what << "'";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr(what));
  }
}

TEST(OverlayPolicy, ParsesTheCliSpec) {
  auto p = parse_overlay_spec("linear=mxfp8,shared_experts=mxfp8");
  EXPECT_TRUE(p.linear && p.shared_experts);
  p = parse_overlay_spec("shared_experts=mxfp8");
  EXPECT_TRUE(!p.linear && p.shared_experts);
  p = parse_overlay_spec("linear=mxfp8,shared_experts=bf16");
  EXPECT_TRUE(p.linear && !p.shared_experts);
  EXPECT_FALSE(parse_overlay_spec("none").any());
  EXPECT_FALSE(parse_overlay_spec("").any());
  expect_error([] { parse_overlay_spec("linear"); }, "item 'linear' is not KEY=FORMAT");
  expect_error([] { parse_overlay_spec("experts=mxfp8"); }, "key 'experts' is unknown");
  expect_error([] { parse_overlay_spec("linear=mxfp8,linear=mxfp8"); }, "key 'linear' is given twice");
  expect_error([] { parse_overlay_spec("linear=nvfp4"); }, "'linear' = 'nvfp4' is not a weight format");
  expect_error([] { parse_overlay_spec("linear=mxfp8,"); }, "item '' is not KEY=FORMAT");
}

TEST(OverlayPolicy, ParsesTheJsonConfig) {
  auto p = parse_overlay_config(nlohmann::json::parse(R"({"linear": {"weight": "mxfp8"},
      "shared_experts": {"weight": "mxfp8"}, "ignore": ["lm_head", "re:.*\\.q_a_proj$", "kv_a_proj_with_mqa"]})"),
                                "c.json");
  EXPECT_TRUE(p.linear && p.shared_experts);
  ASSERT_EQ(p.ignore.size(), 3u);
  EXPECT_TRUE(p.ignored("lm_head"));
  EXPECT_TRUE(p.ignored("model.layers.3.self_attn.q_a_proj"));
  EXPECT_FALSE(p.ignored("model.layers.3.self_attn.q_a_proj.x"));
  EXPECT_TRUE(p.ignored("model.layers.0.self_attn.kv_a_proj_with_mqa"));
  EXPECT_FALSE(p.ignored("model.layers.0.self_attn.kv_b_proj"));
  EXPECT_FALSE(p.ignored("model.lm_head_x"));
  auto bad = [](const char* text) { return [text] { parse_overlay_config(nlohmann::json::parse(text), "c.json"); }; };
  expect_error(bad(R"([1])"), "c.json: the overlay config must be a JSON object");
  expect_error(bad(R"({"linear": "mxfp8"})"), "'linear' must be an object");
  expect_error(bad(R"({"linear": {"weight": "mxfp8", "activation": "fp8"}})"), "'linear.activation' is not supported");
  expect_error(bad(R"({"linear": {}})"), "'linear' has no \"weight\" format");
  expect_error(bad(R"({"linear": {"weight": 8}})"), "'linear.weight' must be a string");
  expect_error(bad(R"({"linear": {"weight": "int4"}})"), "'linear.weight' = 'int4' is not a weight format");
  expect_error(bad(R"({"experts": {"weight": "mxfp8"}})"), "key 'experts' is unknown");
  expect_error(bad(R"({"ignore": "lm_head"})"), "'ignore' must be an array of strings");
  expect_error(bad(R"({"ignore": [3]})"), "'ignore' holds 3, not a string");
  expect_error(bad(R"({"ignore": ["re:("]})"), "ignore entry 're:(' is not a valid regular expression");
  expect_error(bad(R"({"ignore": [""]})"), "empty ignore entry");
  exl3::test::TempDir dir;
  exl3::test::write_file(dir / "o.json", "{not json");
  expect_error([&] { load_overlay_config(dir / "o.json"); }, "o.json: not valid JSON");
  exl3::test::write_file(dir / "o.json", R"({"shared_experts": {"weight": "mxfp8"}})");
  EXPECT_TRUE(load_overlay_config(dir / "o.json").shared_experts);
}

// A GLM-4.5-style model: layer 0 dense, layers 1-2 MoE with EXL3 routed experts and a BF16
// shared expert; attention and lm_head BF16.
struct GlmModel {
  exl3::test::TempDir dir;
  GlmModel(uint64_t seed, nlohmann::json patch = nlohmann::json::object()) {
    test::write_model(dir.path(), HfArch::kGlm4Moe, seed, patch);
  }
};

TEST(OverlayPlan, FollowsTheEligibilityRules) {
  GlmModel m(exl3::test::test_seed());
  const auto ckpt = Checkpoint::open(m.dir.path());
  const auto spec = describe_model(ckpt);
  OverlayPolicy linear_only = parse_overlay_spec("linear=mxfp8");
  auto plan = OverlayPlan::build(linear_only, ckpt, spec);
  EXPECT_TRUE(plan.converts("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(plan.converts("model.layers.2.self_attn.o_proj"));
  EXPECT_TRUE(plan.converts("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(plan.converts("model.layers.1.mlp.shared_experts.up_proj"));
  EXPECT_EQ(plan.decision("model.layers.1.mlp.shared_experts.up_proj").reason, "shared_experts off");
  EXPECT_EQ(plan.decision("lm_head").reason, "lm_head is never overlaid");
  EXPECT_FALSE(plan.converts("model.layers.1.mlp.experts.0.up_proj"));  // routed experts: not planned

  auto shared_only = parse_overlay_spec("shared_experts=mxfp8");
  plan = OverlayPlan::build(shared_only, ckpt, spec);
  EXPECT_FALSE(plan.converts("model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(plan.converts("model.layers.0.mlp.gate_proj"));  // dense MLP is `linear`, not shared
  EXPECT_TRUE(plan.converts("model.layers.2.mlp.shared_experts.gate_proj"));

  auto both = parse_overlay_spec("linear=mxfp8,shared_experts=mxfp8");
  both.ignore = {"re:model\\.layers\\.0\\.self_attn\\.[qkv]_proj", "o_proj"};
  plan = OverlayPlan::build(both, ckpt, spec);
  EXPECT_EQ(plan.decision("model.layers.0.self_attn.k_proj").reason, "ignored");
  EXPECT_EQ(plan.decision("model.layers.1.self_attn.o_proj").reason, "ignored");
  EXPECT_TRUE(plan.converts("model.layers.1.self_attn.k_proj"));

  both.ignore = {"model.layers.0.self_attn.k_proj"};  // one shard of the fused q/k/v group
  expect_error([&] { OverlayPlan::build(both, ckpt, spec); },
               "the fused shards of 'model.layers.0.self_attn' disagree under the MXFP8 overlay");
  both.ignore = {"model.layers.1.mlp.shared_experts.up_proj"};
  expect_error([&] { OverlayPlan::build(both, ckpt, spec); },
               "'model.layers.1.mlp.shared_experts' disagree");
  both.ignore = {"re:["};
  expect_error([&] { OverlayPlan::build(both, ckpt, spec); }, "not a valid regular expression");
}

TEST(OverlayPlan, NarrowInputsStayUnquantized) {
  // head_dim 36: o_proj's input is 4 * 36 = 144, not a multiple of 32.
  exl3::test::TempDir dir;
  SyntheticHfSpec s;
  s.arch = HfArch::kQwen3;
  s.head_dim = 36;
  s.num_layers = 1;
  s.seed = exl3::test::test_seed();
  write_synthetic_hf_model(dir.path(), s);
  const auto ckpt = Checkpoint::open(dir.path());
  const auto plan = OverlayPlan::build(parse_overlay_spec("linear=mxfp8"), ckpt, describe_model(ckpt));
  EXPECT_TRUE(plan.converts("model.layers.0.self_attn.q_proj"));
  EXPECT_EQ(plan.decision("model.layers.0.self_attn.o_proj").reason, "input width 144 is not a multiple of 32");
  EngineOptions o;
  o.overlay = parse_overlay_spec("linear=mxfp8");
  auto engine = load_engine(ckpt, o);
  const auto r = engine->overlay_report();
  bool kept = false;
  for (const auto& [name, why] : r.kept_unquantized) kept |= name == "model.layers.0.self_attn.o_proj";
  EXPECT_TRUE(kept);
}

// A copy of `src` whose tensors named in `replace` are rewritten by `fn(name, ref, writer)`.
void rewrite(const std::filesystem::path& src, const std::filesystem::path& dst,
             const std::function<bool(const std::string&, const TensorRef&, SafetensorsWriter&)>& fn) {
  std::filesystem::create_directories(dst);
  for (const auto& e : std::filesystem::directory_iterator(src)) {
    if (e.path().extension() != ".safetensors") std::filesystem::copy_file(e.path(), dst / e.path().filename());
  }
  const auto store = TensorStore::open(src);
  SafetensorsWriter w;
  for (const auto& name : store.names()) {
    const TensorRef& ref = store.at(name);
    if (!fn(name, ref, w)) w.add(name, ref.info->dtype, ref.info->shape, ref.bytes());
  }
  w.write(dst / "model.safetensors");
}

double mean_kl(const std::vector<float>& p_logits, const std::vector<float>& q_logits, int64_t vocab) {
  const auto rows = static_cast<int64_t>(p_logits.size()) / vocab;
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    auto logsm = [&](const std::vector<float>& l) {
      std::vector<double> out(static_cast<size_t>(vocab));
      double mx = -1e300, s = 0;
      for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(l[static_cast<size_t>(r * vocab + i)]));
      for (int64_t i = 0; i < vocab; ++i) s += std::exp(l[static_cast<size_t>(r * vocab + i)] - mx);
      for (int64_t i = 0; i < vocab; ++i) out[static_cast<size_t>(i)] = l[static_cast<size_t>(r * vocab + i)] - mx - std::log(s);
      return out;
    };
    const auto lp = logsm(p_logits), lq = logsm(q_logits);
    for (int64_t i = 0; i < vocab; ++i) total += std::exp(lp[static_cast<size_t>(i)]) * (lp[static_cast<size_t>(i)] - lq[static_cast<size_t>(i)]);
  }
  return total / static_cast<double>(rows);
}

TEST(OverlayEngine, ComputesWithTheDequantizedWeightsAndStaysCloseToBf16) {
  GlmModel m(exl3::test::test_seed());
  const auto ckpt = Checkpoint::open(m.dir.path());
  EngineOptions o;
  o.overlay = parse_overlay_spec("linear=mxfp8,shared_experts=mxfp8");
  auto overlaid = load_engine(ckpt, o);
  auto base = load_engine(ckpt);
  const auto report = overlaid->overlay_report();
  // 3 layers x 4 attention + 3 dense MLP + 2 x 3 shared expert projections.
  ASSERT_EQ(report.layers.size(), 12u + 3u + 6u);
  size_t src = 0, mx = 0;
  for (const auto& l : report.layers) {
    EXPECT_FALSE(l.from_checkpoint);
    EXPECT_EQ(l.source, DType::kBF16);
    EXPECT_EQ(l.mxfp8_bytes, static_cast<size_t>(l.out * l.in + l.out * l.in / 32));
    EXPECT_EQ(l.source_bytes, static_cast<size_t>(l.out * l.in * 2));
    EXPECT_GT(l.rel_l2, 0.005) << l.name;  // E4M3 keeps 3 mantissa bits
    EXPECT_LT(l.rel_l2, 0.05) << l.name;
    src += l.source_bytes;
    mx += l.mxfp8_bytes;
  }
  EXPECT_EQ(report.saved_bytes(), src - mx);
  EXPECT_EQ(report.to_json()["saved_bytes"].get<size_t>(), src - mx);
  ASSERT_EQ(report.kept_unquantized.size(), 1u);
  EXPECT_EQ(report.kept_unquantized[0].first, "lm_head");
  EXPECT_TRUE(base->overlay_report().layers.empty());

  // The same model with every overlaid weight replaced by its dequantized F32 matrix.
  exl3::test::TempDir dq_dir;
  std::set<std::string> names;
  for (const auto& l : report.layers) names.insert(l.name + ".weight");
  rewrite(m.dir.path(), dq_dir.path(), [&](const std::string& name, const TensorRef& ref, SafetensorsWriter& w) {
    if (!names.contains(name)) return false;
    const auto q = mxfp8::Weight::quantize(name, ref.bytes().data(), ref.info->dtype, ref.info->shape[0], ref.info->shape[1]);
    const auto dq = q.dequantize();
    w.add(name, DType::kF32, ref.info->shape, std::span<const float>(dq));
    return true;
  });
  auto dq_engine = load_engine(dq_dir.path());

  auto rng = exl3::test::make_rng();
  std::vector<int32_t> ids(12);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 500) + 3;
  const auto lo = forward_logits(*overlaid, ids);
  const auto lb = forward_logits(*base, ids);
  const auto ld = forward_logits(*dq_engine, ids);
  EXPECT_EQ(lo, ld);  // same fp32 arithmetic on the same weight values
  const int64_t vocab = overlaid->spec().vocab_size;
  const double kl = mean_kl(lb, lo, vocab);
  const double rel = exl3::test::rel_l2(lo, lb);
  std::printf("MXFP8 overlay (linear + shared_experts) on a synthetic GLM-4.5-style model: KL(bf16 || mxfp8) "
              "%.3e nats/token, logits rel-L2 %.3e, %zu -> %zu bytes\n",
              kl, rel, src, mx);
  RecordProperty("kl_bf16_vs_mxfp8", fmt::format("{:.3e}", kl));
  // Noise weights (std 0.05, no structure) amplify the per-layer ~2.5% error through the residual
  // stream more than trained weights do: bounds for this model, not a quality claim.
  EXPECT_GT(kl, 0.0);
  EXPECT_LT(kl, 0.1);
  EXPECT_LT(rel, 0.5);
}

TEST(OverlayEngine, LoadsMxfp8StoredInTheCheckpoint) {
  GlmModel m(exl3::test::test_seed());
  EngineOptions o;
  o.overlay = parse_overlay_spec("linear=mxfp8,shared_experts=mxfp8");
  auto overlaid = load_engine(m.dir.path(), o);
  std::set<std::string> names;
  for (const auto& l : overlaid->overlay_report().layers) names.insert(l.name + ".weight");
  exl3::test::TempDir st_dir;
  rewrite(m.dir.path(), st_dir.path(), [&](const std::string& name, const TensorRef& ref, SafetensorsWriter& w) {
    if (!names.contains(name)) return false;
    const auto q = mxfp8::Weight::quantize(name, ref.bytes().data(), ref.info->dtype, ref.info->shape[0], ref.info->shape[1]);
    w.add(name, DType::kF8E4M3, ref.info->shape, std::span<const uint8_t>(q.values(), static_cast<size_t>(q.rows() * q.cols())));
    const std::string prefix = name.substr(0, name.size() - 7);
    w.add(prefix + ".weight_scale", DType::kU8, {q.rows(), q.blocks_per_row()},
          std::span<const uint8_t>(q.scales(), static_cast<size_t>(q.rows() * q.blocks_per_row())));
    return true;
  });
  auto stored = load_engine(st_dir.path());  // no policy: the checkpoint's MXFP8 is loaded as such
  const auto r = stored->overlay_report();
  ASSERT_EQ(r.layers.size(), names.size());
  for (const auto& l : r.layers) EXPECT_TRUE(l.from_checkpoint);
  std::vector<int32_t> ids = {5, 17, 99, 3, 250, 42};
  EXPECT_EQ(forward_logits(*stored, ids), forward_logits(*overlaid, ids));
  // A policy over a checkpoint that already stores MXFP8 keeps it (nothing is converted twice).
  auto both = load_engine(st_dir.path(), o);
  EXPECT_EQ(forward_logits(*both, ids), forward_logits(*overlaid, ids));

  // Only q_proj of layer 0 stored as MXFP8: with the policy, k/v are converted and the fused group
  // agrees; ignoring k_proj then leaves one shard BF16 and fails closed.
  exl3::test::TempDir one_dir;
  const std::string q0 = "model.layers.0.self_attn.q_proj";
  rewrite(m.dir.path(), one_dir.path(), [&](const std::string& name, const TensorRef& ref, SafetensorsWriter& w) {
    if (name != q0 + ".weight") return false;
    const auto q = mxfp8::Weight::quantize(name, ref.bytes().data(), ref.info->dtype, ref.info->shape[0], ref.info->shape[1]);
    w.add(name, DType::kF8E4M3, ref.info->shape, std::span<const uint8_t>(q.values(), static_cast<size_t>(q.rows() * q.cols())));
    w.add(q0 + ".weight_scale", DType::kU8, {q.rows(), q.blocks_per_row()},
          std::span<const uint8_t>(q.scales(), static_cast<size_t>(q.rows() * q.blocks_per_row())));
    return true;
  });
  auto one = load_engine(one_dir.path(), o);
  EXPECT_EQ(forward_logits(*one, ids), forward_logits(*overlaid, ids));
  EngineOptions ig = o;
  ig.overlay.ignore = {"model.layers.0.self_attn.k_proj"};
  expect_error([&] { load_engine(one_dir.path(), ig); }, "q_proj (MXFP8 (stored), kept: mxfp8 (checkpoint))");
}

TEST(OverlayEngine, FusedGroupsMixingExl3AndBf16FailClosed) {
  GlmModel m(exl3::test::test_seed());
  exl3::test::TempDir mixed;
  auto rng = exl3::test::make_rng();
  rewrite(m.dir.path(), mixed.path(), [&](const std::string& name, const TensorRef& ref, SafetensorsWriter& w) {
    if (name != "model.layers.0.self_attn.k_proj.weight") return false;
    const std::string prefix = "model.layers.0.self_attn.k_proj";
    const int64_t out = ref.info->shape[0], in = ref.info->shape[1];
    std::vector<uint16_t> tr(static_cast<size_t>(in / 16 * out / 16 * 16 * 4));
    for (auto& x : tr) x = static_cast<uint16_t>(rng());
    w.add(prefix + ".trellis", DType::kI16, {in / 16, out / 16, 64}, std::span<const uint16_t>(tr));
    std::vector<uint16_t> suh(static_cast<size_t>(in), trellis::float_to_half(0.05f)),
        svh(static_cast<size_t>(out), trellis::float_to_half(1.0f));
    w.add(prefix + ".suh", DType::kF16, {in}, std::span<const uint16_t>(suh));
    w.add(prefix + ".svh", DType::kF16, {out}, std::span<const uint16_t>(svh));
    const int32_t marker = trellis::kMul1Marker;
    w.add(prefix + ".mul1", DType::kI32, {}, std::span<const int32_t>(&marker, 1));
    return true;
  });
  EngineOptions o;
  o.overlay = parse_overlay_spec("linear=mxfp8");
  expect_error([&] { load_engine(mixed.path(), o); },
               "model.layers.0.self_attn.k_proj (EXL3, kept: exl3)");
  EXPECT_NO_THROW(load_engine(mixed.path()));  // without an overlay the mix is the runtime's business
  o.overlay = parse_overlay_spec("shared_experts=mxfp8");  // the attention group is not governed
  EXPECT_NO_THROW(load_engine(mixed.path(), o));
}

}  // namespace
}  // namespace exl3::runtime
