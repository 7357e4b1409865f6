// Model conversion (exl3::quant::convert_model) end to end on tiny synthetic Hugging Face models:
// layout and config as exllamav3 writes them, reconstruction against the source weights,
// sharding, resume after an interruption (bit-identical to a one-shot run), bit allocation, and
// every bad-input case. The CPU encoder is slow (a few hundred tiles/s per core), so models are
// the smallest that exercise each path and the global scale is fixed (--g-scale) instead of
// searched; the search itself is covered by the quantize_tensor tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../runtime/runtime_test_util.hpp"
#include "convert_test_util.hpp"
#include "exl3/cpu/linear.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/fused_experts.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/format/synthetic_hf.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/quant/convert.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/runtime/mtp.hpp"
#include "exl3/runtime/speculative.hpp"
#include "exl3/trellis/half.hpp"
#include "test_mode.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
namespace q = exl3::quant;
namespace tr = exl3::trellis;
using exl3::test::TempDir;

using exl3::test::expect_error;
using exl3::test::rewrite_model;

// The smallest Qwen3-MoE that has every kind of tensor: one layer, two experts, k/v narrower
// than 128 (padding), vocab 256.
exl3::SyntheticHfSpec tiny_moe(uint64_t seed) {
  exl3::SyntheticHfSpec s;
  s.arch = exl3::HfArch::kQwen3Moe;
  s.hidden_size = 128;
  s.num_layers = 1;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.num_experts = 2;
  s.experts_per_tok = 1;
  s.moe_intermediate_size = 128;
  s.vocab_size = 256;
  s.seed = seed;
  return s;
}

q::ConvertOptions fast_options(double bits, uint64_t seed) {
  q::ConvertOptions o;
  o.bits = bits;
  o.seed = seed;
  o.g_scale = 0.78;  // near the search's choice for MUL1 at K = 2..3 on Gaussian weights
  return o;
}

std::string read_bytes(const fs::path& p) {
  return exl3::test::read_file(p);
}

void edit_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& f) {
  auto j = nlohmann::json::parse(read_bytes(dir / "config.json"));
  f(j);
  exl3::test::write_file(dir / "config.json", j.dump(2));
}

// Source HF weight [out, in] of `name`, as fp32.
std::vector<float> source_weight(const fs::path& dir, const std::string& name, int64_t& out,
                                 int64_t& in) {
  const auto store = exl3::TensorStore::open(dir);
  const auto& ref = store.at(name);
  out = ref.info->shape[0];
  in = ref.info->shape[1];
  return exl3::read_as_float(ref);
}

// The converted checkpoint's CPU-engine logits against the source folder's committed
// transformers fp64 reference (reference_logits.safetensors: `ids`, `logits`), as rel-L2.
// With `median`, the median over positions of each position's rel-L2 (robust to the few positions
// where a routing flip moves a token's whole output).
double rel_l2_to_reference(const fs::path& converted, const fs::path& src, bool median = false) {
  const auto ref = exl3::TensorStore::open(src / "reference_logits.safetensors");
  std::vector<int32_t> ids;
  for (const int64_t id : exl3::copy_tensor<int64_t>(ref.at("ids")))
    ids.push_back(static_cast<int32_t>(id));
  const auto want = exl3::read_as_double(ref.at("logits"));
  auto engine = exl3::runtime::load_engine(converted);
  const auto got = exl3::runtime::forward_logits(*engine, ids);
  EXPECT_EQ(got.size(), want.size());
  if (got.size() != want.size()) return 1e9;
  if (!median) return exl3::test::rel_l2(got, want);
  const size_t vocab = want.size() / ids.size();
  std::vector<double> per;
  for (size_t t = 0; t < ids.size(); ++t) {
    per.push_back(exl3::test::rel_l2(std::span<const float>(got).subspan(t * vocab, vocab),
                                     std::span<const double>(want).subspan(t * vocab, vocab)));
  }
  std::nth_element(per.begin(), per.begin() + static_cast<std::ptrdiff_t>(per.size() / 2),
                   per.end());
  return per[per.size() / 2];
}

// Relative RMS error of the converted linear against the source weight (transposed), over the
// unpadded region; padded output columns must reconstruct to exactly 0.
double rel_rms(const exl3::Checkpoint& ckpt, const std::string& prefix, const fs::path& src,
               const std::string& src_name) {
  int64_t out = 0, in = 0;
  const auto w = source_weight(src, src_name, out, in);
  const auto data = exl3::Exl3LinearData::load(ckpt, prefix);
  const auto rec = exl3::cpu::reconstruct_weight(exl3::cpu::LinearView::of(data));
  const int64_t pout = data.info().out_features;
  double se = 0.0, ss = 0.0;
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t o = 0; o < pout; ++o) {
      const double r = rec[static_cast<size_t>(i * pout + o)];
      if (o >= out) {
        EXPECT_EQ(r, 0.0) << prefix << " padded output " << o;
        continue;
      }
      const double ref = w[static_cast<size_t>(o * in + i)];
      se += (r - ref) * (r - ref);
      ss += ref * ref;
    }
  }
  return std::sqrt(se / ss);
}

std::vector<std::string> journal_lines(const fs::path& out) {
  std::ifstream in(out / q::kPartialDir / q::kJournalFile);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::map<std::string, std::string> folder_files(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files[e.path().filename().string()] = read_bytes(e.path());
  }
  return files;
}

// ---- end to end --------------------------------------------------------------------------------

