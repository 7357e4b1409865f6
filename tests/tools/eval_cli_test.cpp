// `exl3 eval` through the binary: the numbers equal the library's, the text report, progress,
// --text builtin, and the errors a user sees.
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/eval/builtin_text.hpp"
#include "exl3/eval/eval.hpp"
#include "exl3/format/synthetic_hf.hpp"
#include "test_support.hpp"

using exl3::test::run_cli;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

std::string q(const std::filesystem::path& p) {
  return exl3::test::shell_quote(p);
}

std::filesystem::path dense_model(const exl3::test::TempDir& tmp, const std::string& name,
                                  uint64_t seed, int64_t vocab = 512) {
  exl3::SyntheticHfSpec s;
  s.arch = exl3::HfArch::kQwen3;
  s.seed = seed;
  s.num_layers = 2;
  s.hidden_size = 128;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.intermediate_size = 256;
  s.init_std = 0.08;
  s.vocab_size = vocab;
  exl3::write_synthetic_hf_model(tmp / name, s);
  return tmp / name;
}

}  // namespace

TEST(EvalCli, HelpTeaches) {
  EXPECT_THAT(run_cli("--help").out, HasSubstr("eval"));
  const auto h = run_cli("eval --help");
  EXPECT_EQ(h.code, 0);
  for (const char* s :
       {"MODEL", "--text", "--reference", "--context", "--stride", "--max-tokens", "--device",
        "--json", "builtin", "KL", "top-1", "perplexity", "Examples:"}) {
    EXPECT_THAT(h.out, HasSubstr(s));
  }
}

// Several models against one reference: one table line each (the reference against itself:
// KL 0, top-1 100%), and with --json one document per model, each equal to a run of that model
// alone.
TEST(EvalCli, SeveralModelsOneLineEach) {
  exl3::test::TempDir tmp;
  const uint64_t seed = exl3::test::test_seed();
  const auto a = dense_model(tmp, "a", seed), b = dense_model(tmp, "b", seed + 1);
  const std::string args =
      fmt::format("{} {} --text builtin -r {} -c 64 -n 200 --quiet", q(a), q(b), q(a));
  const auto t = run_cli("eval " + args);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_THAT(t.out, HasSubstr("perplexity"));
  EXPECT_THAT(t.out, HasSubstr("top-1"));
  EXPECT_THAT(t.out, HasSubstr(a.string() + " "));
  EXPECT_THAT(t.out, HasSubstr("0.000000 100.00%"));  // a against itself
  EXPECT_THAT(t.out, HasSubstr(b.string() + " "));
  const auto j = run_cli("eval " + args + " --json", "", false);
  ASSERT_EQ(j.code, 0) << j.out;
  const auto docs = json::parse(j.out)["models"];
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0]["model"].get<std::string>(), a.string());
  EXPECT_EQ(docs[0]["reference"]["kl"].get<double>(), 0.0);
  const auto alone = json::parse(
      run_cli(fmt::format("eval {} --text builtin -r {} -c 64 -n 200 --quiet --json", q(b), q(a)),
              "", false)
          .out);
  EXPECT_DOUBLE_EQ(docs[1]["reference"]["kl"].get<double>(),
                   alone["reference"]["kl"].get<double>());
  EXPECT_DOUBLE_EQ(docs[1]["perplexity"].get<double>(), alone["perplexity"].get<double>());
  EXPECT_GT(docs[1]["weight_bytes"].get<uint64_t>(), 0u);
}

TEST(EvalCli, JsonEqualsTheLibraryAndTextReports) {
  exl3::test::TempDir tmp;
  const uint64_t seed = exl3::test::test_seed();
  const auto a = dense_model(tmp, "a", seed), b = dense_model(tmp, "b", seed + 1);
  const auto r = run_cli(
      fmt::format("eval {} --text builtin --reference {} --context 64 --stride 48 --max-tokens 300 "
                  "--json",
                  q(a), q(b)),
      "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json::parse(r.out);
  exl3::EvalOptions o;
  o.context = 64;
  o.stride = 48;
  o.max_tokens = 300;
  exl3::EvalModels m;
  m.model = a;
  m.reference = b;
  const auto lib = exl3::evaluate_text(m, exl3::builtin_text(), o);
  EXPECT_EQ(j["tokens"].get<int64_t>(), 300);
  EXPECT_EQ(j["text_tokens"].get<int64_t>(), static_cast<int64_t>(exl3::builtin_text().size()));
  EXPECT_EQ(j["text_bytes"].get<size_t>(), exl3::builtin_text().size());
  EXPECT_EQ(j["scored"].get<int64_t>(), 299);
  EXPECT_EQ(j["windows"].get<int64_t>(), lib.windows);
  EXPECT_DOUBLE_EQ(j["perplexity"].get<double>(), lib.perplexity);
  EXPECT_DOUBLE_EQ(j["reference"]["perplexity"].get<double>(), lib.reference->perplexity);
  EXPECT_DOUBLE_EQ(j["reference"]["kl"].get<double>(), lib.reference->kl);
  EXPECT_EQ(j["reference"]["top1_agree"].get<int64_t>(), lib.reference->top1_agree);
  EXPECT_EQ(j["reference_model"].get<std::string>(), b.string());

  // The human report, and progress on stderr (one line per window when not a terminal).
  const auto t = run_cli(fmt::format("eval {} --text builtin -r {} -c 64 -n 200", q(a), q(b)));
  ASSERT_EQ(t.code, 0) << t.out;
  for (const char* s :
       {"perplexity ", "reference perplexity ", "KL(reference || model) ", "top-1 agreement ",
        "[eval window 4/4] 196/196 tokens scored", "tokens/s]"}) {
    EXPECT_THAT(t.out, HasSubstr(s));
  }
  // Without a reference there is no KL line.
  exl3::test::write_file(tmp / "notes.txt",
                         "Meeting notes: buy milk, fix the bike, call Ana about the soup.\n");
  const auto p = run_cli(fmt::format("eval {} --text {} --quiet", q(a), q(tmp / "notes.txt")));
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_THAT(p.out, HasSubstr("perplexity "));
  EXPECT_THAT(p.out, ::testing::Not(HasSubstr("KL")));
  EXPECT_THAT(p.out, ::testing::Not(HasSubstr("[eval window")));
}

TEST(EvalCli, BadInputsFailClearly) {
  exl3::test::TempDir tmp;
  const auto a = dense_model(tmp, "a", 1);
  auto fails_with = [&](const std::string& args, const std::string& want) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(want)) << args;
  };
  fails_with(fmt::format("eval {} --text {}", q(a), q(tmp / "missing.txt")),
             "missing.txt: no such file");
  exl3::test::write_file(tmp / "empty.txt", "");
  fails_with(fmt::format("eval {} --text {}", q(a), q(tmp / "empty.txt")),
             "empty.txt: the file is empty");
  fails_with(fmt::format("eval {} --text builtin --context 16 --stride 17", q(a)),
             "stride 17 must be in 1..context");
  fails_with(fmt::format("eval {} --text builtin --reference {}", q(a),
                         q(dense_model(tmp, "big", 2, 600))),
             "the vocabularies differ");
  fails_with(fmt::format("eval {} --text builtin", q(tmp / "nothing")), "nothing");
