// CPU backend building blocks against hand-computed values: RoPE variants, RMSNorm, GQA head
// mapping and attention over the paged cache, the cache's page accounting, the sampler.
#include <cmath>
#include <numbers>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/runtime/cpu_ops.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/runtime/kv_cache.hpp"
#include "exl3/runtime/linear.hpp"
#include "exl3/model/rope.hpp"
#include "test_support.hpp"

namespace exl3::runtime {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

RopeSpec rope_of(const json& config, int64_t head_dim = 8) {
  return parse_rope(config, head_dim, "m/config.json");
}

TEST(Rope, DefaultInvFreqAndRotation) {
  const auto r = rope_of({{"rope_theta", 10000.0}});
  EXPECT_EQ(r.type, RopeType::kDefault);
  EXPECT_EQ(r.rotary_dim, 8);
  const auto inv = rope_inv_freq(r);
  ASSERT_EQ(inv.size(), 4u);
  // 1 / 10000^(2i/8) = 1, 0.1, 0.01, 0.001
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_FLOAT_EQ(inv[1], 0.1f);
  EXPECT_FLOAT_EQ(inv[2], 0.01f);
  EXPECT_FLOAT_EQ(inv[3], 0.001f);

  // Position 3: pair (0, 4) rotates by 3 rad, pair (1, 5) by 0.3 rad (NeoX halves).
  const RopeTable t(r);
  float c[4], s[4];
  t.at(3, c, s);
  EXPECT_NEAR(c[0], std::cos(3.0), 1e-7);
  EXPECT_NEAR(s[1], std::sin(0.3), 1e-7);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  apply_rope(x, c, s, 4);
  EXPECT_NEAR(x[0], 1 * std::cos(3.0) - 5 * std::sin(3.0), 1e-6);
  EXPECT_NEAR(x[4], 5 * std::cos(3.0) + 1 * std::sin(3.0), 1e-6);
  EXPECT_NEAR(x[1], 2 * std::cos(0.3) - 6 * std::sin(0.3), 1e-6);
  EXPECT_NEAR(x[5], 6 * std::cos(0.3) + 2 * std::sin(0.3), 1e-6);
  // Position 0 is the identity.
  t.at(0, c, s);
  float y[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  apply_rope(y, c, s, 4);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(y[i], static_cast<float>(i + 1));
}

TEST(Rope, LinearDividesFrequencies) {
  const auto r = rope_of({{"rope_theta", 10000.0}, {"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}}});
  EXPECT_EQ(r.type, RopeType::kLinear);
  const auto inv = rope_inv_freq(r);
  EXPECT_FLOAT_EQ(inv[0], 0.25f);
  EXPECT_FLOAT_EQ(inv[1], 0.025f);
  EXPECT_FLOAT_EQ(inv[3], 0.00025f);
}

TEST(Rope, Llama3Bands) {
  // original 64, low 1, high 4: wavelength 2*pi/f. f=1 (6.3 < 16) kept; f=0.1 (62.8, between 16
  // and 64) smoothed: s = (64/62.83 - 1)/3, (1-s)*0.1/4 + s*0.1 = 0.0254648; f=0.01, 0.001
  // (> 64) divided by 4.
  const auto r = rope_of({{"rope_theta", 10000.0},
                          {"rope_scaling",
                           {{"rope_type", "llama3"},
                            {"factor", 4.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 64}}}});
  EXPECT_EQ(r.type, RopeType::kLlama3);
  const auto inv = rope_inv_freq(r);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], 0.025464790894703257, 1e-8);
  EXPECT_FLOAT_EQ(inv[2], 0.0025f);
  EXPECT_FLOAT_EQ(inv[3], 0.00025f);
}

TEST(Rope, YarnRampAndAttentionFactor) {
  // dim 8, theta 1e4, original 64: correction range [floor(-0.497), ceil(1.008)] = [0, 2]; the
  // ramp (i - 0) / 2 gives extrapolation weight 1, 0.5, 0, 0: 1, (0.025 + 0.1)/2, 0.0025, 0.00025.
  const auto r = rope_of({{"rope_theta", 10000.0},
                          {"max_position_embeddings", 256},
                          {"rope_parameters",
                           {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}}}});
  EXPECT_EQ(r.type, RopeType::kYarn);
  const auto inv = rope_inv_freq(r);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_FLOAT_EQ(inv[1], 0.0625f);
  EXPECT_FLOAT_EQ(inv[2], 0.0025f);
  EXPECT_FLOAT_EQ(inv[3], 0.00025f);
  EXPECT_NEAR(r.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-12);
  float c[4], s[4];
  RopeTable(r).at(0, c, s);
  EXPECT_NEAR(c[0], 1.1386294, 1e-6);  // cos and sin carry the attention factor
  // mscale / mscale_all_dim ratio; explicit attention_factor wins.
  auto r2 = rope_of({{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
                     {"max_position_embeddings", 64}});
  EXPECT_DOUBLE_EQ(r2.attention_factor, 1.0);
  EXPECT_EQ(r2.original_max_position_embeddings, 64);
  r2 = rope_of({{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"attention_factor", 0.5}}},
                {"max_position_embeddings", 64}});
  EXPECT_DOUBLE_EQ(r2.attention_factor, 0.5);
  // Without original_max_position_embeddings nor max_position_embeddings yarn cannot work.
  EXPECT_THROW(rope_of({{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}}}), Error);
}

