// `exl3 bench serve` through the binary, on the conformance model at tiny sizes: the help teaches,
// bad options fail before anything loads, and a run at 1 and 2 concurrent streams with the prefix
// cache off and on writes a JSON file whose figures are finite and positive and whose token
// counts add up. On a model with gated DeltaNet layers (a tokenizer larger than its vocabulary
// beside it), the prefix cache hits through the kept recurrent states.
#include <cmath>
#include <filesystem>
#include <random>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"

using exl3::test::run_cli;
using exl3::test::shell_quote;
using ::testing::HasSubstr;

TEST(BenchServeCli, HelpTeachesAndBadOptionsFail) {
  EXPECT_THAT(run_cli("bench --help").out, HasSubstr("serve"));
  const auto h = run_cli("bench serve --help");
  EXPECT_EQ(h.code, 0);
  for (const char* s : {"--concurrency", "--prefix-cache", "--shared-fraction", "--prompt-tokens",
                        "--max-tokens", "--json", "Examples:", "TTFT", "ITL"}) {
    EXPECT_THAT(h.out, HasSubstr(s)) << s;
  }
  EXPECT_NE(run_cli("bench serve").code, 0);  // MODEL is required
  const auto bad = run_cli("bench serve somewhere --prefix-cache maybe");
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.out, HasSubstr("--prefix-cache"));
  EXPECT_NE(run_cli("bench serve somewhere --shared-fraction 1.5").code, 0);
}

TEST(BenchServeCli, TinyRunWritesConsistentJson) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  exl3::test::TempDir tmp;
  const auto model = conf / "models" / "tiny-qwen3moe-exl3";
  auto rng = exl3::test::make_rng();
  const int prompt = 16 + static_cast<int>(rng() % 48), gen = 2 + static_cast<int>(rng() % 6);
  const int requests = 3 + static_cast<int>(rng() % 3);
  const auto r = run_cli(fmt::format(
      "bench serve {} --device cpu --concurrency 1,2 --requests {} --prompt-tokens {} "
      "--max-tokens {} --shared-fraction 0.5 --page-size 8 --seed {} --json {}",
      shell_quote(model), requests, prompt, gen, rng() % 1000, shell_quote(tmp / "s.json")));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("TTFT p50"));
  // The prefix cache with CUDA tensor parallelism is refused before anything loads.
  const auto tp = run_cli(fmt::format("bench serve {} --device cuda --tp 2", shell_quote(model)));
  EXPECT_NE(tp.code, 0);
  EXPECT_THAT(tp.out, HasSubstr("--prefix-cache off"));
  const auto doc = nlohmann::json::parse(exl3::test::read_file(tmp / "s.json"));
  EXPECT_EQ(doc["device"], "cpu");
  EXPECT_EQ(doc["options"]["prompt_tokens"], prompt);
  EXPECT_EQ(doc["options"]["max_tokens"], gen);
  EXPECT_TRUE(doc["timestamp"].is_string());
  EXPECT_TRUE(doc["git_revision"].is_string());
  ASSERT_EQ(doc["runs"].size(), 2u);
  EXPECT_EQ(doc["runs"][0]["prefix_cache"], false);
  EXPECT_EQ(doc["runs"][1]["prefix_cache"], true);
  for (const auto& run : doc["runs"]) {
    ASSERT_EQ(run["levels"].size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const auto& lv = run["levels"][i];
      EXPECT_EQ(lv["concurrency"], static_cast<int>(i) + 1);
      EXPECT_EQ(lv["requests"], requests);
      EXPECT_EQ(lv["completed"], requests);
      // ignore_eos: every request generates all its tokens, and every prompt is whole.
      EXPECT_EQ(lv["output_tokens"], requests * gen);
      EXPECT_EQ(lv["prompt_tokens"], requests * prompt);
      for (const char* k : {"wall_seconds", "output_tokens_per_second", "requests_per_second"}) {
        const double v = lv[k].get<double>();
        EXPECT_TRUE(std::isfinite(v) && v > 0.0) << k << " " << v;
      }
      for (const char* k : {"ttft_ms", "itl_ms"}) {
        const double p50 = lv[k]["p50"].get<double>(), p99 = lv[k]["p99"].get<double>();
        // A gap can be 0: SSE events that arrive in one read share their arrival time (a loaded
        // CI machine coalesces a tiny model's chunks), so only the first token must take time.
        EXPECT_TRUE(std::isfinite(p50) && (p50 > 0.0 || (k == std::string("itl_ms") && p50 == 0.0)))
            << k << " " << p50;
        EXPECT_GE(p99, p50) << k;
      }
      const auto hits = lv["prefix_hit_tokens"].get<int64_t>();
      if (run["prefix_cache"] == false) {
        EXPECT_EQ(hits, 0);
      } else {
        // The shared half of the prompt holds at least one whole page of 8 once the level's
        // first request has filled it; a hit never exceeds the prompts.
        if (prompt / 2 >= 8) {
          EXPECT_GT(hits, 0);
        }
        EXPECT_LT(hits, requests * prompt);
      }
    }
  }
}

// Qwen3-Next (the reference checkpoint, a borrowed tokenizer with more ids than the model's 256:
// prompts use only ids both have): with 64-token prefill steps the recurrent state is kept every
// 64 tokens, so requests sharing 150 of their 200 prompt tokens reuse 128 of them.
TEST(BenchServeCli, HybridModelReusesPrefixesThroughKeptStates) {
  exl3::test::TempDir tmp;
  const auto src = exl3::test::model_data_dir() / "qwen3_next";
  const auto tok =
      exl3::test::model_data_dir().parent_path().parent_path() / "text" / "data" / "qwen2_style";
  std::filesystem::create_directories(tmp / "m");
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    std::filesystem::copy_file(src / f, tmp / "m" / f);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(tok / f, tmp / "m" / f);
  const auto r = run_cli(
      fmt::format("bench serve {} --device cpu --concurrency 1,4 --requests 6 --prompt-tokens 200 "
                  "--max-tokens 3 --step-tokens 64 --page-size 16 --shared-fraction 0.75 --json {}",
                  shell_quote(tmp / "m"), shell_quote(tmp / "s.json")));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto doc = nlohmann::json::parse(exl3::test::read_file(tmp / "s.json"));
  ASSERT_EQ(doc["runs"].size(), 2u);
  for (const auto& run : doc["runs"]) {
    for (const auto& lv : run["levels"]) {
      EXPECT_EQ(lv["completed"], 6);
      // Every request after a level's first adopts two 64-token steps' worth (128 of the 150
      // shared tokens); a request that arrives while the first is still prefilling may find less.
      const auto hits = lv["prefix_hit_tokens"].get<int64_t>();
      if (run["prefix_cache"] == false) {
        EXPECT_EQ(hits, 0);
      } else {
        EXPECT_GT(hits, 0);
        EXPECT_LE(hits, 5 * 128);
        EXPECT_EQ(hits % 16, 0);
      }
    }
  }
}
