// `exl3 logits` and `exl3 generate` through the binary on the conformance model.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/format/safetensors.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/text/tokenizer.hpp"
#include "runtime_test_util.hpp"
#include "test_support.hpp"

using exl3::test::run_cli;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

std::string q(const std::filesystem::path& p) {
  return exl3::test::shell_quote(p);
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

std::vector<int32_t> reference_ids(const std::filesystem::path& model) {
  const auto store = exl3::TensorStore::open(model / "reference_logits.safetensors");
  std::vector<int32_t> ids;
  for (const int64_t id : exl3::copy_tensor<int64_t>(store.at("input_ids")))
    ids.push_back(static_cast<int32_t>(id));
  return ids;
}

}  // namespace

TEST(LogitsCli, HelpTeaches) {
  EXPECT_THAT(run_cli("--help").out, HasSubstr("logits"));
  const auto h = run_cli("logits --help");
  EXPECT_EQ(h.code, 0);
  for (const char* s : {"MODEL", "--tokens", "--out", "--device", "--json", "Examples:", "rel-L2",
                        "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM"}) {
    EXPECT_THAT(h.out, HasSubstr(s));
  }
}

TEST(LogitsCli, WritesLogitsEqualToTheLibrary) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = exl3::runtime::test::tiny_model(dir);
  const auto ids = reference_ids(model);
  exl3::test::TempDir tmp;
  const auto out = tmp / "logits.safetensors";
  const auto r = run_cli(
      fmt::format("logits {} --tokens {} --out {} --json", q(model), join(ids), q(out)), "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json::parse(r.out);
  EXPECT_EQ(j["shape"], json::array({16, 512}));
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), ids);

  const auto store = exl3::TensorStore::open(out);
  const auto& t = store.at("logits");
  EXPECT_EQ(t.info->dtype, exl3::DType::kF32);
  EXPECT_EQ(t.info->shape, (std::vector<int64_t>{16, 512}));
  EXPECT_EQ(t.file->metadata().at("tokens"), join(ids));
  const auto cli = exl3::read_as_float(t);
  auto engine = exl3::runtime::load_engine(model);
  const auto lib = exl3::runtime::forward_logits(*engine, ids);
  EXPECT_LE(exl3::test::rel_l2(cli, lib), 1e-7);
  // argmax in the JSON is the file's, and the HF fp64 reference's.
  const auto ref = exl3::read_as_float(
      exl3::TensorStore::open(model / "reference_logits.safetensors").at("hf_dequant_fp64.logits"));
  for (size_t p = 0; p < 16; ++p) {
    const auto row = std::span<const float>(cli).subspan(p * 512, 512);
    EXPECT_EQ(j["argmax"][p].get<int32_t>(), exl3::runtime::argmax(row));
    EXPECT_EQ(exl3::runtime::argmax(row),
              exl3::runtime::argmax(std::span<const float>(ref).subspan(p * 512, 512)));
  }
  // Text output: one line per position.
  const auto text =
      run_cli(fmt::format("logits {} --tokens 5,6,7 --out {}", q(model), q(tmp / "b.safetensors")));
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("logits [3, 512] F32"));
  EXPECT_THAT(text.out, HasSubstr("argmax"));
}

TEST(LogitsCli, BadInputsFailClearly) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = exl3::runtime::test::tiny_model(dir);
  exl3::test::TempDir tmp;
  const auto out = q(tmp / "x.safetensors");
  auto r = run_cli(fmt::format("logits {} --tokens 1,x --out {}", q(model), out));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("--tokens"));
  r = run_cli(fmt::format("logits {} --tokens 1,600 --out {}", q(model), out));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("outside the vocabulary 0..511"));
  // Without a GPU (or without CUDA in the build) --device cuda fails naming the device.
  r = run_cli(fmt::format("logits {} --tokens 1,2 --out {} --device cuda", q(model), out));
  if (r.code != 0) {
    EXPECT_THAT(r.out, HasSubstr("device cuda"));
  }
  r = run_cli(fmt::format("logits {} --tokens 1,2 --out {}", q(tmp / "nothing"), out));
  EXPECT_EQ(r.code, 1);
}

