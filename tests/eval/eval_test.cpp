// exl3::evaluate against a straightforward recomputation: logits of whole windows from
// runtime::forward_logits, windows laid out by Hugging Face's sliding-window loop written out
// here, softmax / NLL / KL / argmax computed naively in long double. Plus the window plan, the
// bundled text, KL of a model against itself, and the error paths.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/eval/builtin_text.hpp"
#include "exl3/eval/eval.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/format/synthetic_hf.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/text/tokenizer.hpp"
#include "exl3/trellis/half.hpp"
#include "test_support.hpp"

namespace exl3 {
namespace {

using ::testing::HasSubstr;

// A small dense synthetic model (runs unquantized on the CPU runtime).
std::filesystem::path write_dense(const exl3::test::TempDir& tmp, const std::string& name,
                                  HfArch arch, uint64_t seed, int64_t vocab = 512) {
  SyntheticHfSpec s;
  s.arch = arch;
  s.seed = seed;
  s.num_layers = 2;
  s.hidden_size = 128;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.intermediate_size = 256;
  s.init_std = 0.08;  // peakier distributions than the default, so top-1 disagreements happen
  s.vocab_size = vocab;
  write_synthetic_hf_model(tmp / name, s);
  return tmp / name;
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = d(rng);
  return ids;
}

struct Naive {
  long double nll = 0, ref_nll = 0, kl = 0, kl_max = 0;
  int64_t agree = 0, scored = 0;
};

// log-softmax of one row, naively.
std::vector<long double> log_softmax(std::span<const float> z) {
  long double mx = -std::numeric_limits<long double>::infinity();
  for (const float x : z) mx = std::max<long double>(mx, x);
  long double sum = 0;
  for (const float x : z) sum += std::exp(static_cast<long double>(x) - mx);
  std::vector<long double> out(z.size());
  for (size_t v = 0; v < z.size(); ++v)
    out[v] = static_cast<long double>(z[v]) - mx - std::log(sum);
  return out;
}

// Hugging Face's perplexity loop: windows every `stride` tokens; each scores its last
// end - prev_end tokens (never its own first token).
Naive naive_eval(runtime::Engine& model, runtime::Engine* ref, const std::vector<int32_t>& ids,
                 int64_t ctx, int64_t stride) {
  Naive r;
  const auto n = static_cast<int64_t>(ids.size());
  const auto vocab = static_cast<size_t>(model.spec().vocab_size);
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += stride) {
    const int64_t end = std::min(begin + ctx, n);
    const int64_t trg = end - prev_end;
    const std::vector<int32_t> win(ids.begin() + begin, ids.begin() + end);
    const auto z = runtime::forward_logits(model, win);
    const auto zr = ref ? runtime::forward_logits(*ref, win) : std::vector<float>();
    for (int64_t t = std::max(end - trg, begin + 1); t < end;
         ++t) {  // target t, predicted by row t-1-begin
      const auto row = static_cast<size_t>(t - 1 - begin);
      const auto lp = log_softmax(std::span<const float>(z).subspan(row * vocab, vocab));
      const auto target = static_cast<size_t>(ids[static_cast<size_t>(t)]);
      r.nll -= lp[target];
      ++r.scored;
      if (!ref) continue;
      const auto lq = log_softmax(std::span<const float>(zr).subspan(row * vocab, vocab));
      r.ref_nll -= lq[target];
      long double kl = 0;
      for (size_t v = 0; v < vocab; ++v) kl += std::exp(lq[v]) * (lq[v] - lp[v]);
      r.kl += kl;
      r.kl_max = std::max(r.kl_max, kl);
      const auto am = std::max_element(lp.begin(), lp.end()) - lp.begin();
      const auto ar = std::max_element(lq.begin(), lq.end()) - lq.begin();
      r.agree += am == ar ? 1 : 0;
    }
    prev_end = end;
    if (end == n) break;
  }
  return r;
}

runtime::EngineOptions kv(int64_t tokens) {
  runtime::EngineOptions eo;
  eo.page_size = 4;
  eo.cache_tokens = tokens;
  return eo;
}

void expect_rel(double got, long double want, double tol, const char* what) {
  EXPECT_LE(std::abs(got - static_cast<double>(want)),
            tol * std::max(1e-12, std::abs(static_cast<double>(want))))
      << what << ": got " << got << ", want " << static_cast<double>(want);
}

TEST(EvalWindows, EveryTokenScoredAtMostOnce) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(2, 300)(rng);
    const int64_t ctx = std::uniform_int_distribution<int64_t>(2, 64)(rng);
    const int64_t stride = std::uniform_int_distribution<int64_t>(1, ctx)(rng);
    const auto ws = plan_eval_windows(n, ctx, stride);
    std::vector<int> hits(static_cast<size_t>(n), 0);
    int64_t windows = 0;
    for (const auto& w : ws) {
      EXPECT_LT(w.begin, w.first_target);
      EXPECT_LT(w.first_target, w.end) << "a window scores at least one token";
      EXPECT_LE(w.end - w.begin, ctx);
      EXPECT_EQ(w.begin % stride, 0);
      for (int64_t t = w.first_target; t < w.end; ++t) ++hits[static_cast<size_t>(t)];
      ++windows;
    }
    EXPECT_EQ(hits[0], 0);
    // Overlapping windows score every token after the first; disjoint ones every token but the
    // windows' first (multiples of the context), which have nothing before them in their window.
    for (int64_t t = 1; t < n; ++t) {
      const int want = stride < ctx || t % ctx != 0 ? 1 : 0;
      EXPECT_EQ(hits[static_cast<size_t>(t)], want)
          << "token " << t << " n " << n << " ctx " << ctx << " stride " << stride;
    }
    EXPECT_EQ(windows, static_cast<int64_t>(ws.size()));
  }
  EXPECT_THROW(plan_eval_windows(1, 8, 8), Error);
  EXPECT_THROW(plan_eval_windows(10, 1, 1), Error);
  EXPECT_THROW(plan_eval_windows(10, 8, 9), Error);
  EXPECT_THROW(plan_eval_windows(10, 8, 0), Error);
}

