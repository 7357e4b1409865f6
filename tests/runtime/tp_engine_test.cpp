// The CPU tensor-parallel engine: N ranks in one process (own weight slices and KV heads, an
// in-process all-reduce / all-gather) against the single-rank reference engine on the same
// checkpoint. Sliced == unsliced to rel-L2 <= 1e-5 for dense and MoE models with EXL3 linears at
// TP 2/3/4, unquantized models with padded heads and straddling kv heads, rank-sliced experts,
// incremental decode; and the communicator and the fail-closed checks.
#include <algorithm>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/moe/reference.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/runtime/communicator.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/tp_linear.hpp"
#include "runtime_test_util.hpp"
#include "test_support.hpp"
#include "tp_test_util.hpp"

namespace exl3::runtime {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Engine> engine_at(const std::filesystem::path& dir, int tp,
                                  int64_t page_size = 32) {
  EngineOptions o;
  o.tp = tp;
  o.page_size = page_size;
  o.cache_tokens = 256;
  return load_engine(dir, o);
}

// TP logits vs the reference engine's, full pass and incremental decode.
double expect_tp_matches(const std::filesystem::path& dir, int tp, const std::vector<int32_t>& ids,
                         const char* what) {
  auto ref = engine_at(dir, 1);
  const auto want = forward_logits(*ref, ids);
  auto eng = engine_at(dir, tp, 4);
  const auto got = forward_logits(*eng, ids);
  EXPECT_EQ(got.size(), want.size());
  const double err = exl3::test::rel_l2(got, want);
  std::printf("%s TP %d: sliced vs unsliced logits rel-L2 %.3e\n", what, tp, err);
  EXPECT_LE(err, 1e-5) << what << " TP " << tp;
  // Prefill 3 tokens, then decode one at a time across pages of 4.
  const auto inc = test::prefill_then_decode(*eng, ids, 3);
  EXPECT_LE(exl3::test::rel_l2(inc, want), 1e-5) << what << " TP " << tp << " incremental";
  return err;
}

class TpSlicedEqualsUnsliced : public ::testing::TestWithParam<test::TpArch> {};

// Every projection EXL3 (head_dim 128, widths multiples of 128), TP 2, 3 and 4.
TEST_P(TpSlicedEqualsUnsliced, Exl3Linears) {
  const auto& c = GetParam();
  exl3::test::TempDir tmp;
  const auto dir = tmp / c.name;
  const uint64_t seed = exl3::test::test_seed();
  test::write_tp_model(dir, c.arch, seed);
  ASSERT_NE(Checkpoint::open(dir).find_linear("model.layers.0.self_attn.k_proj"), nullptr);
  ASSERT_NE(Checkpoint::open(dir).find_linear("lm_head"), nullptr);
  auto rng = exl3::test::make_rng();
  const auto ids = test::random_ids(rng, 9, 512);
  for (const int tp : {2, 3, 4}) expect_tp_matches(dir, tp, ids, c.name);
}

INSTANTIATE_TEST_SUITE_P(Runtime, TpSlicedEqualsUnsliced, ::testing::ValuesIn(test::kTpArchs),
                         [](const auto& p) { return std::string(p.param.name); });

// Multi-head latent attention cut by heads, every projection EXL3 (the shrunk synthetic
// DeepSeek-V3 layer): TP 2 equals TP 1; TP 4 would cut a head's 192 q channels inside a
// 128-channel block and is refused with the TP sizes that work.
TEST(TpEngine, MlaHeadsSliced) {
  exl3::test::TempDir tmp;
  test::write_small_deepseek(tmp.path(), exl3::test::test_seed());
  auto rng = exl3::test::make_rng();
  const auto ids = test::random_ids(rng, 9, 512);
  expect_tp_matches(tmp.path(), 2, ids, "deepseek-v3 MLA");
  EXPECT_THAT([&] { (void)engine_at(tmp.path(), 4); },
              ::testing::ThrowsMessage<Error>(::testing::AllOf(
                  HasSubstr("q_b_proj"), HasSubstr("cuts a 128-channel EXL3 block"),
                  HasSubstr("TP sizes that work for this model: 1, 2"))));
}

// Unquantized: 6 heads over 2 kv heads at TP 4 pads to 8 heads (the last rank holds none) and
// rank 1's heads 2, 3 straddle kv heads 0 and 1; a tied head and vocab 500 split unevenly.
TEST(TpEngine, UnquantizedPaddedHeadsAndStraddlingKv) {
  exl3::test::TempDir tmp;
  const auto dir = tmp / "llama_dense";
  test::TpModelOptions o;
  o.quantize = false;
  o.num_heads = 6;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.vocab = 500;
  test::write_tp_model(dir, HfArch::kLlama, exl3::test::test_seed(), o,
                       {{"tie_word_embeddings", true}});
  auto rng = exl3::test::make_rng();
  const auto ids = test::random_ids(rng, 7, 500);
  for (const int tp : {2, 3, 4, 5}) expect_tp_matches(dir, tp, ids, "llama unquantized");
}

// Rank-sliced experts (`.rank{r}` tensors, hybrid_tr3_tail tp 2): the TP-2 engine reads each
// rank's own tensors and equals the unsliced engine on the plain checkpoint.
TEST(TpEngine, RankSlicedExpertsEqualPlainCheckpoint) {
  exl3::test::TempDir tmp;
  const auto plain = tmp / "plain", sliced = tmp / "sliced";
  test::write_tp_model(plain, HfArch::kQwen3Moe, exl3::test::test_seed());
  test::write_rank_sliced_copy(plain, sliced, 2, {0, 1}, 4);
  ASSERT_EQ(Checkpoint::open(sliced).find_linear("model.layers.0.mlp.experts.0.gate_proj"),
            nullptr);
  auto rng = exl3::test::make_rng();
  const auto ids = test::random_ids(rng, 6, 512);
  auto ref = engine_at(plain, 1);
  const auto want = forward_logits(*ref, ids);
  auto eng = engine_at(sliced, 2);
  const double err = exl3::test::rel_l2(forward_logits(*eng, ids), want);
  std::printf("rank-sliced TP 2 vs plain unsliced: rel-L2 %.3e\n", err);
  EXPECT_LE(err, 1e-5);
  // A different runtime TP is an error, never a reshuffle.
  EXPECT_THAT([&] { engine_at(sliced, 4); },
              ::testing::ThrowsMessage<Error>(
                  ::testing::AllOf(HasSubstr("rank-sliced for TP 2"),
                                   HasSubstr("TP sizes that work for this model: 1, 2"))));
}

// head_dim 64 with EXL3 k/v: each rank computes the 128-channel block around its kv head.
TEST(TpEngine, Exl3KvBlocksCoverNeighbouringHeads) {
  exl3::test::TempDir tmp;
  const auto dir = tmp / "hd64";
  test::TpModelOptions o;
  o.head_dim = 64;
  test::write_tp_model(dir, HfArch::kQwen3, exl3::test::test_seed(), o);
  auto rng = exl3::test::make_rng();
  const auto ids = test::random_ids(rng, 7, 512);
  for (const int tp : {2, 3}) expect_tp_matches(dir, tp, ids, "qwen3 head_dim 64");
}

// The exllamav3-converted conformance model (head_dim 64, one 128-channel expert block) at TP 2
// and 3, against its fp64 reference logits as well as the single-rank engine.
TEST(TpEngine, ConformanceModel) {
  EXL3_REQUIRE_CONFORMANCE(conf);
  const auto model = conf / "models" / "tiny-qwen3moe-exl3";
  const auto store = TensorStore::open(model / "reference_logits.safetensors");
  std::vector<int32_t> ids;
  for (const int64_t id : copy_tensor<int64_t>(store.at("input_ids")))
    ids.push_back(static_cast<int32_t>(id));
  const auto fp64 = read_as_double(store.at("hf_dequant_fp64.logits"));
  for (const int tp : {2, 3}) {
    expect_tp_matches(model, tp, ids, "tiny-qwen3moe-exl3");
    auto eng = engine_at(model, tp);
    const double err = exl3::test::rel_l2(forward_logits(*eng, ids), fp64);
    std::printf("tiny-qwen3moe-exl3 TP %d vs hf_dequant_fp64: rel-L2 %.3e\n", tp, err);
    EXPECT_LE(err, 1e-4);
  }
  EXPECT_THAT([&] { engine_at(model, 4); },
              ::testing::ThrowsMessage<Error>(
                  ::testing::AllOf(HasSubstr("self_attn.q_proj: TP 4"),
                                   HasSubstr("TP sizes that work for this model: 1, 2, 3"))));
}

TEST(TpEngine, FailsClosed) {
  exl3::test::TempDir tmp;
  const auto ok = tmp / "ok";
  test::write_tp_model(ok, HfArch::kLlama, exl3::test::test_seed());
  EXPECT_THAT([&] { engine_at(ok, 0); },
              ::testing::ThrowsMessage<Error>(HasSubstr("--tp 0 must be at least 1")));
  // Bad ids and a full cache fail before any rank runs, leaving the sequence unchanged.
  auto eng = engine_at(ok, 2);
  const auto seq = eng->new_sequence();
  const std::vector<int32_t> bad = {1, 512};
  EXPECT_THAT([&] { eng->forward(seq, bad); },
              ::testing::ThrowsMessage<Error>(HasSubstr("outside the vocabulary")));
  const std::vector<int32_t> many(300, 1);
  EXPECT_THAT([&] { eng->forward(seq, many); },
              ::testing::ThrowsMessage<Error>(HasSubstr("KV cache is full")));
  EXPECT_EQ(eng->sequence_length(seq), 0);
  const std::vector<int32_t> two = {1, 2};
  EXPECT_EQ(eng->forward(seq, two).size(), 2u * 512u);
}

// One EXL3 linear with a bias, stored padded (real 300 -> 200 in 384 -> 256): the column slices
// concatenate to the unsliced Linear's output and the row slices sum to it, the bias added once.
// slice_moe_layer (what a GPU rank uploads from a plain checkpoint): the ranks' partial layer
// outputs sum to the whole layer's, for 2 and 4 ranks, with the rotation tables cut to match.
TEST(TpLinear, MoeLayerSlicesSumToTheWholeLayer) {
  exl3::test::TempDir tmp;
  const auto dir = tmp / "moe";
  test::write_tp_model(dir, HfArch::kQwen3Moe, exl3::test::test_seed());
  const auto ckpt = Checkpoint::open(dir);
  const auto layout = moe::read_moe_layout(ckpt);
  ASSERT_TRUE(layout.has_value());
  int layer = 0;
  while (!layout->has_layer(layer)) ++layer;
  const auto full = moe::load_moe_layer(ckpt, layer, 0, 1, layout->num_experts);
  auto rng = exl3::test::make_rng();
  const int64_t m = 5, H = full.hidden;
  std::vector<float> x(static_cast<size_t>(m * H));
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (auto& v : x) v = g(rng);
  moe::TopK routes{m, 2, {}, {}};
  for (int64_t t = 0; t < m; ++t) {
    const auto a = static_cast<int32_t>(rng() % static_cast<uint64_t>(full.num_experts()));
    routes.ids.push_back(a);
    routes.ids.push_back((a + 1) % full.num_experts());
    routes.weights.push_back(0.25f + static_cast<float>(rng() % 100) / 200.0f);
    routes.weights.push_back(0.5f);
  }
  std::vector<float> want(static_cast<size_t>(m * H)), got(want.size(), NAN);
  moe::moe_forward(full, routes, x.data(), m, want.data());
  for (const int tp : {2, 4}) {
    const auto ext = deal_extents(full.intermediate, tp, kTpBlock);
    std::vector<moe::MoeLayerWeights> ranks;
    for (int r = 0; r < tp; ++r) {
      if (ext[static_cast<size_t>(r)].empty()) continue;
      ranks.push_back(slice_moe_layer(full, ext[static_cast<size_t>(r)], r, tp));
      EXPECT_EQ(ranks.back().intermediate, ext[static_cast<size_t>(r)].count);
      EXPECT_EQ(ranks.back().rotations.intermediate.size(),
                static_cast<size_t>(full.num_experts() * 3 * ext[static_cast<size_t>(r)].count));
    }
    moe::moe_forward_ranks(ranks, routes, x.data(), m, got.data());
    const double err = exl3::test::rel_l2(got, want);
    std::printf("MoE layer %d sliced over %d ranks: rel-L2 %.3e\n", layer, tp, err);
    EXPECT_LE(err, 1e-5) << "TP " << tp;
  }
  EXPECT_THAT(
      [&] {
        slice_moe_layer(full, {64, 128}, 0, 2);
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("128-channel")));
}

TEST(TpLinear, SlicesRecomposeTheUnslicedLinear) {
  exl3::test::TempDir tmp;
  auto rng = exl3::test::make_rng();
  const int64_t sin = 384, sout = 256, in = 300, out = 200;
  const int k = 3;
  SafetensorsWriter w;
  std::vector<uint16_t> tr(static_cast<size_t>(sin / 16 * sout / 16 * 16 * k));
  for (auto& x : tr) x = static_cast<uint16_t>(rng());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> suh(sin), svh(sout);
  for (auto& x : suh) x = trellis::float_to_half(0.05f * nd(rng));
  for (auto& x : svh) x = trellis::float_to_half(nd(rng));
  std::vector<float> bias(sout);
  for (auto& x : bias) x = nd(rng);
  w.add("lin.trellis", DType::kI16, {sin / 16, sout / 16, 16 * k}, std::span<const uint16_t>(tr));
  w.add("lin.suh", DType::kF16, {sin}, std::span<const uint16_t>(suh));
  w.add("lin.svh", DType::kF16, {sout}, std::span<const uint16_t>(svh));
  w.add("lin.bias", DType::kF32, {sout}, std::span<const float>(bias));
  const int32_t marker = trellis::kMul1Marker;
  w.add("lin.mul1", DType::kI32, {}, std::span<const int32_t>(&marker, 1));
  w.write(tmp / "model.safetensors");
  const auto ckpt = Checkpoint::open(tmp / "model.safetensors");
  const auto full = Linear::load(ckpt, "lin", in, out);
  const int64_t m = 3;
  std::vector<float> x(static_cast<size_t>(m * in));
  for (auto& v : x) v = nd(rng);
  std::vector<float> want(static_cast<size_t>(m * out));
  full.forward(x.data(), m, want.data());
  for (const int tp : {2, 3, 4}) {
    TpLinearPlan col{"lin", TpSplit::kColumn, true, in, out, deal_extents(out, tp, kTpBlock)};
    std::vector<float> cat(want.size());
    const auto cs = RankLinear::slice_all(ckpt, col);
    for (size_t r = 0; r < cs.size(); ++r) {
      const Extent e = col.ranks[r];
      ASSERT_EQ(cs[r].out_features(), e.count);
      std::vector<float> y(static_cast<size_t>(m * e.count));
      cs[r].forward(x.data(), m, y.data());
      for (int64_t t = 0; t < m; ++t)
        std::copy_n(y.data() + t * e.count, e.count, cat.data() + t * out + e.begin);
    }
    EXPECT_EQ(cat, want) << "column TP " << tp;  // the same tiles in the same order: bit-exact
    TpLinearPlan row{"lin", TpSplit::kRow, true, in, out, deal_extents(in, tp, kTpBlock)};
    std::vector<float> sum(want.size(), 0.0f);
    const auto rs = RankLinear::slice_all(ckpt, row);
    for (size_t r = 0; r < rs.size(); ++r) {
      const Extent e = row.ranks[r];
      std::vector<float> xs(static_cast<size_t>(m * e.count)), y(want.size());
      for (int64_t t = 0; t < m; ++t)
        std::copy_n(x.data() + t * in + e.begin, e.count, xs.data() + t * e.count);
      rs[r].forward(xs.data(), m, y.data());
      for (size_t i = 0; i < y.size(); ++i) sum[i] += y[i];
    }
    EXPECT_LE(exl3::test::rel_l2(sum, want), 1e-6) << "row TP " << tp;
  }
  EXPECT_THAT(
      [&] {
        slice_exl3(cpu::LinearView::of(Exl3LinearData::load(ckpt, "lin")), TpSplit::kColumn, 8, 128,
                   true);
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("not whole 16-channel tiles")));
}

// ---- the in-process communicator --------------------------------------------------------------

template <typename F>
void on_ranks(std::vector<std::unique_ptr<Communicator>>& comms, F f) {
  std::vector<std::thread> th;
  for (auto& c : comms) th.emplace_back([&f, &c] { f(*c); });
  for (auto& t : th) t.join();
}

TEST(Communicator, AllReduceSumsInRankOrderAndGathers) {
  auto rng = exl3::test::make_rng();
  const int n = 4;
  const size_t count = 1000;
  std::vector<std::vector<float>> data(n);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& d : data)
    for (size_t i = 0; i < count; ++i) d.push_back(nd(rng));
  std::vector<float> want(count);
  for (size_t i = 0; i < count; ++i)
    want[i] = ((data[0][i] + data[1][i]) + data[2][i]) + data[3][i];
  auto bufs = data;
  std::vector<std::vector<float>> gathered(n, std::vector<float>(n * count));
  auto comms = make_in_process_group(n);
  on_ranks(comms, [&](Communicator& c) {
    auto& b = bufs[static_cast<size_t>(c.rank())];
    for (int rep = 0; rep < 3; ++rep) {  // back-to-back collectives reuse the barrier
      c.all_gather(data[static_cast<size_t>(c.rank())], gathered[static_cast<size_t>(c.rank())]);
    }
    c.all_reduce_sum(b);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(bufs[static_cast<size_t>(r)], want) << "rank " << r;  // bit-identical on every rank
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(
          std::equal(data[static_cast<size_t>(q)].begin(), data[static_cast<size_t>(q)].end(),
                     gathered[static_cast<size_t>(r)].begin() + static_cast<ptrdiff_t>(q * count)));
    }
  }
  EXPECT_EQ(comms[2]->size(), 4);
  EXPECT_THROW(make_in_process_group(0), Error);
}

