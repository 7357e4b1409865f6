// End-to-end tests of the `exl3` binary: what a user types, what a script parses.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/format/checkpoint.hpp"
#if defined(EXL3_HAVE_CUDA)
#include "exl3/cuda/reconstruct.hpp"
#endif
#include "exl3/format/safetensors.hpp"
#include "test_support.hpp"

using ::testing::HasSubstr;

namespace {

using exl3::test::run_cli;
using exl3::test::shell_quote;
std::string q(const std::filesystem::path& p) {
  return shell_quote(p);
}

}  // namespace

TEST(Cli, HelpTeaches) {
  const auto r = run_cli("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("inspect"));
  EXPECT_THAT(r.out, HasSubstr("Examples:"));
  for (const char* cmd : {"inspect", "dequant", "linear", "sample"}) {
    const auto h = run_cli(fmt::format("{} --help", cmd));
    EXPECT_EQ(h.code, 0) << cmd;
    EXPECT_THAT(h.out, ::testing::AnyOf(HasSubstr("PATH"), HasSubstr("OUT_DIR"))) << cmd;
  }
  EXPECT_NE(run_cli("").code, 0);            // a subcommand is required
  EXPECT_NE(run_cli("frobnicate").code, 0);  // unknown subcommand
}

TEST(Cli, InspectConformanceJson) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto r = run_cli("inspect --json " + q(dir / "tensors" / "exl3_public_3inst.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["linears"].size(), 9u);  // 8 K cases + the legacy case
  int legacy = 0;
  for (const auto& l : j["linears"]) {
    EXPECT_EQ(l["in_features"], 256);
    EXPECT_EQ(l["out_features"], 384);
    EXPECT_EQ(l["codebook"], "3inst");
    EXPECT_GT(l["bytes"].get<uint64_t>(), 0u);
    if (l["rotation"] == "su_sv") ++legacy;
  }
  EXPECT_EQ(legacy, 1);
  EXPECT_TRUE(j["tensors"].is_array());
  const auto text = run_cli("inspect " + q(dir / "models" / "tiny-qwen3moe-exl3"));
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("Qwen3MoeForCausalLM"));
  EXPECT_THAT(text.out, HasSubstr("model.layers.1.mlp.experts.7.down_proj"));
  EXPECT_THAT(text.out, HasSubstr("MoE layers"));
}

TEST(Cli, DequantMatchesGolden) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  exl3::test::TempDir tmp;
  const auto file = dir / "tensors" / "exl3_public_mul1.safetensors";
  const auto r = run_cli(fmt::format("dequant {} --prefix cb_mul1.k4.layer --out {}", q(file),
                                     q(tmp / "w.safetensors")));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto got = exl3::TensorStore::open(tmp / "w.safetensors");
  const auto golden = exl3::TensorStore::open(file);
  EXPECT_EQ(exl3::copy_tensor<uint16_t>(got.at("w_hat")),
            exl3::copy_tensor<uint16_t>(golden.at("cb_mul1.k4.expected.w_hat")));
  const auto w = exl3::read_as_float(got.at("weight"));
  const auto ref = exl3::read_as_double(golden.at("cb_mul1.k4.expected.weight"));
  EXPECT_LE(exl3::test::rel_l2(std::span<const float>(w), std::span<const double>(ref)), 1e-6);
  EXPECT_EQ(got.at("weight").info->shape, (std::vector<int64_t>{256, 384}));
}

// `exl3 linear` on every golden case against exllamav3's fp64 expectation.
TEST(Cli, LinearAllConformanceCases) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  exl3::test::TempDir tmp;
  for (const char* cb : {"3inst", "mcg", "mul1"}) {
    const auto file = dir / "tensors" / fmt::format("exl3_public_{}.safetensors", cb);
    const auto golden = exl3::TensorStore::open(file);
    for (int K = 1; K <= 8; ++K) {
      const std::string name = fmt::format("cb_{}.k{}", cb, K);
      const auto& x = golden.at(name + ".input.x");
      exl3::SafetensorsWriter xw;
      const auto xv = exl3::copy_tensor<uint16_t>(x);
      xw.add<uint16_t>("x", exl3::DType::kF16, x.info->shape, xv);
      xw.write(tmp / "x.safetensors");
      const auto r = run_cli(fmt::format("linear {} --prefix {}.layer --input {} --out {}", q(file),
                                         name, q(tmp / "x.safetensors"), q(tmp / "y.safetensors")));
      ASSERT_EQ(r.code, 0) << r.out;
      const auto y = exl3::read_as_float(exl3::TensorStore::open(tmp / "y.safetensors").at("y"));
      const auto ref = exl3::read_as_double(golden.at(name + ".expected.y_fp64"));
      EXPECT_LE(exl3::test::rel_l2(std::span<const float>(y), std::span<const double>(ref)), 1e-3)
          << name;
    }
  }
}