TEST(GenerateCli, HelpTeaches) {
  EXPECT_THAT(run_cli("--help").out, HasSubstr("generate"));
  const auto h = run_cli("generate --help");
  EXPECT_EQ(h.code, 0);
  for (const char* s : {"MODEL", "--prompt", "--max-tokens", "--temperature", "--top-p", "--seed",
                        "--device", "--chat", "--json", "greedy", "Examples:", "tokens per second",
                        "--draft", "--draft-tokens", "--draft-fixed"}) {
    EXPECT_THAT(h.out, HasSubstr(s));
  }
}

TEST(GenerateCli, GreedyMatchesTheLibraryAndStreams) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = exl3::runtime::test::tiny_model(dir);
  const std::string args =
      fmt::format("generate {} --prompt 'import os' --max-tokens 12 --json", q(model));
  const auto a = run_cli(args, "", false);
  ASSERT_EQ(a.code, 0) << a.out;
  const auto ja = json::parse(a.out);
  const auto b = json::parse(run_cli(args, "", false).out);
  EXPECT_EQ(ja["ids"], b["ids"]);
  EXPECT_EQ(ja["text"], b["text"]);

  const auto tok = exl3::Tokenizer::load(model);
  const auto prompt = tok.encode("import os", true);
  EXPECT_EQ(ja["prompt_ids"].get<std::vector<int32_t>>(), prompt);
  auto engine = exl3::runtime::load_engine(model);
  exl3::runtime::GenerateOptions go;
  go.max_new_tokens = 12;
  go.stop_tokens = {2};
  const auto lib = exl3::runtime::generate(*engine, prompt, go);
  EXPECT_EQ(ja["ids"].get<std::vector<int32_t>>(), lib.tokens);
  EXPECT_EQ(ja["stop_reason"], lib.stop_reason);
  EXPECT_EQ(ja["text"].get<std::string>(), tok.decode(lib.tokens, true));
  EXPECT_GT(ja["generation_tokens_per_second"].get<double>(), 0.0);

  // Streaming mode: the text, then the speed line.
  const auto s =
      run_cli(fmt::format("generate {} --prompt 'import os' --max-tokens 12", q(model)), "", false);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_THAT(s.out, HasSubstr(ja["text"].get<std::string>()));
  EXPECT_THAT(s.out, HasSubstr(fmt::format("[prompt: {} tokens, ", prompt.size())));
  EXPECT_THAT(s.out, HasSubstr("tokens/s | generation: "));
}

// --kv-cache: the ids of the library's engine with the same cache format; an unknown format is
// refused naming the choices.
TEST(GenerateCli, KvCacheFormatReachesTheEngine) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = exl3::runtime::test::tiny_model(dir);
  const auto r =
      run_cli(fmt::format("generate {} --prompt 'import os' --max-tokens 12 --kv-cache q4 --json",
                          q(model)),
              "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json::parse(r.out);
  const auto prompt = exl3::Tokenizer::load(model).encode("import os", true);
  exl3::runtime::EngineOptions eo;
  eo.kv_format = exl3::runtime::KvFormat::kQ4;
  auto engine = exl3::runtime::load_engine(model, eo);
  exl3::runtime::GenerateOptions go;
  go.max_new_tokens = 12;
  go.stop_tokens = {2};
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(),
            exl3::runtime::generate(*engine, prompt, go).tokens);
  const auto bad = run_cli(fmt::format("generate {} --prompt x --kv-cache q5", q(model)));
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.out, HasSubstr("--kv-cache"));
  EXPECT_THAT(run_cli("generate --help").out, HasSubstr("--kv-cache"));
}