TEST(Eval, PerplexityMatchesNaiveComputation) {
  exl3::test::TempDir tmp;
  auto rng = exl3::test::make_rng();
  const auto dir = write_dense(tmp, "q3", HfArch::kQwen3, rng());
  auto engine = runtime::load_engine(dir, kv(64));
  const auto ids = random_tokens(rng, 37 + rng() % 20, 512);
  for (const int64_t chunk : {int64_t{5}, int64_t{256}}) {
    EvalOptions o;
    o.context = 16;
    o.chunk = chunk;
    std::vector<EvalProgress> seen;
    const auto r =
        evaluate(*engine, nullptr, ids, o, [&](const EvalProgress& p) { seen.push_back(p); });
    const auto want = naive_eval(*engine, nullptr, ids, 16, 16);
    EXPECT_EQ(r.scored, want.scored);
    EXPECT_EQ(r.context, 16);
    EXPECT_EQ(r.stride, 16);
    const auto n = static_cast<int64_t>(ids.size());
    EXPECT_EQ(r.windows, (n - 2) / 16 + 1);     // a last window of one token scores nothing
    EXPECT_EQ(r.scored, n - 1 - (n - 1) / 16);  // every token but 0, 16, 32, ...
    expect_rel(r.nll, want.nll / want.scored, 1e-5, "nll");
    expect_rel(r.perplexity, std::exp(want.nll / want.scored), 1e-5, "perplexity");
    EXPECT_FALSE(r.reference.has_value());
    EXPECT_GT(r.perplexity, 1.0);
    // Progress: monotonic, ends complete.
    ASSERT_FALSE(seen.empty());
    for (size_t i = 1; i < seen.size(); ++i) {
      EXPECT_GE(seen[i].scored, seen[i - 1].scored);
      EXPECT_GE(seen[i].window, seen[i - 1].window);
    }
    EXPECT_EQ(seen.back().scored, r.scored);
    EXPECT_EQ(seen.back().to_score, r.scored);
    EXPECT_EQ(seen.back().window, r.windows);
    EXPECT_EQ(engine->free_cache_tokens(), 64);  // every window's sequence was dropped
  }
}

