// `exl3 quantize --dense-format`: the dense linears (attention, dense MLP, shared experts) written
// as BF16 or stored MXFP8 instead of EXL3. The MXFP8 planes have the right dtypes and shapes and
// dequantize close to the source (checked here in plain fp64), the checkpoint is smaller, and its
// CPU logits equal -- bit for bit, since the runtime's codec wrote them -- those of the BF16
// checkpoint (and of the source) loaded with --overlay; ignore entries, the report, the config
// record and every bad value.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "convert_test_util.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/format/synthetic_hf.hpp"
#include "exl3/mxfp8/weight.hpp"
#include "exl3/quant/convert.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/trellis/half.hpp"
#include "test_mode.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
namespace q = exl3::quant;
namespace rt = exl3::runtime;
using exl3::DType;
using exl3::test::expect_error;
using exl3::test::TempDir;

q::ConvertOptions options(q::DenseFormat f, std::vector<std::string> ignore = {}) {
  q::ConvertOptions o;
  o.bits = 2.0;
  o.head_bits = q::kHeadBitsUnquantized;
  o.g_scale = 0.78;  // fixed global scale: the EXL3 experts (MoE case) encode fast
  o.seed = 5;
  o.dense_format = f;
  o.dense_ignore = std::move(ignore);
  return o;
}

std::vector<float> logits(const fs::path& model, const char* overlay = "none",
                          std::vector<std::string> ignore = {}) {
  rt::EngineOptions eo;
  eo.overlay = rt::parse_overlay_spec(overlay);
  eo.overlay.ignore = std::move(ignore);
  auto e = rt::load_engine(model, eo);
  const std::vector<int32_t> ids = {5, 17, 99, 3, 250, 42, 7, 128, 64, 1};
  return rt::forward_logits(*e, ids);
}

// The stored MXFP8 planes of `prefix` against the source weight: dtypes, shapes, and the
// dequantized values' rel-L2 in (0.5%, 5%) (E4M3 keeps 3 mantissa bits), in fp64.
void expect_mxfp8_of(const exl3::TensorStore& out, const exl3::TensorStore& src, const std::string& prefix) {
  const auto& w = *out.at(prefix + ".weight").info;
  const auto& s = *out.at(prefix + ".weight_scale").info;
  const auto& ref = src.at(prefix + ".weight");
  const int64_t rows = ref.info->shape[0], cols = ref.info->shape[1];
  EXPECT_EQ(w.dtype, DType::kF8E4M3) << prefix;
  EXPECT_EQ(w.shape, (std::vector<int64_t>{rows, cols})) << prefix;
  EXPECT_EQ(s.dtype, DType::kU8) << prefix;
  EXPECT_EQ(s.shape, (std::vector<int64_t>{rows, cols / 32})) << prefix;
  EXPECT_FALSE(out.contains(prefix + ".trellis")) << prefix;
  const auto dq = exl3::mxfp8::Weight::load(out, prefix, rows, cols).dequantize();
  const auto x = exl3::read_as_float(ref);
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e2 += (static_cast<double>(x[i]) - dq[i]) * (static_cast<double>(x[i]) - dq[i]);
    r2 += static_cast<double>(x[i]) * x[i];
  }
  EXPECT_GT(std::sqrt(e2 / r2), 0.005) << prefix;
  EXPECT_LT(std::sqrt(e2 / r2), 0.05) << prefix;
}