// --draft: the same ids as plain greedy, the draft's statistics in the JSON and the summary line,
// and seeded sampling with a draft.
TEST(GenerateCli, DraftGivesTheSameTextAndReportsAcceptance) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = exl3::runtime::test::tiny_model(dir);
  const std::string base =
      fmt::format("generate {} --prompt 'import os' --max-tokens 14 --ignore-eos", q(model));
  const auto plain = json::parse(run_cli(base + " --json", "", false).out);
  const auto r =
      run_cli(fmt::format("{} --draft {} --draft-tokens 3 --draft-fixed --json", base, q(model)),
              "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json::parse(r.out);
  EXPECT_EQ(j["ids"], plain["ids"]);
  EXPECT_EQ(j["text"], plain["text"]);
  const auto& sp = j["speculative"];
  EXPECT_EQ(sp["draft_tokens"], 3);
  EXPECT_EQ(sp["adaptive"], false);
  EXPECT_EQ(sp["accepted"], sp["drafted"]);  // the model drafting for itself
  EXPECT_EQ(sp["acceptance_rate"].get<double>(), 1.0);
  EXPECT_GT(sp["tokens_per_round"].get<double>(), 3.0);
  const auto s = run_cli(fmt::format("{} --draft {} --draft-fixed", base, q(model)), "", false);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_THAT(s.out, HasSubstr("drafted tokens accepted (100%)"));
  // Adaptive counts (the default): the same ids, whatever counts the timings chose.
  const auto adaptive =
      json::parse(run_cli(fmt::format("{} --draft {} --json", base, q(model)), "", false).out);
  EXPECT_EQ(adaptive["ids"], plain["ids"]);
  EXPECT_EQ(adaptive["speculative"]["adaptive"], true);
  // Sampling with a fixed draft count: seeded, so the same text twice.
  const std::string sampled =
      fmt::format("{} --draft {} --draft-fixed --temperature 0.8 --seed 3 --json", base, q(model));
  const auto t1 = run_cli(sampled, "", false), t2 = run_cli(sampled, "", false);
  ASSERT_EQ(t1.code, 0) << t1.out;
  EXPECT_EQ(json::parse(t1.out)["ids"], json::parse(t2.out)["ids"]);
  EXPECT_EQ(json::parse(t1.out)["ids"].size(), 14u);
  EXPECT_NE(run_cli(fmt::format("{} --draft-tokens 3", base)).code, 0);  // needs --draft
  EXPECT_NE(run_cli(fmt::format("{} --draft-fixed", base)).code, 0);
}

// --mtp: the tiny DeepSeek-V3 with an MTP layer (the conformance model's tokenizer beside it; the
// prompt's ids are inside its 256-token vocabulary) drafts with its own MTP layer: the same ids as
// plain greedy, the acceptance reported; --mtp and --draft exclude each other; bench model --mtp
// reports its rows.
TEST(GenerateCli, MtpGivesTheSameTextAndReportsAcceptance) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  exl3::test::TempDir tmp;
  const auto model = tmp / "m";
  std::filesystem::create_directories(model);
  const auto src = exl3::test::model_data_dir() / "deepseek_v3_mtp";
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(src / f, model / f);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(exl3::runtime::test::tiny_model(dir) / f, model / f);
  const std::string base =
      fmt::format("generate {} --prompt 'x y x y' --max-tokens 12 --ignore-eos", q(model));
  const auto plain = run_cli(base + " --json", "", false);
  ASSERT_EQ(plain.code, 0) << plain.out;
  const auto r = run_cli(base + " --mtp 2 --draft-fixed --json", "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json::parse(r.out);
  EXPECT_EQ(j["ids"], json::parse(plain.out)["ids"]);
  EXPECT_EQ(j["speculative"]["draft"], "mtp");
  EXPECT_EQ(j["speculative"]["draft_tokens"], 2);
  EXPECT_GT(j["speculative"]["drafted"].get<int>(), 0);
  const auto s = run_cli(base + " --mtp 2 --draft-fixed", "", false);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_THAT(s.out, HasSubstr("[mtp: "));
  EXPECT_THAT(s.out, HasSubstr("drafted tokens accepted"));
  const auto both = run_cli(fmt::format("{} --mtp 2 --draft {}", base, q(model)));
  EXPECT_NE(both.code, 0);
  EXPECT_THAT(both.out, HasSubstr("excludes"));
  const auto b = run_cli(fmt::format(
      "bench model {} --device cpu --batch 1,2 --steps 6 --context 4 --prefill 0 --mtp 2 --json {}",
      q(model), q(tmp / "b.json")));
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_THAT(b.out, HasSubstr("speculative with the MTP layer, up to 2 draft tokens"));
  const auto bj = json::parse(exl3::test::read_file(tmp / "b.json"));
  ASSERT_EQ(bj["mtp"]["batches"].size(), 2u);
  EXPECT_GT(bj["mtp"]["batches"][1]["fixed_tokens_per_second"].get<double>(), 0.0);
}