TEST(Eval, KlTop1AndBothPerplexitiesMatchNaiveComputation) {
  exl3::test::TempDir tmp;
  auto rng = exl3::test::make_rng();
  const uint64_t seed = rng();
  const auto a = write_dense(tmp, "a", HfArch::kLlama, seed);
  const auto b = write_dense(tmp, "b", HfArch::kLlama, seed + 1);
  auto model = runtime::load_engine(a, kv(32)), ref = runtime::load_engine(b, kv(32));
  const auto ids = random_tokens(rng, 41 + rng() % 10, 512);
  EvalOptions o;
  o.context = 16;
  o.stride = 6;  // overlapping windows, Hugging Face style
  o.chunk = 4;
  const auto r = evaluate(*model, ref.get(), ids, o);
  const auto want = naive_eval(*model, ref.get(), ids, 16, 6);
  ASSERT_TRUE(r.reference.has_value());
  EXPECT_EQ(r.scored, static_cast<int64_t>(ids.size()) - 1);
  EXPECT_EQ(r.scored, want.scored);
  const auto& s = *r.reference;
  expect_rel(r.nll, want.nll / want.scored, 1e-5, "nll");
  expect_rel(s.nll, want.ref_nll / want.scored, 1e-5, "reference nll");
  expect_rel(s.perplexity, std::exp(want.ref_nll / want.scored), 1e-5, "reference perplexity");
  expect_rel(s.kl, want.kl / want.scored, 1e-4, "kl");
  expect_rel(s.kl_max, want.kl_max, 1e-4, "kl_max");
  EXPECT_GT(s.kl, 1e-3);  // different random models
  EXPECT_EQ(s.top1_agree, want.agree);
  EXPECT_DOUBLE_EQ(s.top1_agreement,
                   static_cast<double>(want.agree) / static_cast<double>(want.scored));
  std::printf("two random llama models: ppl %.3f vs %.3f, KL %.5f, top-1 %.1f%%\n", r.perplexity,
              s.perplexity, s.kl, 100.0 * s.top1_agreement);
  const auto j = r.to_json();
  EXPECT_EQ(j["reference"]["top1_agree"].get<int64_t>(), s.top1_agree);
  EXPECT_DOUBLE_EQ(j["perplexity"].get<double>(), r.perplexity);
}

TEST(Eval, ModelAgainstItselfHasZeroKlAndFullAgreement) {
  exl3::test::TempDir tmp;
  auto rng = exl3::test::make_rng();
  const auto dir = write_dense(tmp, "q3", HfArch::kQwen3, rng());
  auto a = runtime::load_engine(dir, kv(32)), b = runtime::load_engine(dir, kv(32));
  const auto ids = random_tokens(rng, 30, 512);
  EvalOptions o;
  o.context = 12;
  o.chunk = 5;
  const auto r = evaluate(*a, b.get(), ids, o);
  ASSERT_TRUE(r.reference.has_value());
  EXPECT_EQ(r.reference->kl, 0.0);
  EXPECT_EQ(r.reference->kl_max, 0.0);
  EXPECT_EQ(r.reference->top1_agree, r.scored);
  EXPECT_EQ(r.reference->top1_agreement, 1.0);
  EXPECT_EQ(r.reference->perplexity, r.perplexity);
  // One engine as both model and reference: two sequences at a time.
  auto c = runtime::load_engine(dir, kv(24));
  const auto self = evaluate(*c, c.get(), ids, o);
  EXPECT_EQ(self.reference->kl, 0.0);
  EXPECT_EQ(self.perplexity, r.perplexity);
  auto small = runtime::load_engine(dir, kv(12));
  EXPECT_THROW(evaluate(*small, small.get(), ids, o), Error);
}