// One-shot conversion with a tiny shard size, then an interrupted + resumed conversion of the
// same model that must come out bit for bit identical. (One test, because each conversion costs
// seconds of encoder time and ctest runs every test in its own process.)
TEST(Convert, Qwen3MoeShardedResumedBitIdentical) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): two conversions are too slow under "
                    "instrumentation; Convert.LlamaTiedEmbeddingsPaddedMcg covers the pipeline";
  }
  const uint64_t seed = exl3::test::test_seed();
  TempDir tmp;
  const fs::path src = tmp / "hf", one = tmp / "one", two = tmp / "two";
  const auto hf = exl3::write_synthetic_hf_model(src, tiny_moe(seed));
  EXPECT_EQ(hf.num_linears, 11);  // q k v o + 2 experts x 3 + lm_head

  q::ConvertOptions o = fast_options(2.5, seed);
  o.shard_size_bytes = 40 << 10;  // forces several shards
  int progress_calls = 0;
  o.progress = [&](const q::ProgressEvent&) { ++progress_calls; };
  const auto r = q::convert_model(src, one, o);
  EXPECT_FALSE(r.already_complete);
  EXPECT_EQ(r.quantized, 11);
  EXPECT_EQ(r.converted, r.tensors);
  EXPECT_EQ(r.resumed, 0);
  EXPECT_GT(r.num_shards, 1);
  EXPECT_GT(r.peak_rss_bytes, 0u);
  EXPECT_EQ(progress_calls, r.tensors + r.num_shards);
  EXPECT_FALSE(fs::exists(one / q::kPartialDir));

  // Bit allocation: 10 equal 128x128 (padded) decoder linears, target 2.5 -> q/k/v (3) and o (1)
  // are raised, the 4 gate/up experts do not fit in the remaining budget, nor the 2 downs.
  EXPECT_NEAR(r.bits_achieved, 2.4, 1e-12);
  const auto cfg = nlohmann::json::parse(read_bytes(one / "config.json"));
  const auto& qc = cfg["quantization_config"];
  EXPECT_EQ(qc["quant_method"], "exl3");
  EXPECT_EQ(qc["version"], q::kConverterVersion);
  EXPECT_DOUBLE_EQ(qc["bits"].get<double>(), 2.4);
  EXPECT_EQ(qc["head_bits"], 6);
  EXPECT_EQ(qc["calibration"]["rows"], 0);
  EXPECT_EQ(qc["out_scales"], "always");
  EXPECT_EQ(qc["codebook"], "mul1");
  EXPECT_EQ(cfg["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(cfg["num_experts"], 2);

  // Every expected linear, with its K and codebook; routers F16, norms and embedding BF16.
  const auto ckpt = exl3::Checkpoint::open(one);
  ASSERT_EQ(ckpt.linears().size(), 11u);
  for (const auto& l : ckpt.linears()) {
    EXPECT_EQ(l.codebook, tr::Codebook::kMul1) << l.prefix;
    int want = 2;
    if (l.prefix == "lm_head")
      want = 6;
    else if (l.prefix.find("self_attn") != std::string::npos)
      want = 3;
    EXPECT_EQ(l.bits, want) << l.prefix;
    EXPECT_EQ(l.in_features, 128) << l.prefix;
  }
  EXPECT_EQ(ckpt.linear("model.layers.0.self_attn.k_proj").out_features, 128);  // 64 padded
  EXPECT_EQ(ckpt.linear("lm_head").out_features, 256);
  ASSERT_EQ(ckpt.moe_layers().size(), 1u);
  EXPECT_EQ(ckpt.moe_layers()[0].num_experts, 2);
  std::map<std::string, exl3::DType> plain;
  for (const auto& t : ckpt.plain_tensors()) plain[t.name] = t.dtype;
  EXPECT_EQ(plain.at("model.layers.0.mlp.gate.weight"), exl3::DType::kF16);
  EXPECT_EQ(plain.at("model.embed_tokens.weight"), exl3::DType::kBF16);
  EXPECT_EQ(plain.at("model.layers.0.self_attn.q_norm.weight"), exl3::DType::kBF16);
  EXPECT_EQ(plain.size(), 7u);
  EXPECT_EQ(read_bytes(one / "tokenizer.json"), read_bytes(src / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(one / "generation_config.json"));

  // Shards: index lists every tensor, a module never spans two shards, the store opens.
  const auto index = nlohmann::json::parse(read_bytes(one / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), r.total_bytes);
  EXPECT_EQ(index["weight_map"].size(), ckpt.store().size());
  for (const auto& l : ckpt.linears()) {
    const auto shard = index["weight_map"][l.prefix + ".trellis"];
    for (const char* s : {".suh", ".svh", ".mul1"})
      EXPECT_EQ(index["weight_map"][l.prefix + s], shard) << l.prefix;
  }
  EXPECT_FALSE(fs::exists(one / "model.safetensors"));
  EXPECT_EQ(static_cast<int>(ckpt.store().files().size()), r.num_shards);

  // quantization_config.json: the config block plus tensor_storage per module.
  const auto qf = nlohmann::json::parse(read_bytes(one / "quantization_config.json"));
  EXPECT_DOUBLE_EQ(qf["bits"].get<double>(), 2.4);
  const auto& ts = qf["tensor_storage"];
  const auto& qproj = ts["model.layers.0.self_attn.q_proj"];
  EXPECT_EQ(qproj["quant_format"], "exl3");
  EXPECT_EQ(qproj["bits_per_weight"], 3);
  EXPECT_EQ(qproj["mul1_multiplier"].get<uint64_t>(), tr::kMul1Mult);
  EXPECT_EQ(qproj["stored_tensors"]["model.layers.0.self_attn.q_proj.trellis"]["dtype"],
            "torch.int16");
  EXPECT_EQ(qproj["stored_tensors"]["model.layers.0.self_attn.q_proj.trellis"]["shape"],
            nlohmann::json::array({8, 8, 48}));
  EXPECT_EQ(
      ts["model.layers.0.mlp.gate"]["stored_tensors"]["model.layers.0.mlp.gate.weight"]["dtype"],
      "torch.float16");
  EXPECT_EQ(ts.size(), 18u);

  // Reconstruction against the source (bf16) weights: K=3 attention, K=2 experts, K=6 head.
  EXPECT_LT(rel_rms(ckpt, "model.layers.0.self_attn.q_proj", src,
                    "model.layers.0.self_attn.q_proj.weight"),
            0.15);
  EXPECT_LT(rel_rms(ckpt, "model.layers.0.self_attn.k_proj", src,
                    "model.layers.0.self_attn.k_proj.weight"),
            0.15);
  EXPECT_LT(rel_rms(ckpt, "model.layers.0.mlp.experts.1.down_proj", src,
                    "model.layers.0.mlp.experts.1.down_proj.weight"),
            0.35);
  EXPECT_LT(rel_rms(ckpt, "lm_head", src, "lm_head.weight"), 0.03);

  // Running again with the same settings is a no-op; other settings find a different model.
  o.progress = nullptr;
  EXPECT_TRUE(q::convert_model(src, one, o).already_complete);
  expect_error([&] { q::convert_model(src, one, fast_options(2.5, seed)); },
               {one.string(), "already holds a different model", "--overwrite"});

  // Interrupted twice (the stop hook throws before the 6th and the 9th tensor), then finished:
  // config.json only appears at the end, finished tensors are skipped, and the result equals the
  // one-shot conversion bit for bit.
  q::ConvertOptions s = o;
  s.stop_after = 5;
  expect_error([&] { q::convert_model(src, two, s); }, {"stopped after 5"});
  EXPECT_FALSE(fs::exists(two / "config.json"));
  EXPECT_EQ(journal_lines(two).size(), 1u + 5u);
  s.stop_after = 3;
  expect_error([&] { q::convert_model(src, two, s); }, {"stopped after 3"});
  EXPECT_FALSE(fs::exists(two / "config.json"));
  EXPECT_EQ(journal_lines(two).size(), 1u + 8u);
  s.stop_after = -1;
  const auto r2 = q::convert_model(src, two, s);
  EXPECT_EQ(r2.resumed, 8);
  EXPECT_EQ(r2.converted, r2.tensors - 8);
  EXPECT_FALSE(fs::exists(two / q::kPartialDir));
  const auto a = folder_files(one), b = folder_files(two);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, bytes] : a) {
    ASSERT_TRUE(b.contains(name)) << name;
    EXPECT_TRUE(bytes == b.at(name)) << name << " differs between one-shot and resumed runs";
  }
}