TEST(Cli, SampleInspectLinearFlow) {
  exl3::test::TempDir tmp;
  const auto model = tmp / "model";
  auto r = run_cli(fmt::format("sample {} --codebook mcg --bits 3 --seed 5", q(model)));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_cli("inspect --json " + q(model));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model"]["architecture"], "Qwen3MoeForCausalLM");
  for (const auto& l : j["linears"]) {
    EXPECT_EQ(l["codebook"], "mcg");
    EXPECT_EQ(l["bits"], l["name"] == "lm_head" ? 6 : 3);
  }
  r = run_cli(fmt::format("linear {} -p model.layers.1.self_attn.q_proj -i {} -o {}", q(model),
                          q(model / "sample_input.safetensors"), q(tmp / "y.safetensors")));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto y = exl3::TensorStore::open(tmp / "y.safetensors");
  EXPECT_EQ(y.at("y").info->shape, (std::vector<int64_t>{4, 256}));
}

TEST(Cli, ErrorsNameTheProblem) {
  exl3::test::TempDir tmp;
  auto r = run_cli("inspect " + q(tmp / "does-not-exist"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("does-not-exist"));
  EXPECT_THAT(r.out, HasSubstr("exl3: error:"));

  exl3::test::write_file(tmp / "junk.safetensors", "this is not a safetensors file at all");
  r = run_cli("inspect " + q(tmp / "junk.safetensors"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("junk.safetensors"));

  const auto model = tmp / "m";
  ASSERT_EQ(run_cli("sample " + q(model)).code, 0);
  r = run_cli(fmt::format("dequant {} --prefix model.layers.0.self_attn.qq_proj --out {}", q(model),
                          q(tmp / "w.st")));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("qq_proj"));

  exl3::SafetensorsWriter xw;
  std::vector<int32_t> xi(256, 1);
  xw.add<int32_t>("x", exl3::DType::kI32, {1, 256}, xi);
  xw.write(tmp / "xi.safetensors");
  r = run_cli(fmt::format("linear {} -p lm_head -i {} -o {}", q(model), q(tmp / "xi.safetensors"),
                          q(tmp / "y.st")));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("I32"));

  exl3::SafetensorsWriter xw2;
  std::vector<float> wide(1024, 1.0f);
  xw2.add<float>("x", exl3::DType::kF32, {2, 512}, wide);
  xw2.write(tmp / "wide.safetensors");
  r = run_cli(fmt::format("linear {} -p lm_head -i {} -o {}", q(model), q(tmp / "wide.safetensors"),
                          q(tmp / "y.st")));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("exceeds in_features"));
}