TEST(Eval, TextThroughTheTokenizerCapsAndLimits) {
  exl3::test::TempDir tmp;
  auto rng = exl3::test::make_rng();
  const auto dir = write_dense(tmp, "q3", HfArch::kQwen3, rng());
  // max_position_embeddings caps the window.
  auto cfg = nlohmann::json::parse(read_text_file(dir / "config.json"));
  cfg["max_position_embeddings"] = 24;
  write_file_atomic(dir / "config.json", cfg.dump(2));
  const std::string text =
      "The quick brown fox jumps over the lazy dog, twice: def f(x): return x * 2\n";
  EvalOptions o;
  o.context = 2048;
  o.max_tokens = 50;
  EvalModels m;
  m.model = dir;
  m.reference = dir;
  const auto r = evaluate_text(m, text, o);
  const auto ids = Tokenizer::load(dir).encode(text, true);
  EXPECT_EQ(r.text_tokens, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(r.tokens, 50);
  EXPECT_EQ(r.context, 24);
  EXPECT_EQ(r.windows, 3);  // 24 + 24 + 2
  EXPECT_EQ(r.reference->kl, 0.0);
  // The same as scoring the first 50 ids directly.
  auto engine = runtime::load_engine(dir, kv(24));
  const std::vector<int32_t> first(ids.begin(), ids.begin() + 50);
  const auto want = naive_eval(*engine, nullptr, first, 24, 24);
  expect_rel(r.nll, want.nll / want.scored, 1e-5, "nll");
}

TEST(Eval, BuiltinTextIsTheBundledFile) {
  const std::string file =
      exl3::test::read_file(std::filesystem::path(EXL3_SOURCE_DIR) / "data" / "builtin_text.txt");
  EXPECT_EQ(builtin_text(), file);
  EXPECT_GT(builtin_text().size(), 4000u);
  EXPECT_EQ(load_eval_text("builtin"), file);
  exl3::test::TempDir tmp;
  const auto dir = write_dense(tmp, "q3", HfArch::kQwen3, 5);
  // Valid UTF-8 that the byte-level tokenizer turns into one token per byte (no merges).
  EXPECT_EQ(Tokenizer::load(dir).encode(builtin_text(), false).size(), builtin_text().size());
}

// The calibration corpus is the bundled file, large enough for the default calibration (8 rows
// of 128 tokens) many times over even at a byte per token, valid UTF-8, varied from its first rows
// on, and disjoint from the evaluation text: no 48-byte window of one occurs in the other.
TEST(Eval, CalibrationTextIsBundledAndNotTheEvaluationText) {
  const std::string file = exl3::test::read_file(std::filesystem::path(EXL3_SOURCE_DIR) / "data" /
                                                 "calibration_text.txt");
  const std::string_view cal = builtin_calibration_text(), ev = builtin_text();
  EXPECT_EQ(cal, file);
  EXPECT_GT(cal.size(), 40000u);
  exl3::test::TempDir tmp;
  const auto dir = write_dense(tmp, "q3", HfArch::kQwen3, 5);
  EXPECT_EQ(Tokenizer::load(dir).encode(cal, false).size(), cal.size());  // UTF-8, byte tokens
  const size_t w = 48;
  std::set<std::string_view> windows;
  for (size_t i = 0; i + w <= ev.size(); ++i) windows.insert(ev.substr(i, w));
  size_t shared = 0;
  for (size_t i = 0; i + w <= cal.size(); ++i) shared += windows.contains(cal.substr(i, w));
  EXPECT_EQ(shared, 0u);
  // The first 8 x 128 bytes already hold code and prose in more than one script.
  const std::string_view head = cal.substr(0, 4096);
  EXPECT_NE(head.find('{'), std::string_view::npos);
  EXPECT_NE(head.find(". "), std::string_view::npos);
  EXPECT_TRUE(std::any_of(head.begin(), head.end(), [](char c) { return (c & 0x80) != 0; }));
}

TEST(Eval, ErrorsAreClear) {
  exl3::test::TempDir tmp;
  auto rng = exl3::test::make_rng();
  const auto dir = write_dense(tmp, "m", HfArch::kQwen3, rng());
  auto expect_error = [](auto&& fn, const std::string& want) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one containing: " << want;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(want));
    }
  };
  EvalModels m;
  m.model = dir;
  EvalOptions o;
  o.context = 16;
  // Texts: empty, one token, missing / empty / folder files.
  expect_error([&] { evaluate_text(m, "", o, {}, "t.txt"); }, "t.txt: the text is empty");
  expect_error([&] { evaluate_text(m, "x", o, {}, "t.txt"); }, "gives 1 token(s)");
  expect_error([&] { load_eval_text((tmp / "missing.txt").string()); },
               "missing.txt: no such file");
  exl3::test::write_file(tmp / "empty.txt", "");
  expect_error([&] { load_eval_text((tmp / "empty.txt").string()); },
               "empty.txt: the file is empty");
  expect_error([&] { load_eval_text(tmp.path().string()); }, "is a folder");
  exl3::test::write_file(tmp / "bad.txt", "caf\xff");
  expect_error([&] { evaluate_text(m, load_eval_text((tmp / "bad.txt").string()), o); }, "UTF-8");
  // Options.
  o.stride = 17;
  expect_error([&] { evaluate_text(m, "hello world", o); }, "stride 17 must be in 1..context (16)");
  o.stride = 0;
  o.context = 1;
  expect_error([&] { evaluate_text(m, "hello world", o); }, "context 1 is too short");
  o.context = 16;
  // A missing model folder.
  EvalModels gone = m;
  gone.model = tmp / "nothing";
  expect_error([&] { evaluate_text(gone, "hello world", o); }, "nothing");