// Llama with tied embeddings, an MLP width and vocab that need padding, MCG at K=3: lm_head is
// written as an EXL3 linear taken from the embedding; the output fits one model.safetensors.
// Interrupted once and resumed (no extra encoding), so the whole pipeline -- staging, journal,
// resume, assembly -- also runs in fast mode, where this is the only end-to-end conversion.
TEST(Convert, LlamaTiedEmbeddingsPaddedMcg) {
  const uint64_t seed = exl3::test::test_seed();
  TempDir tmp;
  exl3::SyntheticHfSpec spec;
  spec.arch = exl3::HfArch::kLlama;
  spec.hidden_size = 128;
  spec.num_layers = 1;
  spec.num_heads = 2;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.intermediate_size = 200;  // padded to 256
  spec.vocab_size = 300;         // padded to 384
  spec.tie_word_embeddings = true;
  spec.seed = seed;
  exl3::write_synthetic_hf_model(tmp / "hf", spec);
  q::ConvertOptions o = fast_options(3.0, seed);
  o.codebook = tr::Codebook::kMcg;
  o.head_bits = 3;
  o.g_scale = 0.9;  // MCG's codebook RMS is 1.24 (MUL1's 1.0)
  o.stop_after = 4;
  expect_error([&] { q::convert_model(tmp / "hf", tmp / "out", o); }, {"stopped after 4"});
  EXPECT_FALSE(fs::exists(tmp / "out" / "config.json"));
  EXPECT_TRUE(fs::exists(tmp / "out" / q::kPartialDir / "units" / "000003.safetensors"));
  o.stop_after = -1;
  const auto r = q::convert_model(tmp / "hf", tmp / "out", o);
  EXPECT_EQ(r.resumed, 4);
  EXPECT_EQ(r.converted, r.tensors - 4);
  EXPECT_FALSE(fs::exists(tmp / "out" / q::kPartialDir));
  EXPECT_EQ(r.num_shards, 1);
  EXPECT_DOUBLE_EQ(r.bits_achieved, 3.0);
  EXPECT_TRUE(fs::exists(tmp / "out" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(tmp / "out" / "model.safetensors.index.json"));

  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  ASSERT_EQ(ckpt.linears().size(), 8u);  // 7 decoder linears + lm_head from the embedding
  for (const auto& l : ckpt.linears()) {
    EXPECT_EQ(l.codebook, tr::Codebook::kMcg) << l.prefix;
    EXPECT_EQ(l.bits, 3) << l.prefix;
  }
  const auto& head = ckpt.linear("lm_head");
  EXPECT_EQ(head.in_features, 128);
  EXPECT_EQ(head.out_features, 384);
  EXPECT_EQ(ckpt.linear("model.layers.0.mlp.down_proj").in_features, 256);
  EXPECT_NE(ckpt.store().find("model.embed_tokens.weight"), nullptr);  // stays unquantized
  EXPECT_EQ(ckpt.store().find("lm_head.weight"), nullptr);
  EXPECT_LT(rel_rms(ckpt, "lm_head", tmp / "hf", "model.embed_tokens.weight"), 0.15);
  EXPECT_LT(
      rel_rms(ckpt, "model.layers.0.mlp.up_proj", tmp / "hf", "model.layers.0.mlp.up_proj.weight"),
      0.15);
  EXPECT_LT(rel_rms(ckpt, "model.layers.0.mlp.down_proj", tmp / "hf",
                    "model.layers.0.mlp.down_proj.weight"),
            0.15);
  const auto qf = nlohmann::json::parse(read_bytes(tmp / "out" / "quantization_config.json"));
  EXPECT_EQ(qf["tensor_storage"]["lm_head"]["mcg_multiplier"].get<uint64_t>(), tr::kMcgMult);
  EXPECT_FALSE(qf["tensor_storage"]["lm_head"].contains("mul1_multiplier"));
}

// DeepSeek-V3 (multi-head latent attention, a dense first layer, shared and grouped-routed
// experts): what exllamav3 quantizes becomes EXL3 (q_a_proj / q_b_proj, kv_a_proj_with_mqa,
// o_proj, every MLP and expert projection); kv_b_proj and the latent norms stay as stored. The
// result runs on the CPU engine near transformers' own fp64 logits of the source.
TEST(Convert, DeepseekV3LatentAttention) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): 46 linears are too slow under "
                    "instrumentation; the conversion plan is covered by ConvertPlan tests";
  }
  const fs::path src = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "deepseek_v3_q128";
  TempDir tmp;
  q::ConvertOptions o = fast_options(4.0, exl3::test::test_seed());
  o.head_bits = 6;
  const auto r = q::convert_model(src, tmp / "out", o);
  EXPECT_EQ(r.architecture, "DeepseekV3ForCausalLM");
  EXPECT_DOUBLE_EQ(r.bits_achieved, 4.0);
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  for (int l = 0; l < 3; ++l) {
    const std::string a = fmt::format("model.layers.{}.self_attn.", l);
    for (const char* p : {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"}) {
      ASSERT_NE(ckpt.find_linear(a + p), nullptr) << a + p;
      EXPECT_LT(rel_rms(ckpt, a + p, src, a + p + ".weight"), 0.12) << a + p;
    }
    EXPECT_EQ(ckpt.find_linear(a + "kv_b_proj"), nullptr);
    // Copied through (fp32 sources as fp16, as exllamav3 loads them).
    const auto kv_b = exl3::read_as_float(ckpt.store().at(a + "kv_b_proj.weight"));
    const auto kv_b_src =
        exl3::read_as_float(exl3::TensorStore::open(src).at(a + "kv_b_proj.weight"));
    ASSERT_EQ(kv_b.size(), kv_b_src.size());
    for (size_t i = 0; i < kv_b.size(); ++i)
      ASSERT_EQ(kv_b[i], tr::half_to_float(tr::float_to_half(kv_b_src[i])));
    EXPECT_NE(ckpt.store().find(a + "kv_a_layernorm.weight"), nullptr);
  }
  EXPECT_NE(ckpt.find_linear("model.layers.0.mlp.down_proj"), nullptr);
  EXPECT_NE(ckpt.find_linear("model.layers.2.mlp.experts.3.up_proj"), nullptr);
  EXPECT_NE(ckpt.find_linear("model.layers.2.mlp.shared_experts.gate_proj"), nullptr);

  const double err = rel_l2_to_reference(tmp / "out", src);
  std::printf("DeepSeek-V3 K4 vs transformers fp64: rel-L2 %.3f\n", err);
  EXPECT_LE(err, 0.3);  // measured 0.197 with a searched scale (exl3 quantize --bits 4)
}

// DeepSeek-V3 with an MTP layer (the 128-wide reference model cut to two decoder layers, its
// third becoming the MTP block, with enorm / hnorm / eh_proj / shared_head.norm added and the
// target's head shared): the block's linears become EXL3 at exllamav3's mtp_bits (4) whatever
// --bits says, eh_proj and the MTP norms are copied through unquantized, and the converted model
// drafts for itself with --mtp: greedy speculative output equals plain greedy.
TEST(Convert, DeepseekV3KeepsItsMtpLayer) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  const fs::path data = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data";
  TempDir tmp;
  fs::create_directories(tmp / "m");
  fs::copy_file(data / "deepseek_v3_q128" / "config.json", tmp / "m" / "config.json");
  edit_config(tmp / "m", [](nlohmann::json& j) {
    j["num_hidden_layers"] = 2;
    j["num_nextn_predict_layers"] = 1;
  });
  {
    const auto src = exl3::TensorStore::open(data / "deepseek_v3_q128");
    exl3::SafetensorsWriter w;
    for (const auto& name : src.names()) {
      const auto f = exl3::read_as_float(src.at(name));
      w.add<float>(name, exl3::DType::kF32, src.at(name).info->shape, f);
    }
    std::mt19937_64 rng(7);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const auto norm = [&](const std::string& name) {
      std::vector<float> v(128);
      for (auto& x : v) x = 1.0f + 0.2f * g(rng);
      w.add<float>(name, exl3::DType::kF32, {128}, v);
    };
    norm("model.layers.2.enorm.weight");
    norm("model.layers.2.hnorm.weight");
    norm("model.layers.2.shared_head.norm.weight");
    std::vector<float> eh(128 * 256);
    for (auto& x : eh) x = g(rng) / 16.0f;
    w.add<float>("model.layers.2.eh_proj.weight", exl3::DType::kF32, {128, 256}, eh);
    w.write(tmp / "m" / "model.safetensors");
  }
  const auto r =
      q::convert_model(tmp / "m", tmp / "out", fast_options(3.0, exl3::test::test_seed()));
  EXPECT_EQ(r.architecture, "DeepseekV3ForCausalLM");
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  for (const char* name :
       {"model.layers.2.self_attn.q_a_proj", "model.layers.2.mlp.experts.1.down_proj",
        "model.layers.2.mlp.shared_experts.up_proj"}) {
    const auto* l = ckpt.find_linear(name);
    ASSERT_NE(l, nullptr) << name;
    EXPECT_EQ(l->bits, q::kMtpBits) << name;
  }
  EXPECT_EQ(ckpt.find_linear("model.layers.1.self_attn.q_a_proj")->bits, 3);
  EXPECT_EQ(ckpt.find_linear("model.layers.2.eh_proj"), nullptr);
  for (const char* name :
       {"model.layers.2.eh_proj.weight", "model.layers.2.enorm.weight",
        "model.layers.2.hnorm.weight", "model.layers.2.shared_head.norm.weight"}) {
    EXPECT_NE(ckpt.store().find(name), nullptr) << name;
  }

  namespace rt = exl3::runtime;
  const auto target = rt::load_engine(ckpt);
  ASSERT_EQ(target->spec().mtp_layers.size(), 1u);
  EXPECT_EQ(target->spec().mtp_layers[0].head, "lm_head");  // shared with the target
  const auto head = rt::load_mtp_draft(*target, ckpt, {});
  rt::GenerateOptions go;
  go.max_new_tokens = 16;
  const std::vector<int32_t> prompt{3, 14, 15, 92, 65};
  rt::SpeculativeStats st;
  EXPECT_EQ(rt::generate_speculative(*target, *head, prompt, go, {2, false}, &st).tokens,
            rt::generate(*target, prompt, go).tokens);
  EXPECT_GT(st.drafted, 0);
}