TEST(GenerateCli, SeededSamplingIsDeterministic) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = exl3::runtime::test::tiny_model(dir);
  const auto run = [&](int seed) {
    const auto r = run_cli(
        fmt::format("generate {} --prompt 'def f' --max-tokens 10 --temperature 1.0 --top-p 0.9 "
                    "--seed {} --ignore-eos --json",
                    q(model), seed),
        "", false);
    EXPECT_EQ(r.code, 0) << r.out;
    return json::parse(r.out);
  };
  const auto a = run(7), b = run(7);
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_EQ(a["ids"].size(), 10u);
  EXPECT_EQ(a["stop_reason"], "max_tokens");
}

TEST(GenerateCli, ChatWithoutTemplateFailsClearly) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = exl3::runtime::test::tiny_model(dir);
  const auto r = run_cli(fmt::format("generate {} --prompt hi --chat", q(model)));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("chat"));
  const auto c = run_cli(fmt::format("generate {} --prompt hi -n 2 --device cuda", q(model)));
  if (c.code != 0) {
    EXPECT_THAT(c.out, HasSubstr("device cuda"));
  }
}

// --tp N runs N ranks; the logits equal --tp 1's, and a TP that cuts an EXL3 block is refused
// with the sizes that work.
// A prompt + --max-tokens past the model's max_position_embeddings is refused before the model
// is loaded (exit 1, both numbers and the limit named, the largest -n that fits as the hint),
// instead of generating at positions the model was never trained for.
TEST(GenerateCli, RefusesPastMaxPositionEmbeddings) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = exl3::runtime::test::tiny_model(dir);
  const int64_t max_pos =
      json::parse(exl3::test::read_file(model / "config.json"))["max_position_embeddings"]
          .get<int64_t>();
  ASSERT_EQ(max_pos, 4096);
  const std::string prompt = "Once upon a time";
  const auto p = static_cast<int64_t>(exl3::Tokenizer::load(model).encode(prompt, true).size());
  for (const int64_t n : {max_pos - p + 1, max_pos, int64_t{9223372036854775807}}) {
    // Bounded: without the check this would generate thousands of tokens.
    const auto r = run_cli(fmt::format("generate {} --prompt '{}' -n {}", q(model), prompt, n),
                           "timeout -k 5 120");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr(fmt::format(
                           "exl3: error: generate: a {}-token prompt + {} new tokens exceed the "
                           "model's max_position_embeddings 4096 ({})",
                           p, n, (model / "config.json").string())));
    EXPECT_THAT(r.out, HasSubstr(fmt::format(
                           "hint: lower --max-tokens / -n to at most {}, or shorten the prompt",
                           max_pos - p)));
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("[prompt:")));  // nothing was generated
  }
}