// A FIFO (or a folder) where a file is expected is refused at once, named, with exit status 1:
// open(2) of a FIFO for reading blocks until a writer comes, so reading it would hang forever.
// Every run is bounded by `timeout` (status 124 when it would have hung).
TEST(Cli, FifoWhereAFileIsExpectedIsRefused) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  namespace fs = std::filesystem;
  exl3::test::TempDir tmp;
  const std::string bounded = "timeout -k 5 30";
  auto expect_refused = [&](const std::string& args, const fs::path& file, const char* kind) {
    const auto r = run_cli(args, bounded);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(file.string() + ": not a regular file (it is " + kind + ")"))
        << args;
    EXPECT_THAT(r.out, HasSubstr("hint:")) << args;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("internal error"))) << args;
  };
  auto make_fifo = [](const fs::path& p) { ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0) << p; };
  // A writable copy of the (read-only) conformance model.
  auto copy_model = [&](const fs::path& to) {
    fs::create_directories(to);
    for (const auto& e : fs::directory_iterator(dir / "models" / "tiny-qwen3moe-exl3")) {
      fs::copy_file(e.path(), to / e.path().filename());
      fs::permissions(to / e.path().filename(), fs::perms::owner_write, fs::perm_options::add);
    }
  };

  // A valid EXL3 model folder (config, tokenizer) whose model.safetensors is a FIFO.
  const auto model = tmp / "m";
  copy_model(model);
  fs::remove(model / "model.safetensors");
  make_fifo(model / "model.safetensors");
  const auto weights = model / "model.safetensors";
  expect_refused("inspect " + q(model), weights, "a FIFO");
  expect_refused("inspect " + q(weights), weights, "a FIFO");
  expect_refused(fmt::format("generate {} --prompt hi -n 1", q(model)), weights, "a FIFO");
  expect_refused(fmt::format("serve {} --port 0", q(model)), weights, "a FIFO");

  // config.json as a FIFO beside valid weights.
  const auto good = tmp / "good";
  copy_model(good);
  fs::remove(good / "config.json");
  make_fifo(good / "config.json");
  expect_refused("inspect " + q(good), good / "config.json", "a FIFO");
  fs::remove(good / "config.json");
  fs::copy_file(dir / "models" / "tiny-qwen3moe-exl3" / "config.json", good / "config.json");

  // Text inputs: eval --text, tokenize --file, quantize --calibration; and quantize's source
  // weights.
  make_fifo(tmp / "text.txt");
  expect_refused(fmt::format("eval {} --text {}", q(good), q(tmp / "text.txt")), tmp / "text.txt",
                 "a FIFO");
  expect_refused(fmt::format("tokenize {} --file {}", q(good), q(tmp / "text.txt")),
                 tmp / "text.txt", "a FIFO");
  const auto hf = tmp / "hf";
  ASSERT_EQ(run_cli("sample-hf " + q(hf)).code, 0);
  expect_refused(fmt::format("quantize {} {} --bits 2 --calibration {}", q(hf), q(tmp / "out1"),
                             q(tmp / "text.txt")),
                 tmp / "text.txt", "a FIFO");
  fs::remove(hf / "model.safetensors");
  make_fifo(hf / "model.safetensors");
  expect_refused(fmt::format("quantize {} {} --bits 2", q(hf), q(tmp / "out2")),
                 hf / "model.safetensors", "a FIFO");

  // A folder where the weights file is expected.
  fs::remove(weights);
  fs::create_directories(weights);
  expect_refused("inspect " + q(model), weights, "a folder");
}

namespace {

// Output paths that cannot be written fail with exit status 1 and a message naming the path, the
// reason and a hint -- not "internal error" and status 2. `prefix` is where each command writes:
// a read-only folder (Permission denied), or a path under a regular file (Not a directory, which
// fails for root too).
void expect_outputs_refused(const std::filesystem::path& tmp, const std::filesystem::path& prefix,
                            const std::vector<std::string>& parts) {
  const auto hf = tmp / "hf", model = tmp / "m";
  ASSERT_EQ(run_cli("sample-hf " + q(hf)).code, 0);
  ASSERT_EQ(run_cli("sample " + q(model)).code, 0);
  const std::vector<std::pair<std::string, std::filesystem::path>> cmds = {
      {fmt::format("quantize {} {} --bits 2", q(hf), q(prefix / "out")), prefix / "out"},
      {fmt::format("sample {}", q(prefix / "s")), prefix / "s"},
      {fmt::format("sample-hf {}", q(prefix / "h")), prefix / "h"},
      {fmt::format("logits {} --tokens 1,2 --out {}", q(model), q(prefix / "l.safetensors")),
       prefix / "l.safetensors"},
      {fmt::format("dequant {} --prefix model.layers.0.self_attn.q_proj --out {}", q(model),
                   q(prefix / "w.safetensors")),
       prefix / "w.safetensors"},
  };
  for (const auto& [args, path] : cmds) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr("exl3: error: cannot create")) << args;
    EXPECT_THAT(r.out, HasSubstr(path.string())) << args;
    for (const auto& p : parts) EXPECT_THAT(r.out, HasSubstr(p)) << args;
    EXPECT_THAT(r.out, HasSubstr("hint:")) << args;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("internal error"))) << args;
  }
}

}  // namespace