// A family whose routed experts live under block_sparse_moe as w1/w3/w2 (Mixtral, MiniMax-M2),
// converted at 4 bits: every projection and expert becomes EXL3 under its own name (as exllamav3
// writes them), the router and `kept` (tensors under each block) are copied through, and the
// result runs on the CPU engine near transformers' fp64 logits; returns that distance.
double convert_block_sparse_moe(const char* fixture, const char* arch, int experts,
                                std::initializer_list<const char*> kept) {
  const fs::path src = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / fixture;
  TempDir tmp;
  q::ConvertOptions o = fast_options(4.0, exl3::test::test_seed());
  o.head_bits = 6;
  const auto r = q::convert_model(src, tmp / "out", o);
  EXPECT_EQ(r.architecture, arch);
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  for (int l = 0; l < 2; ++l) {
    const std::string b = fmt::format("model.layers.{}.block_sparse_moe.", l);
    for (int e = 0; e < experts; ++e) {
      for (const char* p : {"w1", "w2", "w3"}) {
        const std::string name = fmt::format("{}experts.{}.{}", b, e, p);
        EXPECT_NE(ckpt.find_linear(name), nullptr) << name;
        if (ckpt.find_linear(name) != nullptr) {
          EXPECT_LT(rel_rms(ckpt, name, src, name + ".weight"), 0.12) << name;
        }
      }
    }
    EXPECT_EQ(ckpt.find_linear(b + "gate"), nullptr);
    EXPECT_NE(ckpt.store().find(b + "gate.weight"), nullptr);
    for (const char* k : kept) EXPECT_NE(ckpt.store().find(b + k), nullptr) << b + k;
  }
  const auto layout = exl3::moe::read_moe_layout(ckpt);
  EXPECT_TRUE(layout.has_value());
  if (layout) {
    EXPECT_EQ(layout->naming, exl3::moe::kMixtralExperts);
    EXPECT_EQ(layout->num_experts, experts);
  }
  const double err = rel_l2_to_reference(tmp / "out", src);
  std::printf("%s K4 vs transformers fp64: rel-L2 %.3f\n", fixture, err);
  return err;
}

// Mixtral (sliding-window attention, 4 experts).
TEST(Convert, MixtralBlockSparseMoe) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  // Measured 0.26-0.33 over seeds 1-5: with 4 random experts, top-2 routing flips under the
  // quantization error move whole token outputs (each linear alone is within 0.12).
  EXPECT_LE(convert_block_sparse_moe("mixtral", "MixtralForCausalLM", 4, {}), 0.45);
}

// MiniMax-M2 (q/k norms across heads, 8 experts, the routing bias beside the router).
TEST(Convert, MiniMaxM2BlockSparseMoe) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  EXPECT_LE(convert_block_sparse_moe("minimax_m2", "MiniMaxM2ForCausalLM", 8,
                                     {"e_score_correction_bias"}),
            0.45);
}

// gpt-oss: transformers' fused experts (gate and up interleaved in gate_up_proj, input-major) are
// cut into one EXL3 linear per expert and projection with its bias; the attention projections
// keep their biases; router, sinks and norms are copied through; the result runs on the CPU engine
// near transformers' fp64 logits of the source.
TEST(Convert, GptOssFusedExperts) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  const fs::path src = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "gpt_oss";
  TempDir tmp;
  q::ConvertOptions o = fast_options(4.0, exl3::test::test_seed());
  o.head_bits = 6;
  const auto r = q::convert_model(src, tmp / "out", o);
  EXPECT_EQ(r.architecture, "GptOssForCausalLM");
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  const auto source = exl3::TensorStore::open(src / "model.safetensors");
  for (int l = 0; l < 2; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      const std::string name = p + "self_attn." + proj;
      ASSERT_NE(ckpt.find_linear(name), nullptr) << name;
      EXPECT_LT(rel_rms(ckpt, name, src, name + ".weight"), 0.12) << name;
      EXPECT_NE(ckpt.store().find(name + ".bias"), nullptr) << name;
    }
    for (const char* kept : {"self_attn.sinks", "mlp.router.weight", "mlp.router.bias",
                             "input_layernorm.weight", "post_attention_layernorm.weight"}) {
      EXPECT_NE(ckpt.store().find(p + kept), nullptr) << p + kept;
    }
    EXPECT_EQ(ckpt.store().find(p + "mlp.experts.gate_up_proj"), nullptr);
    // Each expert linear against its columns of the fused source tensor ([in, out] as stored).
    const std::string x = p + "mlp.experts.";
    const struct {
      const char* proj;
      const char* fused;
      exl3::FusedColumns cols;
    } parts[] = {{"gate_proj", "gate_up_proj", {0, 2, 0, 128}},
                 {"up_proj", "gate_up_proj", {1, 2, 0, 128}},
                 {"down_proj", "down_proj", {0, 1, 0, 128}}};
    for (int e = 0; e < 4; ++e) {
      for (const auto& part : parts) {
        const std::string name = fmt::format("{}{}.{}", x, e, part.proj);
        ASSERT_NE(ckpt.find_linear(name), nullptr) << name;
        // Every expert linear of the fixture reads 128 inputs (hidden and intermediate alike).
        const auto want = exl3::fused_expert_columns(
            exl3::fused_expert_tensor(source, x + part.fused, 4, 128), e, part.cols);
        const auto data = exl3::Exl3LinearData::load(ckpt, name);
        const auto got = exl3::cpu::reconstruct_weight(exl3::cpu::LinearView::of(data));
        ASSERT_EQ(got.size(), want.size()) << name;
        double se = 0.0, ss = 0.0;
        for (size_t i = 0; i < want.size(); ++i) {
          se += (got[i] - want[i]) * (got[i] - want[i]);
          ss += static_cast<double>(want[i]) * want[i];
        }
        EXPECT_LT(std::sqrt(se / ss), 0.12) << name;
        const auto bias = exl3::read_as_float(ckpt.store().at(name + ".bias"));
        const auto want_bias =
            exl3::fused_expert_bias(source, x + part.fused + "_bias", 4, e, part.cols);
        ASSERT_EQ(bias.size(), want_bias.size()) << name;
        for (size_t i = 0; i < bias.size(); ++i)
          EXPECT_EQ(bias[i], tr::half_to_float(tr::float_to_half(want_bias[i]))) << name << i;
      }
    }
  }
  const double err = rel_l2_to_reference(tmp / "out", src);
  std::printf("gpt-oss K4 vs transformers fp64: rel-L2 %.3f\n", err);
  EXPECT_LE(err, 0.3);  // measured 0.11-0.15 over six seeds
}

// Qwen3-Next: the gated DeltaNet layers' in_proj_qkvz and out_proj become EXL3 linears, in_proj_ba
// and the layer's convolution, decay parameters and gated norm are copied through; the gated
// attention's double-width q_proj and the singular, gated shared expert convert like any linear.
// The result runs on the CPU engine near transformers' logits of the source. The random fixture is
// chaotic (its DeltaNet layers amplify weight errors): Gaussian noise of 0.5% / 8% of each weight's
// std on the quantized linears, put into transformers' own fp64 model, moves its logits by
// rel-L2 0.089 / 0.68, which is what K8 / K4 conversions give (0.054 / 0.65), so the end-to-end
// check runs at 6 bits (measured 0.22-0.25 over seeds 1-4).
TEST(Convert, Qwen3NextHybrid) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  const fs::path src = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "qwen3_next";
  TempDir tmp;
  q::ConvertOptions o = fast_options(6.0, exl3::test::test_seed());
  o.head_bits = 6;
  const auto r = q::convert_model(src, tmp / "out", o);
  EXPECT_EQ(r.architecture, "Qwen3NextForCausalLM");
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  for (const int l : {0, 2, 3}) {
    const std::string p = fmt::format("model.layers.{}.linear_attn.", l);
    for (const char* proj : {"in_proj_qkvz", "out_proj"}) {
      ASSERT_NE(ckpt.find_linear(p + proj), nullptr) << p + proj;
      EXPECT_LT(rel_rms(ckpt, p + proj, src, p + proj + ".weight"), 0.04) << p + proj;
    }
    for (const char* kept :
         {"in_proj_ba.weight", "conv1d.weight", "A_log", "dt_bias", "norm.weight"}) {
      EXPECT_NE(ckpt.store().find(p + kept), nullptr) << p + kept;
    }
    EXPECT_EQ(ckpt.find_linear(p + "in_proj_ba"), nullptr);
  }
  const std::string a = "model.layers.1.self_attn.q_proj";
  ASSERT_NE(ckpt.find_linear(a), nullptr);
  EXPECT_LT(rel_rms(ckpt, a, src, a + ".weight"), 0.04);
  for (const int l : {0, 1, 3}) {
    const std::string m = fmt::format("model.layers.{}.mlp.", l);
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
      EXPECT_NE(ckpt.find_linear(m + "shared_expert." + proj), nullptr) << m << proj;
    EXPECT_NE(ckpt.store().find(m + "shared_expert_gate.weight"), nullptr) << m;
  }
  const double err = rel_l2_to_reference(tmp / "out", src);
  std::printf("qwen3-next K6 vs transformers: rel-L2 %.3f\n", err);
  EXPECT_LE(err, 0.45);
}

