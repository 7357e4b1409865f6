// Calibrated conversion (--calibration): Hessians captured through the runtime's DecoderLayer
// equal an independent fp64 X^T X (the runtime tests' reference forward, tapped at every
// linear); calibrated output is measurably closer to the source model than --calibration none
// at the same bits; an interrupted calibrated run resumes to identical files; bad calibration
// input fails clearly. Models are tiny and the global scale is fixed so each conversion takes
// seconds on the CPU encoder.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "exl3/error.hpp"
#include "exl3/eval/builtin_text.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/format/synthetic_hf.hpp"
#include "exl3/quant/convert.hpp"
#include "exl3/runtime/decoder_layer.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/linear.hpp"
#include "quant/calibrate.hpp"
#include "runtime_test_util.hpp"
#include "test_mode.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
namespace q = exl3::quant;
namespace rt = exl3::runtime;
using exl3::test::TempDir;
using ::testing::HasSubstr;

exl3::SyntheticHfSpec small_model(exl3::HfArch arch, uint64_t seed, int64_t layers) {
  exl3::SyntheticHfSpec s;
  s.arch = arch;
  s.hidden_size = 128;
  s.num_layers = layers;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.intermediate_size = 256;
  s.num_experts = 4;
  s.experts_per_tok = 2;
  s.moe_intermediate_size = 128;
  s.vocab_size = 384;  // the synthetic byte-level tokenizer needs 3 + 256 ids
  s.init_std = 0.06;
  s.seed = seed;
  return s;
}

q::ConvertOptions options(double bits, bool calibrated, int64_t rows, int64_t length,
                          int head_bits = 3) {
  q::ConvertOptions o;
  o.bits = bits;
  o.head_bits = head_bits;
  o.seed = 11;
  o.g_scale = 0.78;  // fixed: the scale search is covered by the quantize_tensor tests
  if (calibrated) {
    o.calibration = q::Calibration::kText;
    o.calibration_text = std::string(exl3::builtin_calibration_text());
    o.calibration_label = "builtin";
    o.calibration_rows = rows;
    o.calibration_length = length;
  }
  return o;
}

// Relative Frobenius distance of a against b.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

TEST(Calibration, HessiansEqualIndependentXtX) {
  TempDir tmp;
  const auto dir = tmp / "moe";
  exl3::write_synthetic_hf_model(dir, small_model(exl3::HfArch::kQwen3Moe, 3, 1));
  const auto ckpt = exl3::Checkpoint::open(dir);
  const auto spec = rt::describe_model(ckpt);
  const int64_t rows = 3, len = 24, hidden = spec.hidden_size;
  std::mt19937 rng(exl3::test::test_seed());
  std::vector<int32_t> ids(static_cast<size_t>(rows * len));
  for (auto& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(spec.vocab_size));

  // Capture through the runtime layer (what calibrated conversion runs).
  const auto embed = rt::DenseMatrix::load(ckpt.store(), spec.embed_tokens);
  std::vector<float> x(static_cast<size_t>(rows * len * hidden));
  for (size_t t = 0; t < ids.size(); ++t) embed.row(ids[t], x.data() + t * hidden);
  const rt::DecoderLayer layer(ckpt, spec, spec.layers[0], nullptr);
  q::detail::HessianCapture cap;
  q::detail::run_layer_rows(layer, x, rows, len, hidden, &cap);

  // Independent: fp64 reference forward, one sequence per row, X^T X summed per linear.
  exl3::runtime::test::ReferenceModel ref(dir);
  std::map<std::string, std::pair<int64_t, std::vector<double>>> want;
  ref.tap = [&](const std::string& name, int64_t m, int64_t c, const std::vector<double>& xs) {
    auto& [count, h] = want[name];
    if (h.empty()) h.assign(static_cast<size_t>(c * c), 0.0);
    for (int64_t t = 0; t < m; ++t)
      for (int64_t i = 0; i < c; ++i)
        for (int64_t j = 0; j < c; ++j)
          h[static_cast<size_t>(i * c + j)] += xs[t * c + i] * xs[t * c + j];
    count += m;
  };
  for (int64_t r = 0; r < rows; ++r) {
    (void)ref.forward(std::vector<int32_t>(ids.begin() + r * len, ids.begin() + (r + 1) * len));
  }
  int experts_seen = 0;
  for (auto& [name, ch] : want) {
    if (name == "lm_head") continue;
    auto& [count, h] = ch;
    for (auto& v : h) v /= static_cast<double>(count);
    const auto* sum = cap.find(name);
    ASSERT_NE(sum, nullptr) << name;
    EXPECT_EQ(sum->count, count) << name;
    const double d = rel_diff(cap.mean(name), h);
    EXPECT_LE(d, 1e-5) << name;
    experts_seen += name.find(".experts.") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(experts_seen, 6);  // at least two experts got tokens (gate/up/down each)
  EXPECT_EQ(cap.find("model.layers.0.self_attn.q_proj"),
            cap.find("model.layers.0.self_attn.v_proj"));
  EXPECT_EQ(cap.find("model.layers.0.mlp.experts.1.gate_proj"),
            cap.find("model.layers.0.mlp.experts.1.up_proj"));
  std::printf("layer 0: %zu linears' Hessians match the fp64 reference\n", want.size() - 1);
}

std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) out[e.path().filename().string()] = exl3::test::read_file(e.path());
  }
  return out;
}