// A dense Qwen3 (2 layers x 7 linears, head kept): with every decoder linear dense there is no
// EXL3 at all, so this runs fast even under sanitizers.
TEST(DenseFormat, Mxfp8CheckpointEqualsTheBf16OneUnderTheOverlay) {
  TempDir tmp;
  exl3::SyntheticHfSpec spec;
  spec.arch = exl3::HfArch::kQwen3;
  spec.seed = exl3::test::test_seed();
  spec.init_std = 0.05;
  exl3::write_synthetic_hf_model(tmp / "hf", spec);
  const auto mx = q::convert_model(tmp / "hf", tmp / "mx", options(q::DenseFormat::kMxfp8));
  const auto bf = q::convert_model(tmp / "hf", tmp / "bf", options(q::DenseFormat::kBf16));
  EXPECT_EQ(mx.quantized, 0);
  EXPECT_EQ(mx.dense_linears, 14);
  EXPECT_EQ(bf.dense_linears, 14);
  EXPECT_EQ(mx.bits_achieved, 0.0);  // no EXL3 decoder linear left in the budget

  const auto src = exl3::TensorStore::open(tmp / "hf");
  const auto out = exl3::TensorStore::open(tmp / "mx");
  const auto bfs = exl3::TensorStore::open(tmp / "bf");
  int reported = 0;
  for (const auto& r : mx.reports) {
    if (!r.mxfp8) continue;
    ++reported;
    expect_mxfp8_of(out, src, r.name);
    const auto& info = *src.at(r.name + ".weight").info;
    EXPECT_EQ(r.source_bytes, static_cast<uint64_t>(info.numel() * 2));
    EXPECT_EQ(r.stored_bytes, static_cast<uint64_t>(info.numel() + info.numel() / 32));
    EXPECT_GT(r.rel_l2, 0.005);
    EXPECT_LT(r.rel_l2, 0.05);
    // The BF16 checkpoint keeps the source bytes.
    const auto& b = bfs.at(r.name + ".weight");
    EXPECT_EQ(b.info->dtype, DType::kBF16);
    EXPECT_TRUE(std::equal(b.bytes().begin(), b.bytes().end(), src.at(r.name + ".weight").bytes().begin()));
  }
  EXPECT_EQ(reported, 14);
  EXPECT_EQ(mx.mxfp8_source_bytes() - mx.mxfp8_bytes(), mx.to_json()["mxfp8"]["saved_bytes"].get<uint64_t>());
  EXPECT_EQ(mx.to_json()["mxfp8"]["layers"].size(), 14u);
  EXPECT_EQ(mx.to_json()["dense_format"], "mxfp8");
  // Every other tensor is the same in both: the checkpoint shrinks by exactly the saved bytes.
  EXPECT_LT(mx.total_bytes, bf.total_bytes);
  EXPECT_EQ(bf.total_bytes - mx.total_bytes, mx.mxfp8_source_bytes() - mx.mxfp8_bytes());

  const auto qc = nlohmann::json::parse(exl3::test::read_file(tmp / "mx" / "quantization_config.json"));
  EXPECT_EQ(qc["dense_format"], "mxfp8");
  EXPECT_EQ(qc["tensor_storage"]["model.layers.0.self_attn.q_proj"]["quant_format"], "mxfp8");

  // Loading needs no --overlay, and gives what --overlay computes on the BF16 checkpoint and on
  // the source, bit for bit.
  const auto l_mx = logits(tmp / "mx");
  EXPECT_EQ(l_mx, logits(tmp / "bf", "linear=mxfp8"));
  EXPECT_EQ(l_mx, logits(tmp / "hf", "linear=mxfp8,shared_experts=mxfp8"));
  EXPECT_EQ(logits(tmp / "bf"), logits(tmp / "hf"));
  EXPECT_NE(l_mx, logits(tmp / "bf"));
  auto engine = rt::load_engine(tmp / "mx");
  const auto rep = engine->overlay_report();
  ASSERT_EQ(rep.layers.size(), 14u);
  for (const auto& l : rep.layers) EXPECT_TRUE(l.from_checkpoint) << l.name;

  // An F32 source: --dense-format bf16 rounds it to BF16 (to nearest even).
  spec.dtype = DType::kF32;
  spec.num_layers = 1;
  exl3::write_synthetic_hf_model(tmp / "hf32", spec);
  (void)q::convert_model(tmp / "hf32", tmp / "bf32", options(q::DenseFormat::kBf16));
  const auto s32 = exl3::TensorStore::open(tmp / "hf32");
  const auto o32 = exl3::TensorStore::open(tmp / "bf32");
  const auto& w32 = o32.at("model.layers.0.mlp.up_proj.weight");
  ASSERT_EQ(w32.info->dtype, DType::kBF16);
  const auto src32 = exl3::read_as_float(s32.at("model.layers.0.mlp.up_proj.weight"));
  const auto got32 = exl3::read_as_float(w32);
  ASSERT_EQ(src32.size(), got32.size());
  for (size_t i = 0; i < src32.size(); ++i) {
    ASSERT_EQ(got32[i], exl3::trellis::bf16_to_float(exl3::trellis::float_to_bf16(src32[i]))) << i;
  }
}