// Qwen3.5: the split DeltaNet projections in_proj_qkv / in_proj_z become EXL3 linears, in_proj_b
// and in_proj_a are copied through.
TEST(Convert, Qwen3_5MoeSplitProjections) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  const fs::path src = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "qwen3_5_moe";
  TempDir tmp;
  q::ConvertOptions o = fast_options(6.0, exl3::test::test_seed());
  o.head_bits = 6;
  const auto r = q::convert_model(src, tmp / "out", o);
  EXPECT_EQ(r.architecture, "Qwen3_5MoeForCausalLM");
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  for (const int l : {0, 2, 3}) {
    const std::string p = fmt::format("model.layers.{}.linear_attn.", l);
    for (const char* proj : {"in_proj_qkv", "in_proj_z", "out_proj"}) {
      ASSERT_NE(ckpt.find_linear(p + proj), nullptr) << p + proj;
      EXPECT_LT(rel_rms(ckpt, p + proj, src, p + proj + ".weight"), 0.04) << p + proj;
    }
    for (const char* kept : {"in_proj_b.weight", "in_proj_a.weight", "conv1d.weight"})
      EXPECT_NE(ckpt.store().find(p + kept), nullptr) << p + kept;
  }
  const double err = rel_l2_to_reference(tmp / "out", src);
  std::printf("qwen3.5-moe K6 vs transformers: rel-L2 %.3f\n", err);
  EXPECT_LE(err, 0.45);
}

// Kimi-Linear: KDA layers' q/k/v/o_proj become EXL3 linears (their convolutions, gates and norm
// are copied through), the MLA layer converts as DeepSeek-V3's does (kv_b_proj kept), and the
// MLPs under block_sparse_moe (dense, experts w1/w3/w2, shared experts) convert by their names.
// This fixture is the most chaotic of all: Gaussian noise of 0.5% / 2.5% of each weight's std on
// the quantized linears, put into transformers' own fp64 model, moves its logits by rel-L2
// 0.21 / 0.50 (routing flips move a few positions' whole outputs), and 8-bit conversions land at
// 0.24-0.47 by seed, the median position's error 0.08-0.26 (seeds 1-6). The per-linear errors are
// the tight check; the end-to-end bounds only catch a broken layer (each trait edit of the
// reference test moves the logits by 0.7 or more).
TEST(Convert, KimiLinearHybrid) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  const fs::path src = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "kimi_linear";
  TempDir tmp;
  q::ConvertOptions o = fast_options(8.0, exl3::test::test_seed());
  o.head_bits = 8;
  const auto r = q::convert_model(src, tmp / "out", o);
  EXPECT_EQ(r.architecture, "KimiLinearForCausalLM");
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  for (const int l : {0, 2, 3}) {
    const std::string p = fmt::format("model.layers.{}.self_attn.", l);
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      ASSERT_NE(ckpt.find_linear(p + proj), nullptr) << p + proj;
      EXPECT_LT(rel_rms(ckpt, p + proj, src, p + proj + ".weight"), 0.02) << p + proj;
    }
    for (const char* kept :
         {"q_conv1d.weight", "A_log", "dt_bias", "b_proj.weight", "f_a_proj.weight",
          "f_b_proj.weight", "g_b_proj.weight", "o_norm.weight"}) {
      EXPECT_NE(ckpt.store().find(p + kept), nullptr) << p + kept;
    }
  }
  for (const char* proj : {"q_proj", "kv_a_proj_with_mqa", "o_proj"})
    EXPECT_NE(ckpt.find_linear(std::string("model.layers.1.self_attn.") + proj), nullptr) << proj;
  EXPECT_NE(ckpt.store().find("model.layers.1.self_attn.kv_b_proj.weight"), nullptr);
  EXPECT_NE(ckpt.find_linear("model.layers.0.block_sparse_moe.gate_proj"), nullptr);
  EXPECT_NE(ckpt.find_linear("model.layers.1.block_sparse_moe.experts.7.w2"), nullptr);
  EXPECT_NE(ckpt.find_linear("model.layers.1.block_sparse_moe.shared_experts.up_proj"), nullptr);
  const double median = rel_l2_to_reference(tmp / "out", src, true);
  const double err = rel_l2_to_reference(tmp / "out", src);
  std::printf("kimi-linear K8 vs transformers: rel-L2 %.3f (median position %.3f)\n", err, median);
  EXPECT_LE(median, 0.35);
  EXPECT_LE(err, 0.6);  // a broken layer moves it past 0.7 (the trait edits of the reference test)
}

// gpt-oss experts whose width is not a multiple of 128 (the released models have 2880 channels)
// convert into padded EXL3 linears, which the runtime runs as any padded linear: the gpt_oss
// fixture cut to 96 expert channels (and then 96 hidden channels too), converted at 4 bits, stays
// near the same model unquantized on the CPU engine (which the reference test checks against
// transformers).
TEST(Convert, GptOssUnalignedExpertsArePadded) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  for (const int64_t hidden : {128, 96}) {
    TempDir tmp;
    const fs::path src = tmp / "hf";
    exl3::runtime::test::write_gpt_oss_cut(src, hidden, 96);
    q::ConvertOptions o = fast_options(4.0, exl3::test::test_seed());
    o.head_bits = 6;
    q::convert_model(src, tmp / "out", o);
    const auto ckpt = exl3::Checkpoint::open(tmp / "out");
    const auto* gate = ckpt.find_linear("model.layers.0.mlp.experts.0.gate_proj");
    ASSERT_NE(gate, nullptr);
    const auto info = exl3::Exl3LinearData::load(ckpt, gate->prefix).info();
    EXPECT_EQ(info.out_features, 128);  // padded
    EXPECT_EQ(info.in_features, 128);
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 5) % 256);
    auto plain = exl3::runtime::load_engine(src);
    auto converted = exl3::runtime::load_engine(tmp / "out");
    const double err = exl3::test::rel_l2(exl3::runtime::forward_logits(*converted, ids),
                                          exl3::runtime::forward_logits(*plain, ids));
    std::printf("gpt-oss with %lld hidden and 96 expert channels, K4 vs unquantized: rel-L2 %.3f\n",
                static_cast<long long>(hidden), err);
    EXPECT_LE(err, 0.3);
  }
}

// gpt-oss as OpenAI released it: MXFP4 experts are dequantized while they are cut, so the output
// holds EXL3 experts and none of the packed tensors, and the source's quantization_config is kept
// aside.
TEST(Convert, GptOssMxfp4Experts) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  const fs::path src = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "gpt_oss_mxfp4";
  TempDir tmp;
  q::ConvertOptions o = fast_options(4.0, exl3::test::test_seed());
  o.head_bits = 6;
  q::convert_model(src, tmp / "out", o);
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  for (int e = 0; e < 4; ++e) {
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      const std::string name = fmt::format("model.layers.0.mlp.experts.{}.{}", e, proj);
      EXPECT_NE(ckpt.find_linear(name), nullptr) << name;
    }
  }
  for (const auto& n : ckpt.store().names()) EXPECT_FALSE(n.ends_with("_blocks")) << n;
  const auto cfg = nlohmann::json::parse(exl3::test::read_file(tmp / "out" / "config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "exl3");
  EXPECT_EQ(cfg["original_quantization_config"]["quant_method"], "mxfp4");
  const double err = rel_l2_to_reference(tmp / "out", src);
  std::printf("gpt-oss MXFP4 -> K4 vs transformers fp64: rel-L2 %.3f\n", err);
  EXPECT_LE(err, 0.3);  // measured 0.11-0.19 over seeds 1-5
}

// Gemma 3 (tied head, sandwich and q/k norms, GeGLU): the seven projections of every layer and
// the head (from the embedding) become EXL3, every norm and the embedding stay as stored, and the
// result runs on the CPU engine near transformers' fp64 logits of the source.
TEST(Convert, Gemma3TiedHeadSandwichNorms) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): too slow under instrumentation";
  }
  const fs::path src = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data" / "gemma3";
  TempDir tmp;
  q::ConvertOptions o = fast_options(4.0, exl3::test::test_seed());
  o.head_bits = 6;
  const auto r = q::convert_model(src, tmp / "out", o);
  EXPECT_EQ(r.architecture, "Gemma3ForCausalLM");
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  for (int l = 0; l < 4; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    for (const char* proj : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                             "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      const std::string name = p + proj;
      ASSERT_NE(ckpt.find_linear(name), nullptr) << name;
      EXPECT_LT(rel_rms(ckpt, name, src, name + ".weight"), 0.12) << name;
    }
    for (const char* norm :
         {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
          "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"}) {
      EXPECT_NE(ckpt.store().find(p + norm + ".weight"), nullptr) << p + norm;
    }
  }
  ASSERT_NE(ckpt.find_linear("lm_head"), nullptr);
  EXPECT_NE(ckpt.store().find("model.embed_tokens.weight"), nullptr);

  const double err = rel_l2_to_reference(tmp / "out", src);
  std::printf("Gemma 3 K4 vs transformers fp64: rel-L2 %.3f\n", err);
  EXPECT_LE(err, 0.3);
}