TEST(Rope, PartialRotaryLeavesTheRest) {
  const auto r = rope_of({{"rope_parameters", {{"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}}}}, 8);
  EXPECT_EQ(r.rotary_dim, 4);
  const RopeTable t(r);
  ASSERT_EQ(t.half(), 2);
  // 1 / 10000^(2i/4): 1, 0.01
  EXPECT_FLOAT_EQ(t.inv_freq()[1], 0.01f);
  float c[2], s[2];
  t.at(5, c, s);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  apply_rope(x, c, s, t.half());
  EXPECT_NEAR(x[0], 1 * std::cos(5.0) - 3 * std::sin(5.0), 1e-6);
  EXPECT_NEAR(x[2], 3 * std::cos(5.0) + 1 * std::sin(5.0), 1e-6);
  for (int i = 4; i < 8; ++i) EXPECT_FLOAT_EQ(x[i], static_cast<float>(i + 1));
}

TEST(RmsNorm, HandValues) {
  // rms([1,2,3,4]) = sqrt(30/4); y = x / rms * w
  const float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f};
  float y[4];
  cpu_ops::rms_norm(x, w, 1, 4, 0.0, y);
  const double rms = std::sqrt(7.5);
  EXPECT_NEAR(y[0], 1 / rms, 1e-7);
  EXPECT_NEAR(y[1], 2 / rms, 1e-7);
  EXPECT_NEAR(y[2], 6 / rms, 1e-6);
  EXPECT_NEAR(y[3], 2 / rms, 1e-7);
  // eps enters under the root; rows are independent; in place works.
  float z[8] = {1, 2, 3, 4, 0, 0, 0, 3};
  cpu_ops::rms_norm(z, w, 2, 4, 1.0, z);
  EXPECT_NEAR(z[0], 1 / std::sqrt(8.5), 1e-7);
  EXPECT_NEAR(z[7], 0.5 * 3 / std::sqrt(9.0 / 4 + 1.0), 1e-7);
}

TEST(Gqa, HeadMapping) {
  // 8 query heads over 2 kv heads: 0-3 -> 0, 4-7 -> 1 (transformers' repeat_kv).
  for (int h = 0; h < 8; ++h) EXPECT_EQ(cpu_ops::kv_head_of(h, 8, 2), h / 4);
  for (int h = 0; h < 6; ++h) EXPECT_EQ(cpu_ops::kv_head_of(h, 6, 6), h);  // MHA
  for (int h = 0; h < 6; ++h) EXPECT_EQ(cpu_ops::kv_head_of(h, 6, 1), 0);  // MQA
}

// Attention over a paged cache (pages of 3, non-contiguous) equals a naive causal softmax with
// kv head h / (heads / kv_heads).
TEST(Gqa, AttentionMatchesNaive) {
  auto rng = exl3::test::make_rng();
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t nh = 6, nkv = 2, hd = 8, total = 11, start = 7, m = total - start;
  PagedKvCache cache({{nkv * hd, nkv * hd}, {nkv * hd, nkv * hd}}, 3, 16);
  const auto other = cache.add_sequence();
  cache.reserve(other, 4);  // interleave pages with another sequence
  const auto seq = cache.add_sequence();
  cache.reserve(seq, total);
  std::vector<float> k(static_cast<size_t>(total * nkv * hd)), v(k.size()), q(static_cast<size_t>(m * nh * hd));
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  for (int64_t t = 0; t < total; ++t) {
    std::copy_n(k.data() + t * nkv * hd, nkv * hd, cache.key(1, seq, t));
    std::copy_n(v.data() + t * nkv * hd, nkv * hd, cache.value(1, seq, t));
  }
  std::vector<float> out(q.size());
  const float scale = 0.3f;
  cpu_ops::gqa_attention(q.data(), m, start, cache, 1, seq, {nh, nkv, hd}, scale, out.data());
  for (int64_t t = 0; t < m; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / (nh / nkv), n = start + t + 1;
      std::vector<double> s(static_cast<size_t>(n));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int64_t c = 0; c < hd; ++c) d += q[static_cast<size_t>((t * nh + h) * hd + c)] * k[static_cast<size_t>((j * nkv + g) * hd + c)];
        s[static_cast<size_t>(j)] = d * scale;
        mx = std::max(mx, d * scale);
      }
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int64_t c = 0; c < hd; ++c) {
        double o = 0;
        for (int64_t j = 0; j < n; ++j) o += s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>((j * nkv + g) * hd + c)];
        EXPECT_NEAR(out[static_cast<size_t>((t * nh + h) * hd + c)], o, 1e-5) << "t " << t << " h " << h;
      }
    }
  // Changing kv head 1 changes query heads 3..5 only.
  for (int64_t t = 0; t < total; ++t) cache.value(1, seq, t)[hd] += 1.0f;
  std::vector<float> out2(q.size());
  cpu_ops::gqa_attention(q.data(), m, start, cache, 1, seq, {nh, nkv, hd}, scale, out2.data());
  for (int64_t h = 0; h < nh; ++h) {
    const bool changed = out2[static_cast<size_t>(h * hd)] != out[static_cast<size_t>(h * hd)];
    EXPECT_EQ(changed, h >= 3) << "head " << h;
  }
}