// Multi-head latent attention under capture: q_a_proj and kv_a_proj_with_mqa share the normed
// layer input's Hessian (checked against an fp64 X^T X of it), q_b_proj gets the q_a_layernorm
// output's (q_lora_rank wide), o_proj the attention output's, and kv_b_proj, which conversion
// keeps unquantized, none. Layer 1 routes to the experts, whose captures are counted.
TEST(Calibration, LatentAttentionHessians) {
  const auto dir = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "deepseek_v3_q128";
  const auto ckpt = exl3::Checkpoint::open(dir);
  const auto spec = rt::describe_model(ckpt);
  const int64_t rows = 2, len = 20, hidden = spec.hidden_size, tokens = rows * len;
  std::mt19937 rng(exl3::test::test_seed());
  std::vector<float> x(static_cast<size_t>(tokens * hidden));
  const auto embed = rt::DenseMatrix::load(ckpt.store(), spec.embed_tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    embed.row(static_cast<int64_t>(rng() % static_cast<uint32_t>(spec.vocab_size)),
              x.data() + t * hidden);
  }
  // The fp64 Hessian of input_layernorm(x), what q_a_proj and kv_a_proj_with_mqa read.
  const auto norm = exl3::read_as_float(ckpt.store().at("model.layers.0.input_layernorm.weight"));
  std::vector<double> want(static_cast<size_t>(hidden * hidden), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* r = x.data() + t * hidden;
    double ss = 0;
    for (int64_t i = 0; i < hidden; ++i) ss += double(r[i]) * r[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(hidden) + spec.rms_norm_eps);
    std::vector<double> h(static_cast<size_t>(hidden));
    for (int64_t i = 0; i < hidden; ++i)
      h[static_cast<size_t>(i)] = r[i] * inv * norm[static_cast<size_t>(i)];
    for (int64_t i = 0; i < hidden; ++i)
      for (int64_t j = 0; j < hidden; ++j)
        want[static_cast<size_t>(i * hidden + j)] +=
            h[static_cast<size_t>(i)] * h[static_cast<size_t>(j)] / static_cast<double>(tokens);
  }
  q::detail::HessianCapture cap;
  {
    const rt::DecoderLayer layer(ckpt, spec, spec.layers[0], nullptr);
    q::detail::run_layer_rows(layer, x, rows, len, hidden, &cap);
  }
  const std::string a = "model.layers.0.self_attn.";
  ASSERT_NE(cap.find(a + "q_a_proj"), nullptr);
  EXPECT_EQ(cap.find(a + "q_a_proj"), cap.find(a + "kv_a_proj_with_mqa"));
  EXPECT_LE(rel_diff(cap.mean(a + "q_a_proj"), want), 1e-5);
  for (const char* name : {"q_a_proj", "q_b_proj", "o_proj"}) {
    const auto* c = cap.find(a + name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_EQ(c->count, tokens) << name;
  }
  EXPECT_EQ(cap.mean(a + "q_b_proj").size(), 96u * 96u);  // q_lora_rank wide
  EXPECT_EQ(cap.find(a + "kv_b_proj"), nullptr);
  cap.clear();
  {
    const rt::DecoderLayer layer(ckpt, spec, spec.layers[1], nullptr);
    q::detail::run_layer_rows(layer, x, rows, len, hidden, &cap);
  }
  int64_t routed = 0;
  for (int e = 0; e < 4; ++e) {
    if (const auto* c = cap.find(fmt::format("model.layers.1.mlp.experts.{}.gate_proj", e)))
      routed += c->count;
  }
  EXPECT_EQ(routed, 2 * tokens);  // top-2 of 4 experts
  ASSERT_NE(cap.find("model.layers.1.mlp.shared_experts.gate_proj"), nullptr);
  EXPECT_EQ(cap.find("model.layers.1.mlp.shared_experts.gate_proj")->count, tokens);
}

// GLM-5 (MLA + DSA; layer 1's indexer is `shared`: it reuses layer 0's token selection):
// calibrated conversion hands each row's selection from layer to layer, so the shared layer is
// captured and quantized like the others. Interrupted inside the shared layer and resumed (the
// selection restored with layer 0's saved states), the output is byte-identical to a one-shot
// run, and the converted model stays near transformers' logits of the source.
TEST(Calibration, DsaSelectionCarriedAcrossLayersAndResume) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): several conversions are too slow "
                    "under instrumentation; Calibration.LatentAttentionHessians covers MLA capture";
  }
  const auto data = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "glm_moe_dsa_q128";
  TempDir tmp;
  const auto src = tmp / "src";
  fs::create_directories(src);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(data / f, src / f);
  // The synthetic byte-level tokenizer (384 ids, as the checkpoint's vocabulary).
  exl3::write_synthetic_hf_model(tmp / "tok", small_model(exl3::HfArch::kLlama, 1, 1));
  fs::copy_file(tmp / "tok" / "tokenizer.json", src / "tokenizer.json");

  const auto once = q::convert_model(src, tmp / "once", options(4.0, true, 2, 32, 6));
  // Stop three items into layer 1 (after the embedding and layer 0's items).
  const auto cfg =
      exl3::parse_model_config(exl3::test::read_file(src / "config.json"), "config.json");
  const auto plan = q::plan_conversion(cfg, exl3::TensorStore::open(src), 4.0, 6);
  int64_t through_layer0 = 0;
  for (const auto& it : plan.items) {
    through_layer0 +=
        it.name.starts_with("model.embed_tokens") || it.name.starts_with("model.layers.0.");
  }
  auto o = options(4.0, true, 2, 32, 6);
  o.stop_after = through_layer0 + 3;
  EXPECT_THROW((void)q::convert_model(src, tmp / "resumed", o), exl3::Error);
  EXPECT_TRUE(fs::exists(tmp / "resumed" / q::kPartialDir / "states_0.safetensors"));
  o.stop_after = -1;
  const auto resumed = q::convert_model(src, tmp / "resumed", o);
  EXPECT_GT(resumed.resumed, 0);
  EXPECT_EQ(folder_bytes(tmp / "once"), folder_bytes(tmp / "resumed"));

  const auto ref = exl3::TensorStore::open(data / "reference_logits.safetensors");
  std::vector<int32_t> ids;
  for (const int64_t id : exl3::copy_tensor<int64_t>(ref.at("ids")))
    ids.push_back(static_cast<int32_t>(id));
  auto engine = rt::load_engine(tmp / "once");
  const double err =
      exl3::test::rel_l2(rt::forward_logits(*engine, ids), exl3::read_as_double(ref.at("logits")));
  std::printf("GLM-5 calibrated K4 vs transformers fp64: rel-L2 %.3f\n", err);
  // Measured 0.310 (a sanity bound: positions whose DSA top-k or expert routing flips under
  // quantization carry much of it, as in the DeepSeek-V3 conversion test).
  EXPECT_LE(err, 0.5);
}