// A damaged resume journal is refused when the run resumes -- naming the journal file, the line
// and the way out -- instead of being trusted until the final write fails (and failing again on
// every re-run); a torn last line (a crash while appending) is not damage; --overwrite recovers.
TEST(ConvertResume, DamagedJournalRefusedAtResumeOverwriteRecovers) {
  TempDir tmp;
  const fs::path src = tmp / "hf", out = tmp / "out";
  exl3::write_synthetic_hf_model(src, tiny_moe(7));
  auto o = fast_options(2.0, 1);
  o.stop_after = 3;
  expect_error([&] { q::convert_model(src, out, o); }, {"stopped after 3"});
  const fs::path partial = out / q::kPartialDir, journal = partial / q::kJournalFile;
  const std::vector<std::string> lines = journal_lines(out);
  ASSERT_EQ(lines.size(), 4u);  // the header and three finished items
  const auto entry = nlohmann::json::parse(lines[2]);
  ASSERT_EQ(entry["unit"], 1);
  EXPECT_EQ(entry["file"], "units/000001.safetensors");  // what a resume checks
  const fs::path unit1 = partial / "units" / "000001.safetensors";
  EXPECT_EQ(entry["bytes"].get<uint64_t>(), fs::file_size(unit1));
  const std::string unit1_bytes = read_bytes(unit1);

  auto join = [](const std::vector<std::string>& ls) {
    std::string t;
    for (const auto& l : ls) t += l + "\n";
    return t;
  };
  auto with_line2 = [&](const std::string& l) {
    auto ls = lines;
    ls[2] = l;
    return join(ls);
  };
  auto edited = [&](const std::function<void(nlohmann::json&)>& f) {
    auto j = entry;
    f(j);
    return with_line2(j.dump());
  };
  // Each damaged journal: refused at once (before any item is converted), naming the journal file,
  // its line 3 and both ways to recover; nothing is written.
  auto expect_refused = [&](const std::string& journal_text, std::vector<std::string> parts) {
    exl3::test::write_file(journal, journal_text);
    parts.insert(parts.end(),
                 {journal.string() + ": line 3:", "hint:", "--overwrite", partial.string()});
    expect_error([&] { q::convert_model(src, out, o); }, parts);
    EXPECT_EQ(read_bytes(journal), journal_text) << "a refused journal is left as it was";
    EXPECT_FALSE(fs::exists(out / "config.json"));
  };
  expect_refused(with_line2(lines[2].substr(0, lines[2].size() / 2)), {"not a JSON record"});
  expect_refused(with_line2("[1, 2]"), {"not a JSON object"});
  expect_refused(edited([](nlohmann::json& j) { j["unit"] = "one"; }),
                 {"'unit' must be an item index"});
  expect_refused(edited([](nlohmann::json& j) { j["unit"] = 999; }),
                 {"'unit' must be an item index"});
  expect_refused(edited([](nlohmann::json& j) { j["name"] = "model.layers.9.mlp.gate_proj"; }),
                 {"model.layers.9.mlp.gate_proj", entry["name"].get<std::string>()});
  expect_refused(edited([](nlohmann::json& j) { j["bits"] = "two"; }), {"wrong type"});
  expect_refused(edited([](nlohmann::json& j) { j["bytes"] = j["bytes"].get<uint64_t>() + 1; }),
                 {unit1.string(), "bytes, the journal recorded"});
  // A truncated staged file, then one of the recorded size with an unreadable header, then none.
  exl3::test::write_file(unit1, unit1_bytes.substr(0, unit1_bytes.size() - 8));
  expect_refused(join(lines), {unit1.string(), "bytes, the journal recorded"});
  std::string garbled = unit1_bytes;
  for (size_t i = 0; i < 8; ++i) garbled[i] = '\xff';
  exl3::test::write_file(unit1, garbled);
  expect_refused(join(lines), {"staged file of", "damaged", unit1.string()});
  fs::remove(unit1);
  expect_refused(join(lines), {unit1.string(), "missing"});
  exl3::test::write_file(unit1, unit1_bytes);

  // Journals from before "file" / "bytes" were recorded still resume; a torn last line (no
  // newline) is dropped, its item redone, and the next entry starts on a line of its own.
  std::vector<std::string> old_format = lines;
  for (size_t i = 1; i < old_format.size(); ++i) {
    auto j = nlohmann::json::parse(old_format[i]);
    j.erase("file");
    j.erase("bytes");
    old_format[i] = j.dump();
  }
  exl3::test::write_file(journal, join(old_format) + R"({"unit": 3, "name": "mod)");
  o.stop_after = 1;
  expect_error([&] { q::convert_model(src, out, o); }, {"stopped after 1"});
  const auto resumed = journal_lines(out);
  ASSERT_EQ(resumed.size(), 5u);
  for (const auto& l : resumed) EXPECT_TRUE(nlohmann::json::accept(l)) << l;
  EXPECT_EQ(nlohmann::json::parse(resumed[4])["unit"], 3);

  // --overwrite discards a damaged journal and converts from the start.
  exl3::test::write_file(journal, with_line2("{\"unit\": 1, \"na"));
  expect_error([&] { q::convert_model(src, out, o); }, {journal.string(), "line 3", "--overwrite"});
  o.stop_after = -1;
  o.overwrite = true;
  const auto r = q::convert_model(src, out, o);
  EXPECT_EQ(r.resumed, 0);
  EXPECT_EQ(r.converted, r.tensors);
  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_FALSE(fs::exists(partial));
}

// ---- plans (no encoding) -----------------------------------------------------------------------

q::ConversionPlan plan_of(const fs::path& dir, double bits, int head_bits) {
  const auto cfg = exl3::parse_model_config(read_bytes(dir / "config.json"), "config.json");
  const auto store = exl3::TensorStore::open(dir);
  return q::plan_conversion(cfg, store, bits, head_bits);
}

const q::PlanItem* find_item(const q::ConversionPlan& p, const std::string& name) {
  for (const auto& it : p.items) {
    if (it.name == name) return &it;
  }
  return nullptr;
}

// Each of `names` is in the plan as a tensor copied through (not quantized).
void expect_copied(const q::ConversionPlan& p, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const auto* it = find_item(p, name);
    ASSERT_NE(it, nullptr) << name;
    EXPECT_EQ(it->kind, q::PlanItem::Kind::kPlain) << name;
  }
}