#if !defined(EXL3_HAVE_CUDA)
  fails_with(fmt::format("eval {} --text builtin --device cuda", q(a)),
             "cuda");  // a CPU-only build says so
#endif
  const auto r = run_cli(fmt::format("eval {} --text builtin --context 1", q(a)));
  EXPECT_NE(r.code, 0);  // CLI11 range check
}

// --overlay converts the model, never the reference: the same folder on both sides gives the
// overlay's KL, which equals (bit-identical logits) the KL of the stored-MXFP8 checkpoint that
// `quantize --dense-format mxfp8` writes; without the overlay the KL is 0.
TEST(EvalCli, OverlayKlAgainstTheSameModel) {
  exl3::test::TempDir tmp;
  const auto a = dense_model(tmp, "a", exl3::test::test_seed());
  const std::string common = "--text builtin --context 64 --max-tokens 300 --json -q";
  auto eval = [&](const std::string& args) {
    const auto r = run_cli(fmt::format("eval {} {}", args, common), "", false);
    EXPECT_EQ(r.code, 0) << r.out;
    return r.code == 0 ? json::parse(r.out) : json();
  };
  const auto ov = eval(fmt::format("{} --reference {} --overlay linear=mxfp8", q(a), q(a)));
  ASSERT_TRUE(ov.contains("overlay")) << ov.dump();
  EXPECT_EQ(ov["overlay"]["layers"].size(), 14u);  // 2 layers x (4 attention + 3 MLP)
  EXPECT_GT(ov["overlay"]["saved_bytes"].get<uint64_t>(), 0u);
  const double kl = ov["reference"]["kl"].get<double>();
  EXPECT_GT(kl, 0.0);
  EXPECT_LT(kl, 0.1);
  EXPECT_NE(ov["perplexity"].get<double>(), ov["reference"]["perplexity"].get<double>());

  const auto same = eval(fmt::format("{} --reference {}", q(a), q(a)));
  EXPECT_EQ(same["reference"]["kl"].get<double>(), 0.0);
  EXPECT_FALSE(same.contains("overlay"));
  const auto ignored = eval(
      fmt::format("{} --reference {} --overlay linear=mxfp8 --overlay-ignore 're:.*'", q(a), q(a)));
  EXPECT_EQ(ignored["reference"]["kl"].get<double>(), 0.0);
  EXPECT_EQ(ignored["overlay"]["layers"].size(), 0u);

  ASSERT_EQ(run_cli(fmt::format("quantize {} {} --bits 4 --head-bits 16 --dense-format mxfp8", q(a),
                                q(tmp / "mx")))
                .code,
            0);
  const auto stored = eval(fmt::format("{} --reference {}", q(tmp / "mx"), q(a)));
  EXPECT_EQ(stored["reference"]["kl"].get<double>(), kl);
  EXPECT_EQ(stored["perplexity"].get<double>(), ov["perplexity"].get<double>());

  const auto t = run_cli(fmt::format(
      "eval {} --text builtin -r {} -c 64 -n 200 -q --overlay linear=mxfp8", q(a), q(a)));
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_THAT(t.out, HasSubstr("overlay    14 linears as MXFP8"));
  const auto bad = run_cli(fmt::format("eval {} --text builtin --overlay linear=fp8", q(a)));
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.out, HasSubstr("'linear' = 'fp8' is not a weight format"));
}

// The demo's model: `sample-hf --init-std` writes what the library writes with that init_std.
TEST(EvalCli, SampleHfInitStdIsTheLibrarys) {
  exl3::test::TempDir tmp;
  const auto r = run_cli(fmt::format(
      "sample-hf {} --arch qwen3 --hidden 128 --heads 2 --kv-heads 1 --intermediate 256 "
      "--layers 2 --seed 11 --init-std 0.08",
      q(tmp / "cli")));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lib = dense_model(tmp, "lib", 11);  // init_std 0.08
  EXPECT_EQ(exl3::test::read_file(tmp / "cli" / "model.safetensors"),
            exl3::test::read_file(lib / "model.safetensors"));
  EXPECT_EQ(run_cli(fmt::format("sample-hf {} --init-std 0", q(tmp / "zero"))).code == 0, false);
}