TEST(LogitsCli, TensorParallelEqualsSingleRank) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto model = exl3::runtime::test::tiny_model(dir);
  const auto ids = reference_ids(model);
  exl3::test::TempDir tmp;
  EXPECT_THAT(run_cli("logits --help").out, HasSubstr("--tp"));
  EXPECT_THAT(run_cli("generate --help").out, HasSubstr("--tp"));
  std::vector<std::vector<float>> logits;
  for (const int tp : {1, 2, 3}) {
    const auto out = tmp / fmt::format("tp{}.safetensors", tp);
    const auto r = run_cli(fmt::format("logits {} --tokens {} --out {} --tp {} --json", q(model),
                                       join(ids), q(out), tp),
                           "", false);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(json::parse(r.out)["tp"], tp);
    const auto store = exl3::TensorStore::open(out);
    EXPECT_EQ(store.at("logits").file->metadata().at("tp"), std::to_string(tp));
    logits.push_back(exl3::read_as_float(store.at("logits")));
  }
  EXPECT_LE(exl3::test::rel_l2(logits[1], logits[0]), 1e-5);
  EXPECT_LE(exl3::test::rel_l2(logits[2], logits[0]), 1e-5);
  const auto bad = run_cli(
      fmt::format("logits {} --tokens 1,2 --out {} --tp 4", q(model), q(tmp / "x.safetensors")));
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.out, HasSubstr("TP sizes that work for this model: 1, 2, 3"));
  // generate: greedy text at TP 2 equals TP 1.
  const auto g1 =
      run_cli(fmt::format("generate {} --prompt 'Hello world' -n 6 --ignore-eos --json", q(model)),
              "", false);
  const auto g2 = run_cli(
      fmt::format("generate {} --prompt 'Hello world' -n 6 --ignore-eos --json --tp 2", q(model)),
      "", false);
  ASSERT_EQ(g1.code, 0) << g1.out;
  ASSERT_EQ(g2.code, 0) << g2.out;
  EXPECT_EQ(json::parse(g1.out)["ids"], json::parse(g2.out)["ids"]);
  EXPECT_EQ(json::parse(g2.out)["tp"], 2);
}

TEST(LogitsCli, OverlayConvertsReportsAndFailsClosed) {
  exl3::test::TempDir tmp;
  exl3::runtime::test::write_model(tmp / "m", exl3::HfArch::kGlm4Moe, exl3::test::test_seed());
  const auto model = q(tmp / "m"), out = q(tmp / "l.safetensors");
  EXPECT_THAT(run_cli("logits --help").out,
              HasSubstr("--overlay linear=mxfp8,shared_experts=mxfp8"));
  auto r = run_cli(
      fmt::format(
          "logits {} --tokens 1,2,3 --out {} --overlay linear=mxfp8,shared_experts=mxfp8 --json",
          model, out),
      "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = json::parse(r.out);
  EXPECT_EQ(j["overlay"]["layers"].size(), 21u);
  EXPECT_GT(j["overlay"]["saved_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["overlay"]["kept_unquantized"][0]["name"], "lm_head");
  // Config file + ignore flag: q/k/v of every layer kept.
  exl3::test::write_file(tmp / "o.json", R"({"linear": {"weight": "mxfp8"}})");
  r = run_cli(fmt::format("logits {} --tokens 1,2 --out {} --overlay-config {} --overlay-ignore "
                          "'re:.*\\.[qkv]_proj' --json",
                          model, out, q(tmp / "o.json")),
              "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  j = json::parse(r.out);
  EXPECT_EQ(j["overlay"]["layers"].size(),
            6u);  // o_proj of 3 layers + layer 0's dense gate/up/down
  // Human output: one summary line.
  r = run_cli(
      fmt::format("logits {} --tokens 1,2 --out {} --overlay shared_experts=mxfp8", model, out));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("overlay: 6 linears as MXFP8"));
  r = run_cli(fmt::format("logits {} --tokens 1,2 --out {} --overlay linear=fp4", model, out));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("'linear' = 'fp4' is not a weight format"));
  r =
      run_cli(fmt::format("logits {} --tokens 1,2 --out {} --overlay linear=mxfp8 --overlay-ignore "
                          "model.layers.0.self_attn.v_proj",
                          model, out));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("the fused shards of 'model.layers.0.self_attn' disagree"));
}