TEST(ConvertPlan, Glm4MoeDenseLeadSharedExpertsRouterBias) {
  TempDir tmp;
  exl3::SyntheticHfSpec spec;
  spec.arch = exl3::HfArch::kGlm4Moe;
  spec.hidden_size = 128;
  spec.num_layers = 3;
  spec.num_heads = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 64;
  spec.intermediate_size = 256;
  spec.num_experts = 3;
  spec.moe_intermediate_size = 128;
  spec.n_shared_experts = 1;
  spec.first_k_dense_replace = 1;
  spec.vocab_size = 256;
  exl3::write_synthetic_hf_model(tmp.path(), spec);
  const auto p = plan_of(tmp.path(), 4.0, 6);
  EXPECT_EQ(p.architecture, "Glm4MoeForCausalLM");
  int exl3_linears = 0;
  for (const auto& it : p.items) exl3_linears += it.kind == q::PlanItem::Kind::kExl3Linear;
  // layer 0: 4 attn + 3 dense; layers 1-2: 4 attn + 3x3 experts + 3 shared; lm_head
  EXPECT_EQ(exl3_linears, 7 + 2 * 16 + 1);
  const auto* dense = find_item(p, "model.layers.0.mlp.gate_proj");
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->kind, q::PlanItem::Kind::kExl3Linear);
  EXPECT_EQ(dense->group, "model.layers.0.mlp.gate_up");
  const auto* shared = find_item(p, "model.layers.2.mlp.shared_experts.down_proj");
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->kind, q::PlanItem::Kind::kExl3Linear);
  EXPECT_EQ(shared->group, "model.layers.2.mlp.shared_experts.down");
  const auto* router = find_item(p, "model.layers.1.mlp.gate.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(router->kind, q::PlanItem::Kind::kPlain);
  EXPECT_EQ(router->role_name, "router");
  EXPECT_EQ(router->out_dtype, exl3::DType::kF16);
  const auto* bias = find_item(p, "model.layers.1.mlp.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->kind, q::PlanItem::Kind::kPlain);
  EXPECT_EQ(bias->out_dtype, exl3::DType::kF16);  // stored F32 -> F16
  const auto* qp = find_item(p, "model.layers.1.self_attn.q_proj");
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(qp->bias, "model.layers.1.self_attn.q_proj.bias");               // GLM attention bias
  EXPECT_EQ(find_item(p, "model.layers.1.self_attn.q_proj.bias"), nullptr);  // not copied apart
  EXPECT_EQ(p.items.back().name, "lm_head");
  EXPECT_EQ(p.items.front().name, "model.embed_tokens.weight");
}

// MLA plans: the q LoRA pair and kv_a join q/k/v's allocation group, o_proj its own; kv_b_proj
// and the latent norms are copied; experts narrower than 128 are refused; DSA indexer weights
// (GLM-5) are copied too; a missing MLA projection is named.
TEST(ConvertPlan, LatentAttentionProjectionsAndCopies) {
  const fs::path data = fs::path(EXL3_SOURCE_DIR) / "tests" / "model" / "data";
  const auto p = plan_of(data / "deepseek_v3_q128", 4.0, 6);
  const auto* qa = find_item(p, "model.layers.1.self_attn.q_a_proj");
  const auto* kva = find_item(p, "model.layers.1.self_attn.kv_a_proj_with_mqa");
  const auto* qb = find_item(p, "model.layers.1.self_attn.q_b_proj");
  const auto* o = find_item(p, "model.layers.1.self_attn.o_proj");
  for (const auto* it : {qa, kva, qb, o}) {
    ASSERT_NE(it, nullptr);
    EXPECT_EQ(it->kind, q::PlanItem::Kind::kExl3Linear) << it->name;
  }
  EXPECT_EQ(qa->group, "model.layers.1.self_attn.qkv");
  EXPECT_EQ(kva->group, qa->group);
  EXPECT_EQ(qb->group, qa->group);
  EXPECT_EQ(o->group, "model.layers.1.self_attn.o");
  expect_copied(p, {"model.layers.1.self_attn.kv_b_proj.weight",
                    "model.layers.1.self_attn.kv_a_layernorm.weight",
                    "model.layers.1.self_attn.q_a_layernorm.weight"});

  // The reference checkpoints' 32-wide experts would convert into something no runtime loads.
  expect_error([&] { (void)plan_of(data / "deepseek_v3_qlora", 4.0, 6); },
               {"model.layers.1.mlp.experts.0.", "multiple of 128"});

  // GLM-5's reference model cut to its first layer (dense MLP, full indexer).
  TempDir tmp;
  fs::create_directories(tmp / "g");
  fs::copy_file(data / "glm_moe_dsa" / "model.safetensors", tmp / "g" / "model.safetensors");
  auto cfg = nlohmann::json::parse(read_bytes(data / "glm_moe_dsa" / "config.json"));
  cfg["num_hidden_layers"] = 1;
  cfg["mlp_layer_types"] = {"dense"};
  cfg["indexer_types"] = {"full"};
  cfg["layer_types"] = {cfg["layer_types"][0]};
  exl3::test::write_file(tmp / "g" / "config.json", cfg.dump());
  exl3::test::rewrite_model(tmp / "g", [](const std::string& n, auto&, auto&, auto&) {
    return !n.starts_with("model.layers.") || n.starts_with("model.layers.0.");
  });
  const auto dsa = plan_of(tmp / "g", 4.0, 6);
  expect_copied(dsa, {"model.layers.0.self_attn.indexer.wk.weight",
                      "model.layers.0.self_attn.indexer.wq_b.weight",
                      "model.layers.0.self_attn.indexer.weights_proj.weight"});
  ASSERT_NE(find_item(dsa, "model.layers.0.mlp.down_proj"), nullptr);

  fs::create_directories(tmp / "m");
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(data / "deepseek_v3_q128" / f, tmp / "m" / f);
  exl3::test::rewrite_model(tmp / "m", [](const std::string& n, auto&, auto&, auto&) {
    return n != "model.layers.2.self_attn.q_b_proj.weight";
  });
  expect_error([&] { (void)plan_of(tmp / "m", 4.0, 6); },
               {"model.layers.2.self_attn.q_b_proj.weight", "missing"});
}

TEST(ConvertPlan, HeadBitsSixteenAndDtypes) {
  TempDir tmp;
  exl3::SyntheticHfSpec spec;
  spec.arch = exl3::HfArch::kQwen2;
  spec.hidden_size = 128;
  spec.num_layers = 2;
  spec.num_heads = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 64;
  spec.intermediate_size = 128;
  spec.vocab_size = 200;
  spec.dtype = exl3::DType::kF32;
  exl3::write_synthetic_hf_model(tmp / "untied", spec);
  auto p = plan_of(tmp / "untied", 3.0, 16);
  const auto* head = find_item(p, "lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->kind, q::PlanItem::Kind::kPlain);
  EXPECT_EQ(head->out_dtype, exl3::DType::kF16);  // fp32 -> fp16
  EXPECT_EQ(find_item(p, "model.norm.weight")->out_dtype, exl3::DType::kF16);
  EXPECT_EQ(find_item(p, "model.layers.1.self_attn.k_proj")->bias,
            "model.layers.1.self_attn.k_proj.bias");

  spec.tie_word_embeddings = true;
  spec.dtype = exl3::DType::kBF16;
  exl3::write_synthetic_hf_model(tmp / "tied", spec);
  p = plan_of(tmp / "tied", 3.0, 16);
  EXPECT_EQ(find_item(p, "lm_head"), nullptr);  // the runtime falls back to the embedding
  EXPECT_EQ(find_item(p, "lm_head.weight"), nullptr);
  EXPECT_EQ(find_item(p, "model.norm.weight")->out_dtype, exl3::DType::kBF16);
  p = plan_of(tmp / "tied", 3.0, 5);
  ASSERT_NE(find_item(p, "lm_head"), nullptr);
  EXPECT_EQ(find_item(p, "lm_head")->source, "model.embed_tokens.weight");
  EXPECT_EQ(find_item(p, "lm_head")->bits, 5);
  EXPECT_TRUE(p.tied_head);
}

// ---- bit allocation ----------------------------------------------------------------------------

std::vector<q::AllocGroup> layer_groups(int layers, int64_t weights) {
  std::vector<q::AllocGroup> g;
  for (int l = 0; l < layers; ++l) {
    for (int r = 0; r < 4; ++r) g.push_back({fmt::format("l{}g{}", l, r), l, r, weights});
  }
  return g;
}

double average(const std::vector<q::AllocGroup>& g, const std::vector<int>& k) {
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    num += static_cast<double>(g[i].weights) * k[i];
    den += static_cast<double>(g[i].weights);
  }
  return num / den;
}

TEST(BitAllocation, IntegerTargetsAndEnds) {
  auto g = layer_groups(6, 1000);
  for (int b = 1; b <= 8; ++b) {
    for (const int k : q::allocate_bits(g, 6, b)) EXPECT_EQ(k, b);
  }
  // 2.625 over 6 layers x 4 equal groups: 15 groups go up -- the first and last layer's
  // (distance 0), then layer 1's (distance 1, lower layer first), then 3 of layer 4's by rank.
  const auto k = q::allocate_bits(g, 6, 2.625);
  EXPECT_DOUBLE_EQ(average(g, k), 2.625);
  for (size_t i = 0; i < g.size(); ++i) {
    const int l = g[i].layer;
    const int want = (l == 0 || l == 5 || l == 1 || (l == 4 && g[i].rank < 3)) ? 3 : 2;
    EXPECT_EQ(k[i], want) << g[i].id;
  }
  EXPECT_THROW(q::allocate_bits(g, 6, 0.5), exl3::Error);
  EXPECT_THROW(q::allocate_bits(g, 6, 8.5), exl3::Error);
  EXPECT_THROW(q::allocate_bits(g, 6, std::nan("")), exl3::Error);
}

// Random group sizes: never above the target, and greedy-maximal (no group left at the floor
// could still be raised within the budget).
TEST(BitAllocation, NeverExceedsAndIsMaximal) {
  auto rng = exl3::test::make_rng();
  std::uniform_int_distribution<int64_t> size(1, 50);
  std::uniform_real_distribution<double> target(1.0, 8.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int layers = 1 + trial % 7;
    std::vector<q::AllocGroup> g;
    for (int l = 0; l < layers; ++l) {
      for (int r = 0; r < 3; ++r)
        g.push_back({fmt::format("{}.{}", l, r), l, r, size(rng) * 16384});
    }
    const double t = target(rng);
    const auto k = q::allocate_bits(g, layers, t);
    const double avg = average(g, k);
    ASSERT_LE(avg, t + 1e-12) << "target " << t;
    ASSERT_GE(avg, std::floor(t)) << "target " << t;
    double total = 0;
    for (const auto& x : g) total += static_cast<double>(x.weights);
    for (size_t i = 0; i < g.size(); ++i) {
      if (k[i] == static_cast<int>(std::floor(t)) && k[i] < 8) {
        EXPECT_GT(avg + static_cast<double>(g[i].weights) / total, t - 1e-12)
            << "group " << g[i].id << " still fits";
      }
    }
  }
}

// ---- bad input ---------------------------------------------------------------------------------

struct BadInput : ::testing::Test {
  TempDir tmp;
  fs::path src = tmp / "hf", out = tmp / "out";
  void SetUp() override { exl3::write_synthetic_hf_model(src, tiny_moe(7)); }
  q::ConvertResult run(double bits = 2.0) {
    return q::convert_model(src, out, fast_options(bits, 1));
  }
  // Nothing half-written may look complete.
  void TearDown() override { EXPECT_FALSE(fs::exists(out / "config.json")); }
};

TEST_F(BadInput, OptionsOutOfRange) {
  for (const double b : {0.5, 8.5, std::nan(""), -1.0}) expect_error([&] { run(b); }, {"--bits"});
  for (const int h : {0, 9, 12, 17}) {
    auto o = fast_options(2.0, 1);
    o.head_bits = h;
    expect_error([&] { q::convert_model(src, out, o); }, {"--head-bits", std::to_string(h)});
  }
}

TEST_F(BadInput, MissingConfigOrWeights) {
  fs::remove(src / "config.json");
  expect_error([&] { run(); }, {(src / "config.json").string(), "missing"});
  exl3::write_synthetic_hf_model(src, tiny_moe(7));
  fs::remove(src / "model.safetensors");
  expect_error([&] { run(); }, {src.string(), "no safetensors"});
  expect_error([&] { q::convert_model(tmp / "nope", out, fast_options(2.0, 1)); },
               {"nope", "not a folder"});
}

TEST_F(BadInput, UnknownArchitectureListsSupported) {
  edit_config(src, [](nlohmann::json& j) { j["architectures"] = {"GemmaForCausalLM"}; });
  expect_error([&] { run(); },
               {"GemmaForCausalLM", "not supported", "LlamaForCausalLM", "Qwen3MoeForCausalLM",
                "Glm4MoeForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"});
}

TEST_F(BadInput, MissingTensorNamed) {
  rewrite_model(src, [](const std::string& n, auto&, auto&, auto&) {
    return n != "model.layers.0.mlp.experts.1.up_proj.weight";
  });
  expect_error([&] { run(); }, {"missing weights", "model.layers.0.mlp.experts.1.up_proj.weight"});
  exl3::write_synthetic_hf_model(src, tiny_moe(7));
  rewrite_model(src,
                [](const std::string& n, auto&, auto&, auto&) { return n != "lm_head.weight"; });
  expect_error([&] { run(); }, {"lm_head.weight", "tie_word_embeddings"});
}

TEST_F(BadInput, NonFiniteWeightNamedWithIndex) {
  // k_proj is the first linear in output order, so this fails before any encoding.
  rewrite_model(src, [](const std::string& n, exl3::DType& dt, auto&, std::vector<std::byte>& d) {
    if (n == "model.layers.0.self_attn.k_proj.weight") {
      EXPECT_EQ(dt, exl3::DType::kBF16);
      const uint16_t nan = 0x7FC0;
      std::memcpy(d.data() + 2 * (3 * 128 + 5), &nan, 2);  // [3, 5] of [64, 128]
    }
    return true;
  });
  expect_error([&] { run(); },
               {"model.layers.0.self_attn.k_proj.weight", "[3, 5]", "nan", "finite"});
  EXPECT_TRUE(fs::exists(out / q::kPartialDir));  // the copied tensors before it stay resumable
}

TEST_F(BadInput, ShapesThatCannotBeHandled) {
  rewrite_model(src, [](const std::string& n, auto&, std::vector<int64_t>& shape, auto&) {
    if (n == "model.layers.0.self_attn.q_proj.weight") shape = {2, 64, 128};
    return true;
  });
  expect_error([&] { run(); },
               {"model.layers.0.self_attn.q_proj.weight", "cannot be handled", "2, 64, 128"});

  exl3::write_synthetic_hf_model(src, tiny_moe(7));
  rewrite_model(src, [](const std::string& n, exl3::DType& dt, std::vector<int64_t>& shape,
                        std::vector<std::byte>& d) {
    if (n ==
        "model.layers.0.mlp.experts.0.gate_proj.weight") {  // stands in for a fused expert tensor
      shape = {2, 64, 128};
      (void)dt;
      (void)d;
    }
    return true;
  });
  expect_error([&] { run(); },
               {"model.layers.0.mlp.experts.0.gate_proj.weight", "cannot be handled"});

  exl3::write_synthetic_hf_model(src, tiny_moe(7));
  rewrite_model(src, [](const std::string& n, exl3::DType& dt, std::vector<int64_t>& shape,
                        std::vector<std::byte>& d) {
    if (n == "model.layers.0.self_attn.v_proj.weight") {
      dt = exl3::DType::kF8E4M3;
      shape = {64, 256};  // same byte count as [64, 128] BF16
      (void)d;
    }
    return true;
  });
  expect_error([&] { run(); },
               {"model.layers.0.self_attn.v_proj.weight", "F8_E4M3", "not supported"});
}

TEST_F(BadInput, OutputFolderHoldsDifferentModel) {
  fs::create_directories(out);
  exl3::test::write_file(out / "config.json", R"({"architectures": ["LlamaForCausalLM"]})");
  expect_error([&] { run(); }, {out.string(), "already holds a different model", "--overwrite"});
  EXPECT_EQ(read_bytes(out / "config.json"), R"({"architectures": ["LlamaForCausalLM"]})");
  fs::remove(out / "config.json");
  expect_error([&] { q::convert_model(src, src, fast_options(2.0, 1)); }, {"source folder"});
  edit_config(src, [](nlohmann::json& j) {
    j["quantization_config"] = {{"quant_method", "exl3"}};
  });
  expect_error([&] { run(); }, {"already an EXL3 model"});
}

TEST_F(BadInput, PartialRunWithOtherSettings) {
  auto o = fast_options(2.0, 1);
  o.stop_after = 1;  // the embedding copy only: no encoding
  expect_error([&] { q::convert_model(src, out, o); }, {"stopped after 1"});
  o.bits = 3.0;
  o.seed = 9;
  expect_error([&] { q::convert_model(src, out, o); },
               {"different settings", "bits 2.0 (now 3.0)", "seed 1 (now 9)", "--overwrite"});
  o.overwrite = true;  // discards the foreign partial run and starts over
  expect_error([&] { q::convert_model(src, out, o); }, {"stopped after 1"});
  EXPECT_EQ(journal_lines(out).size(), 2u);
  EXPECT_NE(journal_lines(out)[0].find("\"bits\":3.0"), std::string::npos) << journal_lines(out)[0];
}

}  // namespace