TEST(Cli, OutputUnderARegularFileFailsClearly) {
  exl3::test::TempDir tmp;
  exl3::test::write_file(tmp / "file", "not a folder");
  expect_outputs_refused(tmp.path(), tmp / "file" / "sub",
                         {(tmp / "file").string() + " is a regular file, not a folder"});
  // quantize's OUT_DIR itself a file.
  const auto r = run_cli(fmt::format("quantize {} {} --bits 2", q(tmp / "hf"), q(tmp / "file")));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr((tmp / "file").string() + ": exists and is not a folder; hint:"));
}

TEST(Cli, ReadOnlyOutputFolderFailsClearly) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root, which ignores permission bits; "
                    "Cli.OutputUnderARegularFileFailsClearly covers the same paths for root";
  }
  namespace fs = std::filesystem;
  exl3::test::TempDir tmp;
  const auto ro = tmp / "ro";
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);  // 0500
  expect_outputs_refused(tmp.path(), ro, {"Permission denied", "pick a writable output folder"});
  // quantize into the read-only folder itself: its working folder cannot be created.
  auto r = run_cli(fmt::format("quantize {} {} --bits 2", q(tmp / "hf"), q(ro)));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("cannot create folder " + (ro / ".exl3-partial" / "units").string() +
                               ": Permission denied; hint: pick a writable output folder"));
  // A model folder that cannot be searched: the file system error is the user's (status 1).
  fs::create_directories(tmp / "closed");
  fs::rename(tmp / "m", tmp / "closed" / "m");
  fs::permissions(tmp / "closed", fs::perms::none);
  r = run_cli(fmt::format("generate {} --prompt hi -n 1", q(tmp / "closed" / "m")));
  fs::permissions(tmp / "closed", fs::perms::owner_all);
  fs::permissions(ro, fs::perms::owner_all);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr((tmp / "closed" / "m").string() + ": Permission denied; hint:"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("internal error")));
}

// `exl3 linear --device cuda`: the golden case on a GPU, a clear error without one.
TEST(Cli, LinearOnCudaDevice) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  exl3::test::TempDir tmp;
  const auto file = dir / "tensors" / "exl3_public_mcg.safetensors";
  const auto golden = exl3::TensorStore::open(file);
  const auto& x = golden.at("cb_mcg.k3.input.x");
  exl3::SafetensorsWriter xw;
  const auto xv = exl3::copy_tensor<uint16_t>(x);
  xw.add<uint16_t>("x", exl3::DType::kF16, x.info->shape, xv);
  xw.write(tmp / "x.safetensors");
  const auto r =
      run_cli(fmt::format("linear {} --prefix cb_mcg.k3.layer --device cuda --input {} --out {}",
                          q(file), q(tmp / "x.safetensors"), q(tmp / "y.safetensors")));
#if defined(EXL3_HAVE_CUDA)
  if (exl3::cuda::device_count() == 0) {
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr("no CUDA device"));
    return;
  }
  ASSERT_EQ(r.code, 0) << r.out;
  const auto y = exl3::read_as_float(exl3::TensorStore::open(tmp / "y.safetensors").at("y"));
  const auto ref = exl3::read_as_double(golden.at("cb_mcg.k3.expected.y_fp64"));
  EXPECT_LE(exl3::test::rel_l2(std::span<const float>(y), std::span<const double>(ref)), 1e-3);
#else
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("without CUDA"));
#endif
}

