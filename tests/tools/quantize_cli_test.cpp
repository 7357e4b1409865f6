// End-to-end tests of `exl3 sample-hf`, `exl3 quantize` and `exl3 bench quant` through the
// binary: exit codes, the JSON a script parses, the resume hook, and option validation.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_mode.hpp"
#include "exl3/format/checkpoint.hpp"
#include "test_support.hpp"

using ::testing::HasSubstr;

namespace {

using exl3::test::run_cli;
std::string q(const std::filesystem::path& p) { return exl3::test::shell_quote(p); }

// A one-layer Qwen2 (attention biases, k/v padded from 64 to 128): 7 decoder linears.
std::string tiny_qwen2_args(const std::filesystem::path& dir) {
  return fmt::format("sample-hf {} --arch qwen2 --hidden 128 --layers 1 --heads 2 --kv-heads 1 --head-dim 64 "
                     "--intermediate 128 --vocab 128 --seed 3",
                     q(dir));
}

}  // namespace

TEST(QuantizeCli, HelpListsCommands) {
  const auto r = run_cli("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* c : {"quantize", "sample-hf", "bench"}) EXPECT_THAT(r.out, HasSubstr(c));
  const auto h = run_cli("quantize --help");
  EXPECT_EQ(h.code, 0);
  for (const char* o : {"IN_DIR", "OUT_DIR", "--bits", "--head-bits", "--codebook", "--out-scales", "--device",
                        "--threads", "--seed", "--calibration", "--shard-size-mb", "--json", "Qwen3MoeForCausalLM"}) {
    EXPECT_THAT(h.out, HasSubstr(o));
  }
  EXPECT_EQ(run_cli("bench quant --help").code, 0);
  EXPECT_NE(run_cli("bench").code, 0);  // the group needs a benchmark
}

// Interrupted by the env hook, resumed, then inspected: the JSON summary reports the resumed
// tensors, the achieved bits, the peak RSS and one proxy error per quantized linear.
TEST(QuantizeCli, QuantizeResumeAndJson) {
  if (exl3::test::quant_fast_mode()) {
    GTEST_SKIP() << "fast mode (sanitizers / EXL3_TEST_FAST): a conversion is too slow under "
                    "instrumentation; convert_test's Convert.LlamaTiedEmbeddingsPaddedMcg covers it";
  }
  exl3::test::TempDir tmp;
  ASSERT_EQ(run_cli(tiny_qwen2_args(tmp / "hf")).code, 0);
  const std::string args = fmt::format("quantize {} {} --bits 2 --head-bits 16 --g-scale 0.78 --threads 2 --json",
                                       q(tmp / "hf"), q(tmp / "out"));
  const auto stopped = run_cli(args, "EXL3_QUANTIZE_STOP_AFTER=3");
  EXPECT_EQ(stopped.code, 1) << stopped.out;
  EXPECT_THAT(stopped.out, HasSubstr("exl3: error: quantize: stopped after 3"));
  EXPECT_THAT(stopped.out, HasSubstr("[3/12]"));  // plain progress lines off a terminal
  EXPECT_FALSE(std::filesystem::exists(tmp / "out" / "config.json"));

  const auto r = run_cli(args, "", /*with_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "Qwen2ForCausalLM");
  EXPECT_EQ(j["tensors"], 12);
  EXPECT_EQ(j["quantized"], 7);
  EXPECT_EQ(j["resumed"], 3);
  EXPECT_DOUBLE_EQ(j["bits"].get<double>(), 2.0);
  EXPECT_GT(j["peak_rss_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(j["seconds"].get<double>(), 0.0);
  ASSERT_EQ(j["proxy_err"].size(), 7u);
  for (const auto& e : j["proxy_err"]) {
    EXPECT_GT(e["proxy_err"].get<double>(), 0.0);
    EXPECT_LT(e["proxy_err"].get<double>(), 0.2);
    EXPECT_EQ(e["bits"], 2);
  }
  const auto ckpt = exl3::Checkpoint::open(tmp / "out");
  EXPECT_EQ(ckpt.linears().size(), 7u);
  EXPECT_TRUE(ckpt.linear("model.layers.0.self_attn.k_proj").has_bias);
  EXPECT_FALSE(ckpt.linear("model.layers.0.self_attn.o_proj").has_bias);
  EXPECT_NE(ckpt.store().find("lm_head.weight"), nullptr);  // --head-bits 16 keeps it

  // Same command again: nothing to do. Another bit width: a different model is in the way.
  const auto again = run_cli(fmt::format("quantize {} {} --bits 2 --head-bits 16 --g-scale 0.78", q(tmp / "hf"), q(tmp / "out")));
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_THAT(again.out, HasSubstr("nothing to do"));
  const auto other = run_cli(fmt::format("quantize {} {} --bits 3 --g-scale 0.78", q(tmp / "hf"), q(tmp / "out")));
  EXPECT_EQ(other.code, 1);
  EXPECT_THAT(other.out, HasSubstr("already holds a different model"));
}

TEST(QuantizeCli, RejectsBadOptions) {
  exl3::test::TempDir tmp;
  ASSERT_EQ(run_cli(tiny_qwen2_args(tmp / "hf")).code, 0);
  const std::string io = q(tmp / "hf") + " " + q(tmp / "out");
  for (const char* bad : {"--bits 0", "--bits 9", "--bits 4 --head-bits 12", "--bits 4 --device cuda",
                          "--bits 4 --calibration wiki", "--bits 4 --codebook q4", "--bits 4 --out-scales maybe", ""}) {
    const auto r = run_cli(fmt::format("quantize {} {}", io, bad));
    EXPECT_NE(r.code, 0) << bad;
    EXPECT_FALSE(std::filesystem::exists(tmp / "out" / "config.json")) << bad;
  }
  const auto missing = run_cli(fmt::format("quantize {} {} --bits 4", q(tmp / "nothing"), q(tmp / "out")));
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.out, HasSubstr("exl3: error:"));
  EXPECT_THAT(missing.out, HasSubstr("nothing"));
  EXPECT_NE(run_cli(fmt::format("sample-hf {} --arch gpt2", q(tmp / "x"))).code, 0);
}

// --dense-format mxfp8 with the head kept: no EXL3 at all (fast). The per-layer table, the JSON
// a script reads, and the checkpoint loading with no --overlay; bad values fail before any work.
TEST(QuantizeCli, DenseFormatMxfp8) {
  exl3::test::TempDir tmp;
  ASSERT_EQ(run_cli(tiny_qwen2_args(tmp / "hf")).code, 0);
  const std::string io = q(tmp / "hf") + " " + q(tmp / "out");
  const auto r = run_cli(fmt::format("quantize {} --bits 4 --head-bits 16 --dense-format mxfp8 --dense-ignore k_proj "
                                     "--dense-ignore v_proj --dense-ignore q_proj",
                                     io),
                         "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("model.layers.0.mlp.down_proj"));
  EXPECT_THAT(r.out, HasSubstr("dense linears (mxfp8): 4 as MXFP8, 3 unquantized"));
  const auto j = nlohmann::json::parse(
      run_cli(fmt::format("quantize {} --bits 4 --head-bits 16 --dense-format mxfp8 --dense-ignore k_proj "
                          "--dense-ignore v_proj --dense-ignore q_proj --json",
                          io),
              "", false)
          .out);
  EXPECT_TRUE(j["already_complete"].get<bool>());
  const auto fresh = run_cli(fmt::format("quantize {} {} --bits 4 --head-bits 16 --dense-format mxfp8 --json",
                                         q(tmp / "hf"), q(tmp / "out2")),
                             "", false);
  ASSERT_EQ(fresh.code, 0) << fresh.out;
  const auto k = nlohmann::json::parse(fresh.out);
  EXPECT_EQ(k["dense_format"], "mxfp8");
  EXPECT_EQ(k["dense_linears"], 7);
  EXPECT_EQ(k["quantized"], 0);
  ASSERT_EQ(k["mxfp8"]["layers"].size(), 7u);
  for (const auto& l : k["mxfp8"]["layers"]) {
    EXPECT_GT(l["rel_l2"].get<double>(), 0.005) << l.dump();
    EXPECT_LT(l["rel_l2"].get<double>(), 0.05) << l.dump();
  }
  EXPECT_GT(k["mxfp8"]["saved_bytes"].get<uint64_t>(), 0u);
  const auto logits = run_cli(fmt::format("logits {} --tokens 1,2,3 --out {} --json", q(tmp / "out2"), q(tmp / "l.st")),
                              "", false);
  ASSERT_EQ(logits.code, 0) << logits.out;
  EXPECT_EQ(nlohmann::json::parse(logits.out)["overlay"]["layers"].size(), 7u);  // loaded as stored MXFP8

  for (const char* bad : {"--dense-format fp8", "--dense-format bf16 --dense-ignore o_proj",
                          "--dense-format mxfp8 --dense-ignore 're:['"}) {
    const auto b = run_cli(fmt::format("quantize {} {} --bits 4 {}", q(tmp / "hf"), q(tmp / "bad"), bad));
    EXPECT_NE(b.code, 0) << bad;
    EXPECT_THAT(b.out, HasSubstr("dense")) << bad;
    EXPECT_FALSE(std::filesystem::exists(tmp / "bad" / "config.json")) << bad;
  }
}

// --calibration builtin through the binary: per-layer progress, the calibration set recorded in
// quantization_config; a missing calibration file is named.
TEST(QuantizeCli, CalibratedBuiltinAndMissingFile) {
  exl3::test::TempDir tmp;
  ASSERT_EQ(run_cli(fmt::format("sample-hf {} --arch llama --hidden 128 --layers 1 --heads 2 --kv-heads 1 "
                                "--head-dim 64 --intermediate 128 --vocab 384 --seed 4",
                                q(tmp / "hf")))
                .code,
            0);
  const auto r = run_cli(fmt::format("quantize {} {} --bits 2 --head-bits 16 --g-scale 0.78 --calibration builtin "
                                     "--calibration-rows 2 --calibration-length 32",
                                     q(tmp / "hf"), q(tmp / "out")));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[layer 1/1] model.layers.0 calibrated"));
  const auto cfg = nlohmann::json::parse(exl3::test::read_file(tmp / "out" / "config.json"));
  EXPECT_EQ(cfg["quantization_config"]["calibration"], nlohmann::json({{"rows", 2}, {"cols", 32}}));
  const auto missing = run_cli(fmt::format("quantize {} {} --bits 2 --calibration {}", q(tmp / "hf"),
                                           q(tmp / "out2"), q(tmp / "no_such_corpus.txt")));
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.out, HasSubstr("no_such_corpus.txt"));
}

TEST(QuantizeCli, BenchQuantJson) {
  const bool fast = exl3::test::quant_fast_mode();
  const auto r = run_cli(fmt::format("bench quant --tiles {} --ldlq-in 128 --ldlq-out 128 --ldlq-g-scale 0.9 --json",
                                      fast ? 1 : 16),
                          "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 24u);  // 3 codebooks x K = 1..8
  for (const auto& row : j["rows"]) {
    const int k = row["bits"];
    EXPECT_DOUBLE_EQ(row["bound"].get<double>(), std::pow(2.0, -2.0 * k));
    EXPECT_GT(row["nmse"].get<double>(), 0.0);
    EXPECT_NEAR(row["ratio"].get<double>(), row["nmse"].get<double>() / row["bound"].get<double>(), 1e-9);
    EXPECT_GT(row["exllamav3_nmse"].get<double>(), 0.0);
    EXPECT_GT(row["tiles_per_s"].get<double>(), 0.0);
  }
  EXPECT_GT(j["ldlq"]["gain"].get<double>(), 0.0);
  EXPECT_EQ(j["ldlq"]["in_features"], 128);
  if (fast) return;  // the text table is the same data; one encoder run is enough there
  const auto text = run_cli("bench quant --tiles 2 --ldlq-in 128 --ldlq-out 128 --ldlq-g-scale 0.9");
  EXPECT_EQ(text.code, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("bound 2^-2K"));
  EXPECT_THAT(text.out, HasSubstr("LDLQ proxy-error gain"));
}