// Gemma 3 calibrated through the runtime's layers (the scaled embedding, sandwich norms, GeGLU,
// sliding windows): the result runs near transformers' fp64 logits of the source.
TEST(Calibration, Gemma3CalibratedRuns) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  const auto data = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "gemma3";
  TempDir tmp;
  const auto src = tmp / "src";
  fs::create_directories(src);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(data / f, src / f);
  // The synthetic byte-level tokenizer (384 ids, as the checkpoint's vocabulary).
  exl3::write_synthetic_hf_model(tmp / "tok", small_model(exl3::HfArch::kLlama, 1, 1));
  fs::copy_file(tmp / "tok" / "tokenizer.json", src / "tokenizer.json");
  (void)q::convert_model(src, tmp / "out", options(4.0, true, 2, 32, 6));

  const auto ref = exl3::TensorStore::open(data / "reference_logits.safetensors");
  std::vector<int32_t> ids;
  for (const int64_t id : exl3::copy_tensor<int64_t>(ref.at("ids")))
    ids.push_back(static_cast<int32_t>(id));
  auto engine = rt::load_engine(tmp / "out");
  const double err =
      exl3::test::rel_l2(rt::forward_logits(*engine, ids), exl3::read_as_double(ref.at("logits")));
  std::printf("Gemma 3 calibrated K4 vs transformers fp64: rel-L2 %.3f\n", err);
  EXPECT_LE(err, 0.3);
}