#if !defined(EXL3_HAVE_CUDA)
  // CUDA goes through load_engine, which says this build has none.
  EvalModels cuda = m;
  cuda.device = runtime::Device::kCuda;
  expect_error([&] { evaluate_text(cuda, "hello world", o); }, "cuda");
#endif

  // Vocabulary mismatches: a larger vocab_size (same tokenizer) ...
  const auto big = write_dense(tmp, "big", HfArch::kQwen3, 3, 640);
  EvalModels vm = m;
  vm.reference = big;
  expect_error([&] { evaluate_text(vm, "hello world", o); },
               "the vocabularies differ: the model has 512 logits");
  // ... and a tokenizer whose ids mean other text.
  const auto other = write_dense(tmp, "other", HfArch::kQwen3, 4);
  auto tj = nlohmann::ordered_json::parse(read_text_file(other / "tokenizer.json"));
  auto& vocab = tj["model"]["vocab"];
  std::swap(vocab["a"], vocab["b"]);
  write_file_atomic(other / "tokenizer.json", tj.dump());
  vm.reference = other;
  expect_error([&] { evaluate_text(vm, "hello world", o); }, "the tokenizers differ at token id");
  // Ids outside the model's vocabulary.
  auto engine = runtime::load_engine(dir, kv(16));
  const std::vector<int32_t> bad = {1, 2, 512};
  expect_error([&] { evaluate(*engine, nullptr, bad, o); },
               "token id 512 at position 2 is outside the vocabulary");
  // Too small a KV cache for the window.
  auto tiny = runtime::load_engine(dir, kv(8));
  const std::vector<int32_t> ok = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  expect_error([&] { evaluate(*tiny, nullptr, ok, o); },
               "KV cache has room for 8 tokens, a window needs 10");
}

TEST(Eval, NonFiniteLogitsFailNamingTheModel) {
  exl3::test::TempDir tmp;
  const auto dir = write_dense(tmp, "nan", HfArch::kLlama, 9);
  {  // A NaN in the final norm: every logit becomes NaN.
    const auto store = TensorStore::open(dir);
    SafetensorsWriter w;
    for (const auto& n : store.names()) {
      const auto& ref = store.at(n);
      if (n == "model.norm.weight") {
        std::vector<uint16_t> v(static_cast<size_t>(ref.info->shape[0]),
                                trellis::float_to_bf16(1.0f));
        v[3] = 0x7fc0;  // bf16 NaN
        w.add(n, ref.info->dtype, ref.info->shape, std::span<const uint16_t>(v));
        continue;
      }
      w.add(n, ref.info->dtype, ref.info->shape, ref.bytes());
    }
    const std::string blob = w.serialize();
    std::filesystem::remove(dir / "model.safetensors");
    write_file_atomic(dir / "model.safetensors", std::string_view(blob));
  }
  auto engine = runtime::load_engine(dir, kv(16));
  const std::vector<int32_t> ids = {5, 6, 7, 8};
  EvalOptions o;
  o.context = 16;
  try {
    (void)evaluate(*engine, nullptr, ids, o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("non-finite logit at token position 0"));
    EXPECT_THAT(e.what(), HasSubstr("config.json"));
  }
}

}  // namespace
}  // namespace exl3