// GLM-4.5 style: layer 0 dense, layer 1 MoE with EXL3 routed experts and an MXFP8 shared expert;
// o_proj ignored (kept BF16). Two conversions with EXL3 experts: too slow under sanitizers.
TEST(DenseFormat, MoeSharedExpertsAndIgnoreEqualTheOverlay) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): two conversions with EXL3 experts; "
                    "DenseFormat.Mxfp8CheckpointEqualsTheBf16OneUnderTheOverlay covers the dense path";
  }
  TempDir tmp;
  exl3::SyntheticHfSpec spec;
  spec.arch = exl3::HfArch::kGlm4Moe;
  spec.hidden_size = 128;
  spec.num_heads = 2;
  spec.num_kv_heads = 1;
  spec.intermediate_size = 256;
  spec.num_experts = 2;
  spec.experts_per_tok = 1;
  spec.moe_intermediate_size = 128;
  spec.vocab_size = 256;
  spec.init_std = 0.05;
  spec.seed = exl3::test::test_seed();
  exl3::write_synthetic_hf_model(tmp / "hf", spec);
  const std::vector<std::string> ignore = {"re:.*\\.o_proj$"};
  const auto mx = q::convert_model(tmp / "hf", tmp / "mx", options(q::DenseFormat::kMxfp8, ignore));
  const auto bf = q::convert_model(tmp / "hf", tmp / "bf", options(q::DenseFormat::kBf16));
  // 2 x 4 attention + 3 dense MLP + 3 shared expert linears; the 2 x 3 routed experts stay EXL3.
  EXPECT_EQ(mx.dense_linears, 14);
  EXPECT_EQ(mx.quantized, 6);
  EXPECT_EQ(bf.quantized, 6);
  const auto src = exl3::TensorStore::open(tmp / "hf");
  const auto out = exl3::TensorStore::open(tmp / "mx");
  expect_mxfp8_of(out, src, "model.layers.1.mlp.shared_experts.down_proj");
  expect_mxfp8_of(out, src, "model.layers.0.mlp.gate_proj");
  expect_mxfp8_of(out, src, "model.layers.1.self_attn.k_proj");
  for (const char* o : {"model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"}) {
    EXPECT_EQ(out.at(std::string(o) + ".weight").info->dtype, DType::kBF16) << o;
    EXPECT_FALSE(out.contains(std::string(o) + ".weight_scale")) << o;
  }
  EXPECT_TRUE(out.contains("model.layers.1.mlp.experts.0.up_proj.trellis"));
  int mx_layers = 0;
  for (const auto& r : mx.reports) mx_layers += r.mxfp8 ? 1 : 0;
  EXPECT_EQ(mx_layers, 12);
  EXPECT_LT(mx.total_bytes, bf.total_bytes);
  EXPECT_EQ(logits(tmp / "mx"), logits(tmp / "bf", "linear=mxfp8,shared_experts=mxfp8", ignore));
}

TEST(DenseFormat, BadValuesFailClearly) {
  EXPECT_FALSE(q::parse_dense_format("fp8"));
  EXPECT_FALSE(q::parse_dense_format("MXFP8"));
  for (auto f : {q::DenseFormat::kExl3, q::DenseFormat::kBf16, q::DenseFormat::kMxfp8}) {
    EXPECT_EQ(q::parse_dense_format(q::dense_format_name(f)), f);
  }
  TempDir tmp;
  exl3::SyntheticHfSpec spec;
  spec.arch = exl3::HfArch::kQwen3;
  spec.num_layers = 1;
  spec.seed = exl3::test::test_seed();
  exl3::write_synthetic_hf_model(tmp / "hf", spec);
  auto run = [&](q::ConvertOptions o) { return [&tmp, o] { q::convert_model(tmp / "hf", tmp / "out", o); }; };
  expect_error(run(options(q::DenseFormat::kBf16, {"o_proj"})), {"--dense-ignore", "mxfp8 only"});
  expect_error(run(options(q::DenseFormat::kMxfp8, {"model.layers.0.self_attn.k_proj"})),
               {"the fused shards of 'model.layers.0.self_attn' disagree"});
  expect_error(run(options(q::DenseFormat::kMxfp8, {"re:("})), {"'re:('", "not a valid regular expression"});
  // A non-finite source weight is refused with its tensor and element, in both formats.
  exl3::test::rewrite_model(tmp / "hf", [](const std::string& n, DType&, auto&, std::vector<std::byte>& d) {
    if (n == "model.layers.0.mlp.up_proj.weight") {
      const uint16_t inf = 0x7F80;
      std::memcpy(d.data() + 2 * (2 * 256 + 7), &inf, 2);  // [2, 7] of [512, 256]
    }
    return true;
  });
  for (auto f : {q::DenseFormat::kBf16, q::DenseFormat::kMxfp8}) {
    auto o = options(f);
    o.overwrite = true;  // the first run's partial folder has the other format
    expect_error(run(o), {"model.layers.0.mlp.up_proj.weight", "[2, 7]", "inf", "finite"});
  }
  EXPECT_FALSE(fs::exists(tmp / "out" / "config.json"));
}

}  // namespace