// Mean KL(source || quantized) per position over `ids` rows of `len`.
double mean_kl(const fs::path& src, const fs::path& quant, const std::vector<int32_t>& ids,
               int64_t len) {
  auto a = rt::load_engine(src), b = rt::load_engine(quant);
  const int64_t vocab = a->spec().vocab_size;
  double kl = 0;
  int64_t n = 0;
  for (size_t r = 0; r + static_cast<size_t>(len) <= ids.size(); r += static_cast<size_t>(len)) {
    const std::span<const int32_t> row(ids.data() + r, static_cast<size_t>(len));
    const auto la = rt::forward_logits(*a, row), lb = rt::forward_logits(*b, row);
    for (int64_t t = 0; t < len; ++t) {
      const float* pa = la.data() + t * vocab;
      const float* pb = lb.data() + t * vocab;
      double ma = -1e30, mb = -1e30, sa = 0, sb = 0;
      for (int64_t v = 0; v < vocab; ++v)
        ma = std::max(ma, double(pa[v])), mb = std::max(mb, double(pb[v]));
      for (int64_t v = 0; v < vocab; ++v) sa += std::exp(pa[v] - ma), sb += std::exp(pb[v] - mb);
      for (int64_t v = 0; v < vocab; ++v) {
        const double lpa = pa[v] - ma - std::log(sa), lpb = pb[v] - mb - std::log(sb);
        kl += std::exp(lpa) * (lpa - lpb);
      }
      ++n;
    }
  }
  return kl / static_cast<double>(n);
}