TEST(KvCache, PagesPoolAndErrors) {
  PagedKvCache c({{4, 4}}, 4, 5);
  EXPECT_EQ(c.free_pages(), 5);
  const auto a = c.add_sequence();
  c.reserve(a, 1);
  EXPECT_EQ(c.page_table(a).size(), 1u);
  c.advance(a, 1);
  for (int i = 0; i < 3; ++i) {  // decode within the first page: no new page
    c.reserve(a, 1);
    c.advance(a, 1);
  }
  EXPECT_EQ(c.page_table(a).size(), 1u);
  c.reserve(a, 1);  // token 4 starts page 2
  EXPECT_EQ(c.page_table(a).size(), 2u);
  c.advance(a, 1);
  EXPECT_EQ(c.length(a), 5);
  const auto b = c.add_sequence();
  c.reserve(b, 12);
  EXPECT_EQ(c.free_pages(), 0);
  // Distinct pages, and slots of different sequences never alias.
  EXPECT_NE(c.key(0, a, 0), c.key(0, b, 0));
  EXPECT_EQ(c.key(0, a, 1), c.key(0, a, 0) + 4);
  try {
    c.reserve(a, 4);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("KV cache is full"));
  }
  EXPECT_EQ(c.page_table(a).size(), 2u);  // nothing taken on failure
  EXPECT_THROW(c.advance(a, 4), Error);   // only 3 reserved slots left
  c.remove_sequence(b);
  EXPECT_EQ(c.free_pages(), 3);
  EXPECT_THROW((void)c.length(b), Error);
  c.clear(a);
  EXPECT_EQ(c.length(a), 0);
  EXPECT_EQ(c.free_pages(), 5);
  EXPECT_THROW(PagedKvCache({{4, 4}}, 0, 5), Error);
}

TEST(DenseMatrix, MatmulTransposed) {
  // W [3, 2]; y = x W^T + b
  const auto w = DenseMatrix::from_f32({1, 2, 3, 4, 5, 6}, 3, 2);
  const float x[4] = {1, 1, 2, -1};
  float y[6];
  const std::vector<float> b = {0.5f, 0, 0};
  w.matmul_t(x, 2, y, b);
  EXPECT_FLOAT_EQ(y[0], 3.5f);
  EXPECT_FLOAT_EQ(y[1], 7.0f);
  EXPECT_FLOAT_EQ(y[2], 11.0f);
  EXPECT_FLOAT_EQ(y[3], 0.5f);
  EXPECT_FLOAT_EQ(y[4], 2.0f);
  EXPECT_FLOAT_EQ(y[5], 4.0f);
  const auto lin = Linear::dense(DenseMatrix::from_f32({1, 2, 3, 4, 5, 6}, 3, 2));
  EXPECT_FALSE(lin.quantized());
  EXPECT_FALSE(lin.exl3_view());
  lin.forward(x, 2, y);
  EXPECT_FLOAT_EQ(y[5], 4.0f);
}