// `bench model`: --prepare-only writes the synthetic model and stops; a run on it at --tp 2 on the
// CPU reports every batch, the prefill and the tensor-parallel fields in --json (collectives are
// timed on GPUs only, so 0 here); --draft-tokens adds the speculative figures.
TEST(Cli, BenchModelPrepareOnlyThenTensorParallelJson) {
  exl3::test::TempDir tmp;
  const auto dir = tmp / "tiny";
  auto r = run_cli(
      fmt::format("bench model --synthetic tiny --layers 2 --out {} --prepare-only", q(dir)));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("ready in"));
  ASSERT_TRUE(std::filesystem::exists(dir / "config.json"));
  r = run_cli(fmt::format(
      "bench model {} --device cpu --tp 2 --batch 1,2 --steps 2 --context 4 --prefill 8 --json {}",
      q(dir), q(tmp / "b.json")));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto doc = nlohmann::json::parse(exl3::test::read_file(tmp / "b.json"));
  EXPECT_EQ(doc["tp"], 2);
  ASSERT_EQ(doc["decode"].size(), 2u);
  EXPECT_GT(doc["decode"][1]["tokens_per_second"].get<double>(), 0.0);
  EXPECT_EQ(doc["decode"][0]["collectives_ms"].get<double>(), 0.0);
  EXPECT_EQ(doc["prefill"]["tokens"], 8);
  r = run_cli(fmt::format("bench model {} --prepare-only", q(dir)));
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--prepare-only writes a --synthetic model"));
  // --draft-tokens: speculative decoding with every draft kept, then none, then adaptive, at
  // each batch size.
  r = run_cli(fmt::format(
      "bench model {} --device cpu --batch 1,2 --steps 6 --context 4 --prefill 0 --draft-tokens 2 "
      "--json {}",
      q(dir), q(tmp / "s.json")));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("every draft kept"));
  EXPECT_THAT(r.out, HasSubstr("none kept, adaptive"));
  const auto sp = nlohmann::json::parse(exl3::test::read_file(tmp / "s.json"))["speculative"];
  EXPECT_EQ(sp["draft_tokens"], 2);
  ASSERT_EQ(sp["batches"].size(), 2u);
  for (const auto& b : sp["batches"]) {
    EXPECT_EQ(b["all_kept_acceptance"].get<double>(), 1.0);
    EXPECT_EQ(b["none_kept_acceptance"].get<double>(), 0.0);
    for (const char* k : {"plain_tokens_per_second", "all_kept_tokens_per_second",
                          "none_kept_tokens_per_second", "adaptive_none_kept_tokens_per_second",
                          "verify_ms", "decode_step_ms", "free_draft_ceiling_tokens_per_second"}) {
      EXPECT_GT(b[k].get<double>(), 0.0) << k;
    }
  }
  EXPECT_EQ(sp["batches"][1]["batch"], 2);
  // --profile times CUDA ops: refused before loading on the CPU engine, with the hint.
  r = run_cli(
      fmt::format("bench model {} --device cpu --batch 1 --steps 1 --prefill 0 --profile", q(dir)));
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--profile times the ops of the single-GPU CUDA engine"));
}

// The CUDA tunables reach the engine commands through the CLI's environment reader, before
// anything is loaded: a malformed value fails naming it on --device cuda (with or without a GPU),
// and --device cpu, whose engine has no such tunables, does not read it.
TEST(Cli, EngineCommandsReadTheCudaTunablesOnCudaOnly) {
  exl3::test::TempDir tmp;
  const auto dir = tmp / "tiny";
  ASSERT_EQ(run_cli(fmt::format("bench model --synthetic tiny --layers 1 --out {} --prepare-only",
                                q(dir)))
                .code,
            0);
  const std::string logits =
      fmt::format("logits {} --tokens 1,2 --out {}", q(dir), q(tmp / "l.safetensors"));
  auto r = run_cli(logits + " --device cuda", "EXL3_MOE_TIERS=fast");
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("EXL3_MOE_TIERS='fast' is not one of auto, grid, passes"));
  r = run_cli(fmt::format("bench model {} --device cuda --batch 1 --steps 1 --context 2", q(dir)),
              "EXL3_MXFP8_GEMV_MAX_M=lots");
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("EXL3_MXFP8_GEMV_MAX_M='lots' is not a positive integer"));
  r = run_cli(logits + " --device cuda", "EXL3_GEMV_MAX_SPLITS=0");
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("EXL3_GEMV_MAX_SPLITS='0' is not a positive integer"));
  r = run_cli(logits + " --device cpu",
              "EXL3_MOE_TIERS=fast EXL3_MXFP8_GEMV_MAX_M=lots EXL3_GEMV_MIN_SPLIT_TILES=x");
  EXPECT_EQ(r.code, 0) << r.out;
}