void expect_calibrated_better(exl3::HfArch arch, const char* name) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP()
        << "fast mode (sanitizers / EXL3_TEST_FAST): several conversions are too slow under "
           "instrumentation; QuantizeCli's --calibration builtin run covers the calibrated "
           "pipeline";
  }
  TempDir tmp;
  const auto src = tmp / "src";
  auto spec = small_model(arch, 5, 2);
  spec.intermediate_size = 128;
  exl3::write_synthetic_hf_model(src, spec);
  const int64_t rows = 4, len = 64;
  // lm_head stays unquantized here (its calibrated path runs in the resume test): the decoder
  // layers' error and its propagation are what is compared.
  const auto none = q::convert_model(src, tmp / "none", options(2.0, false, rows, len, 16));
  const auto cal = q::convert_model(src, tmp / "cal", options(2.0, true, rows, len, 16));
  EXPECT_EQ(none.bits_achieved, cal.bits_achieved);
  // Held out: rows of the evaluation text, which shares nothing with the calibration text.
  const auto held =
      q::detail::calibration_tokens(src, exl3::builtin_text(), "builtin", rows, len, 384);
  const double kl_none = mean_kl(src, tmp / "none", held, len);
  const double kl_cal = mean_kl(src, tmp / "cal", held, len);
  std::printf("%s at 2 bits: KL vs source, --calibration none %.4e, builtin %.4e (%.2fx lower)\n",
              name, kl_none, kl_cal, kl_none / kl_cal);
  EXPECT_LT(kl_cal, kl_none);
  // Calibrated proxy errors are the H-weighted ones.
  double proxy_none = 0, proxy_cal = 0;
  for (const auto& r : none.reports) proxy_none += r.proxy_err;
  for (const auto& r : cal.reports) proxy_cal += r.proxy_err;
  EXPECT_GT(proxy_cal, 0.0);
  EXPECT_GT(proxy_none, 0.0);
}

// calibration_rows = 0 (the default) takes every whole row of calibration_length tokens the text
// fills and records that number; a text shorter than one row is refused, naming it.
TEST(Calibration, ZeroRowsTakeAllTheTextFills) {
  TempDir tmp;
  const auto src = tmp / "src";
  exl3::write_synthetic_hf_model(src, small_model(exl3::HfArch::kLlama, 6, 1));
  const std::string text(exl3::builtin_calibration_text().substr(0, 3000));
  const int64_t len = 256;
  // The synthetic tokenizer is byte-level: 3000 bytes give about 3000 tokens.
  const int64_t want = q::detail::calibration_rows_for(src, text, "part", len);
  EXPECT_GE(want, 10);
  EXPECT_LE(want, 12);
  EXPECT_EQ(q::detail::calibration_rows_for(src, exl3::builtin_calibration_text(), "builtin", 8),
            q::kMaxAutoCalibrationRows);  // capped
  auto o = options(2.0, true, 0, len, 16);
  o.calibration_text = text;
  o.calibration_label = "part";
  const auto r = q::convert_model(src, tmp / "out", o);
  EXPECT_EQ(r.bits_achieved, 2.0);
  const auto cfg = nlohmann::json::parse(exl3::test::read_file(tmp / "out" / "config.json"));
  EXPECT_EQ(cfg["quantization_config"]["calibration"]["rows"], want);
  EXPECT_EQ(cfg["quantization_config"]["calibration"]["cols"], len);
  try {
    q::detail::calibration_rows_for(src, text.substr(0, 100), "tiny", len);
    ADD_FAILURE() << "a text shorter than one row must be refused";
  } catch (const exl3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'tiny'"), std::string::npos) << e.what();
  }
}

TEST(Calibration, CalibratedBeatsNoneDense) {
  expect_calibrated_better(exl3::HfArch::kLlama, "llama");
}
TEST(Calibration, CalibratedBeatsNoneMoe) {
  expect_calibrated_better(exl3::HfArch::kQwen3Moe, "qwen3-moe");
}