TEST(Sampler, GreedyTopPAndSeeds) {
  const std::vector<float> logits = {0.1f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(argmax(logits), 1);  // lowest id among ties
  Sampler greedy({0.0f, 1.0f, 7});
  EXPECT_EQ(greedy.sample(logits), 1);
  // A tiny nucleus keeps only the most likely token (ties: lowest id).
  Sampler narrow({1.0f, 0.01f, 3});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(narrow.sample(logits), 1);
  // Same seed, same draws; all draws from the support.
  Sampler a({1.0f, 1.0f, 42}), b({1.0f, 1.0f, 42});
  std::vector<int> counts(4);
  for (int i = 0; i < 2000; ++i) {
    const int32_t x = a.sample(logits);
    EXPECT_EQ(x, b.sample(logits));
    ++counts[static_cast<size_t>(x)];
  }
  // p = softmax: token 3 has p ~ 0.02, tokens 1, 2 ~ 0.46 each.
  EXPECT_GT(counts[1], 800);
  EXPECT_GT(counts[2], 800);
  EXPECT_LT(counts[3], 120);
  EXPECT_THROW(Sampler({-1.0f, 1.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, 0.0f, 0}), Error);
}

TEST(Sampler, TopKMinPAndRepetitionPenalty) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 1.8f};
  auto opts = [](float t, uint64_t seed) {
    SamplingOptions o;
    o.temperature = t;
    o.seed = seed;
    return o;
  };
  // top_k 2 at a high temperature: only the two most likely ids ever come out, both of them.
  auto k2 = opts(50.0f, 5);
  k2.top_k = 2;
  Sampler sk(k2);
  std::vector<int> counts(5);
  for (int i = 0; i < 400; ++i) ++counts[static_cast<size_t>(sk.sample(logits))];
  EXPECT_EQ(counts[0] + counts[3] + counts[4], 0);
  EXPECT_GT(counts[1], 100);
  EXPECT_GT(counts[2], 100);
  // min_p 0.5 at T = 1: p(i) / p(max) = exp(l_i - 2) keeps 1.9 (0.90) and 1.8 (0.82), drops 0.1 and -1.
  auto mp = opts(1.0f, 9);
  mp.min_p = 0.5f;
  Sampler sm(mp);
  std::fill(counts.begin(), counts.end(), 0);
  for (int i = 0; i < 600; ++i) ++counts[static_cast<size_t>(sm.sample(logits))];
  EXPECT_EQ(counts[0] + counts[3], 0);
  EXPECT_GT(counts[1], 100);
  EXPECT_GT(counts[2], 100);
  EXPECT_GT(counts[4], 100);
  // Repetition penalty 2 (greedy): id 1 seen before drops 2.0 -> 1.0, so 1.9 wins; a negative
  // logit is multiplied (-1 -> -2); ids outside the vocabulary in the history are ignored.
  auto rp = opts(0.0f, 0);
  rp.repetition_penalty = 2.0f;
  Sampler sr(rp);
  const std::vector<int32_t> history = {1, 1, 3, 99};
  EXPECT_EQ(sr.sample(logits, history), 2);
  EXPECT_EQ(sr.sample(logits), 1);  // no history: no penalty
  const std::vector<int32_t> seen_1_2 = {1, 2};
  EXPECT_EQ(sr.sample(logits, seen_1_2), 4);  // 1.8 now beats 1.0 and 0.95
  // Neutral values change nothing: same draws as the plain sampler with the same seed.
  auto neutral = opts(1.0f, 77);
  neutral.top_k = 0;
  neutral.min_p = 0.0f;
  neutral.repetition_penalty = 1.0f;
  Sampler a(neutral), b(opts(1.0f, 77));
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits, history), b.sample(logits));
  auto bad = opts(1.0f, 0);
  bad.top_k = -1;
  EXPECT_THROW(Sampler{bad}, Error);
  bad = opts(1.0f, 0);
  bad.min_p = 1.5f;
  EXPECT_THROW(Sampler{bad}, Error);
  bad = opts(1.0f, 0);
  bad.repetition_penalty = 0.0f;
  EXPECT_THROW(Sampler{bad}, Error);
}

}  // namespace
}  // namespace exl3::runtime