TEST(Communicator, MismatchAndAbortNeverHang) {
  auto comms = make_in_process_group(3);
  std::vector<std::string> errors(3);
  on_ranks(comms, [&](Communicator& c) {
    std::vector<float> v(static_cast<size_t>(10 + c.rank()), 1.0f);
    try {
      c.all_reduce_sum(v);
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_THAT(e, HasSubstr("all_reduce_sum: rank"));
  auto group = make_in_process_group(3);
  std::vector<int> threw(3, 0);
  on_ranks(group, [&](Communicator& c) {
    if (c.rank() == 1) {
      c.abort();  // rank 1 failed before its collective
      return;
    }
    std::vector<float> v(4, 1.0f);
    try {
      c.all_reduce_sum(v);
    } catch (const Error& e) {
      threw[static_cast<size_t>(c.rank())] =
          std::string(e.what()).find("aborted") != std::string::npos;
    }
  });
  EXPECT_EQ(threw, (std::vector<int>{1, 0, 1}));
}

}  // namespace
}  // namespace exl3::runtime

namespace exl3::runtime {
namespace {

// Loading reports one step per decoder layer, on the single-rank and the TP engine; the printer
// draws a bar on a terminal and stays silent for scripts.
TEST(LoadProgress, OneReportPerLayerAndABarOnTerminals) {
  exl3::test::TempDir tmp;
  const auto dir = tmp / "m";
  test::write_tp_model(dir, HfArch::kQwen3Moe, exl3::test::test_seed());
  const auto layers = static_cast<int64_t>(describe_model(Checkpoint::open(dir)).layers.size());
  for (const int tp : {1, 2}) {
    std::vector<LoadProgress> seen;
    EngineOptions o;
    o.tp = tp;
    o.cache_tokens = 64;
    o.load_progress = [&](const LoadProgress& p) { seen.push_back(p); };
    (void)load_engine(dir, o);
    ASSERT_EQ(static_cast<int64_t>(seen.size()), layers) << "TP " << tp;
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i].layers_done, static_cast<int64_t>(i + 1));
      EXPECT_EQ(seen[i].layers_total, layers);
      if (i > 0) {
        EXPECT_GE(seen[i].elapsed, seen[i - 1].elapsed);
      }
    }
  }
  const auto printed = [](bool terminal, int64_t total) {
    std::FILE* f = std::tmpfile();
    EXPECT_NE(f, nullptr);
    const auto print = make_load_progress_printer(f, terminal);
    for (int64_t i = 1; i <= total; ++i) print({i, total, 0.5 * static_cast<double>(i)});
    std::rewind(f);
    char buf[4096] = {};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    return std::string(buf, n);
  };
  EXPECT_THAT(printed(true, 2), HasSubstr("loading layer 2/2"));
  // Logs: a line per quarter only (48 layers -> 12, 24, 36, 48), the last layer always, and
  // nothing in the first second (3 layers at 0.5 s each: layers 2 and 3).
  const std::string log = printed(false, 48);
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 4) << log;
  EXPECT_THAT(log, HasSubstr("loaded layer 12/48 (25%) in 6.0 s"));
  EXPECT_THAT(log, HasSubstr("loaded layer 48/48 (100%) in 24.0 s"));
  const std::string short_log = printed(false, 3);
  EXPECT_EQ(std::count(short_log.begin(), short_log.end(), '\n'), 2) << short_log;
  EXPECT_THAT(short_log, ::testing::Not(HasSubstr("layer 1/3"))) << short_log;
}

}  // namespace
}  // namespace exl3::runtime