TEST(Calibration, ResumeAfterInterruptionIsIdentical) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP()
        << "fast mode (sanitizers / EXL3_TEST_FAST): several conversions are too slow under "
           "instrumentation; QuantizeCli's --calibration builtin run covers the calibrated "
           "pipeline";
  }
  TempDir tmp;
  const auto src = tmp / "src";
  auto spec = small_model(exl3::HfArch::kQwen3Moe, 8, 2);
  spec.num_experts = 2;
  spec.experts_per_tok = 1;
  exl3::write_synthetic_hf_model(src, spec);
  const auto once = q::convert_model(src, tmp / "once", options(2.0, true, 2, 48));
  // Interrupt inside layer 1 (after the embedding, layer 0's 15 items and a few of layer 1's),
  // then again one item short of layer 1's end (layer 1 is captured again from states_0).
  auto o = options(2.0, true, 2, 48);
  o.stop_after = 18;
  EXPECT_THROW((void)q::convert_model(src, tmp / "resumed", o), exl3::Error);
  EXPECT_TRUE(fs::exists(tmp / "resumed" / q::kPartialDir / "states_0.safetensors"));
  o.stop_after = 12;
  EXPECT_THROW((void)q::convert_model(src, tmp / "resumed", o), exl3::Error);
  o.stop_after = -1;
  const auto resumed = q::convert_model(src, tmp / "resumed", o);
  EXPECT_GT(resumed.resumed, 0);
  EXPECT_EQ(resumed.resumed + resumed.converted, once.tensors);
  EXPECT_EQ(folder_bytes(tmp / "once"), folder_bytes(tmp / "resumed"));
  EXPECT_FALSE(fs::exists(tmp / "resumed" / q::kPartialDir));
  // Other calibration settings do not resume this folder's run.
  auto other = options(2.0, true, 3, 48);
  other.stop_after = 1;
  EXPECT_THROW((void)q::convert_model(src, tmp / "other", other), exl3::Error);
  try {
    (void)q::convert_model(src, tmp / "other", options(2.0, true, 2, 48));
    ADD_FAILURE();
  } catch (const exl3::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("calibration"));
  }
}

TEST(Calibration, BadInputFailsClearly) {
  TempDir tmp;
  const auto src = tmp / "src";
  exl3::write_synthetic_hf_model(src, small_model(exl3::HfArch::kLlama, 2, 1));
  auto o = options(2.0, true, 4, 64);
  // convert_model(from, into, options) must refuse with a message holding every `parts`.
  const auto expect_refused = [&](const fs::path& from, const char* into,
                                  const q::ConvertOptions& opts,
                                  std::initializer_list<const char*> parts) {
    try {
      (void)q::convert_model(from, tmp / into, opts);
      ADD_FAILURE() << "converted into " << into;
    } catch (const exl3::Error& e) {
      for (const char* p : parts) EXPECT_THAT(e.what(), HasSubstr(p)) << into;
    }
  };
  o.calibration_text = "too short";
  o.calibration_label = "short.txt";
  expect_refused(src, "a", o, {"short.txt", "need 256"});
  o.calibration_text.clear();
  expect_refused(src, "b", o, {"is empty"});
  expect_refused(src, "c", options(2.0, true, -1, 64), {"--calibration-rows -1"});
  o = options(2.0, true, 0, 64);  // as many rows as the text fills: an empty text fills none
  o.calibration_text.clear();
  expect_refused(src, "c", o, {"is empty"});
  // A tokenizer whose ids exceed the model's vocabulary (the 384-id tokenizer on a 100-id model).
  auto spec = small_model(exl3::HfArch::kLlama, 2, 1);
  spec.vocab_size = 100;
  exl3::write_synthetic_hf_model(tmp / "small_vocab", spec);
  fs::copy_file(src / "tokenizer.json", tmp / "small_vocab" / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  expect_refused(tmp / "small_vocab", "d", options(2.0, true, 1, 32), {"outside"});
}

}  // namespace
