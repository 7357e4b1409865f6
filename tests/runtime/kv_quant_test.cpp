// The quantized KV cache formats on the CPU (exl3/cpu/kv_codec.hpp): the paged cache stores and
// loads codes exactly as the codec makes them across pages; the key rotation is its own inverse
// and keeps dot products; attention over a quantized cache is attention over its decoded keys and
// values, and close to the unquantized attention; the CPU engine with each format stays close to
// the fp32 cache and reuses prefix-cached codes bit for bit; models a quantized cache cannot hold
// are refused at load.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/cpu/kv_codec.hpp"
#include "exl3/error.hpp"
#include "exl3/runtime/cpu_ops.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/kv_cache.hpp"
#include "runtime_test_util.hpp"
#include "test_support.hpp"

namespace exl3::runtime {
namespace {

using ::testing::HasSubstr;
constexpr KvFormat kQuantized[] = {KvFormat::kFp8, KvFormat::kQ8, KvFormat::kQ4};

std::vector<float> normal(std::mt19937_64& rng, size_t n, float sigma = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// What the codec makes of a row of `width` channels.
std::vector<float> codec_round_trip(KvFormat f, const float* x, int64_t width) {
  std::vector<float> y(static_cast<size_t>(width));
  std::vector<uint8_t> codes(static_cast<size_t>(cpu::kv_code_bytes(f, cpu::kKvGroup)));
  for (int64_t g = 0; g < width / cpu::kKvGroup; ++g) {
    const uint16_t s = cpu::kv_encode_group(f, x + g * cpu::kKvGroup, codes.data());
    cpu::kv_decode_group(f, codes.data(), s, y.data() + g * cpu::kKvGroup);
  }
  return y;
}

TEST(KvQuant, CacheStoresAndLoadsTheCodecsValuesAcrossPages) {
  auto rng = exl3::test::make_rng();
  for (const KvFormat f : {KvFormat::kNative, KvFormat::kFp8, KvFormat::kQ8, KvFormat::kQ4}) {
    PagedKvCache c({{64, 64}, {128, 32}}, 3, 12, true, f);
    const auto other = c.add_sequence();
    c.reserve(other, 5);  // interleave pages with another sequence
    const auto seq = c.add_sequence();
    const int64_t n = 10;
    c.reserve(seq, n);
    const auto k = normal(rng, static_cast<size_t>(n * 128), 3.0f);
    const auto v = normal(rng, static_cast<size_t>(n * 64), 0.5f);
    for (int64_t t = 0; t < n; ++t) c.store(1, seq, t, k.data() + t * 128, v.data() + t * 32);
    for (int64_t t = 0; t < 5; ++t) {  // the other sequence's slots must not move ours
      const auto junk = normal(rng, 128, 9.0f);
      c.store(1, other, t, junk.data(), junk.data());
    }
    std::vector<float> kd(static_cast<size_t>(n * 128), NAN), vd(static_cast<size_t>(n * 32), NAN);
    c.load(1, seq, 0, n, kd.data(), vd.data());
    for (int64_t t = 0; t < n; ++t) {
      const auto kw = cpu::kv_quantized(f)
                          ? codec_round_trip(f, k.data() + t * 128, 128)
                          : std::vector<float>(k.begin() + t * 128, k.begin() + (t + 1) * 128);
      const auto vw = cpu::kv_quantized(f)
                          ? codec_round_trip(f, v.data() + t * 32, 32)
                          : std::vector<float>(v.begin() + t * 32, v.begin() + (t + 1) * 32);
      ASSERT_EQ(std::vector<float>(kd.begin() + t * 128, kd.begin() + (t + 1) * 128), kw)
          << cpu::kv_format_name(f) << " t " << t;
      ASSERT_EQ(std::vector<float>(vd.begin() + t * 32, vd.begin() + (t + 1) * 32), vw)
          << cpu::kv_format_name(f) << " t " << t;
    }
    // A partial range reads the same rows.
    std::vector<float> k3(128), v3(32);
    c.load(1, seq, 3, 4, k3.data(), v3.data());
    EXPECT_EQ(k3, std::vector<float>(kd.begin() + 3 * 128, kd.begin() + 4 * 128));
  }
}

TEST(KvQuant, SizesAndRefusals) {
  PagedKvCache q4({{256, 256}, {64, 64}}, 4, 2, true, KvFormat::kQ4);
  // q4: half a byte per channel plus an fp16 per 32 channels, K and V.
  EXPECT_EQ(q4.bytes_per_token(), 2u * (128 + 16) + 2u * (32 + 4));
  EXPECT_EQ(q4.bytes(), q4.bytes_per_token() * 8);
  PagedKvCache native({{256, 256}}, 4, 2);
  EXPECT_EQ(native.bytes_per_token(), 2u * 256 * 4);
  const auto s = q4.add_sequence();
  q4.reserve(s, 1);
  EXPECT_THAT(exl3::test::error_of([&] { (void)q4.key(0, s, 0); }), HasSubstr("load()"));
  EXPECT_THAT(exl3::test::error_of([] {
                PagedKvCache({{48, 48}}, 4, 2, true, KvFormat::kQ8);
              }),
              HasSubstr("groups of 32"));
}

TEST(KvQuant, KeyRotationIsItsOwnInverseAndKeepsDots) {
  auto rng = exl3::test::make_rng();
  for (const int64_t hd : {32, 64, 128, 256}) {
    const auto a = normal(rng, static_cast<size_t>(3 * hd));
    const auto b = normal(rng, static_cast<size_t>(3 * hd));
    auto ra = a, rb = b;
    cpu_ops::rotate_heads(ra.data(), 3, hd);
    cpu_ops::rotate_heads(rb.data(), 3, hd);
    for (int64_t r = 0; r < 3; ++r) {
      double d0 = 0, d1 = 0;
      for (int64_t i = 0; i < hd; ++i) {
        d0 += static_cast<double>(a[static_cast<size_t>(r * hd + i)]) *
              b[static_cast<size_t>(r * hd + i)];
        d1 += static_cast<double>(ra[static_cast<size_t>(r * hd + i)]) *
              rb[static_cast<size_t>(r * hd + i)];
      }
      EXPECT_NEAR(d1, d0, 1e-4 * std::sqrt(static_cast<double>(hd))) << "hd " << hd;
    }
    EXPECT_NE(ra, a);
    cpu_ops::rotate_heads(ra.data(), 3, hd);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(ra[i], a[i], 1e-5) << "hd " << hd;
  }
}

// Queries over a cache of quantized keys (both rotated in the integer formats): the attention of
// the decoded rows (exactly), and close to the fp32 attention of the original q, K, V.
TEST(KvQuant, AttentionReadsTheDecodedCacheAndStaysCloseToFp32) {
  auto rng = exl3::test::make_rng();
  const int64_t nh = 8, nkv = 2, hd = 64, total = 40, start = 33, m = total - start;
  const int64_t w = nkv * hd;
  // Keys with RoPE-like large channels, which the rotation spreads over the head.
  auto k = normal(rng, static_cast<size_t>(total * w));
  for (int64_t t = 0; t < total * nkv; ++t) k[static_cast<size_t>(t * hd + 5)] *= 12.0f;
  const auto v = normal(rng, static_cast<size_t>(total * w));
  const auto q = normal(rng, static_cast<size_t>(m * nh * hd), 0.5f);
  PagedKvCache native({{w, w}}, 4, 12);
  const auto ns = native.add_sequence();
  native.reserve(ns, total);
  for (int64_t t = 0; t < total; ++t) native.store(0, ns, t, k.data() + t * w, v.data() + t * w);
  std::vector<float> want(q.size());
  cpu_ops::gqa_attention(q.data(), m, start, native, 0, ns, {nh, nkv, hd}, 0.125f, want.data());
  // Relative L2 of the attention output, measured at 0.025-0.027 / 0.006-0.007 / 0.11-0.14 over
  // seeds; a wrong decode or a missing query rotation gives about 1.
  const std::pair<KvFormat, double> bounds[] = {
      {KvFormat::kFp8, 0.05}, {KvFormat::kQ8, 0.012}, {KvFormat::kQ4, 0.2}};
  for (const auto& [f, bound] : bounds) {
    PagedKvCache c({{w, w}}, 4, 12, true, f);
    const auto s = c.add_sequence();
    c.reserve(s, total);
    auto kr = k, qr = q;
    if (cpu::kv_rotates_keys(f)) {
      cpu_ops::rotate_heads(kr.data(), total * nkv, hd);
      cpu_ops::rotate_heads(qr.data(), m * nh, hd);
    }
    for (int64_t t = 0; t < total; ++t) c.store(0, s, t, kr.data() + t * w, v.data() + t * w);
    std::vector<float> got(q.size(), NAN);
    cpu_ops::gqa_attention(qr.data(), m, start, c, 0, s, {nh, nkv, hd}, 0.125f, got.data());
    // The same attention over the decoded rows in a native cache.
    std::vector<float> kd(kr.size()), vd(v.size());
    c.load(0, s, 0, total, kd.data(), vd.data());
    PagedKvCache plain({{w, w}}, 4, 12);
    const auto ps = plain.add_sequence();
    plain.reserve(ps, total);
    for (int64_t t = 0; t < total; ++t) plain.store(0, ps, t, kd.data() + t * w, vd.data() + t * w);
    std::vector<float> decoded(q.size());
    cpu_ops::gqa_attention(qr.data(), m, start, plain, 0, ps, {nh, nkv, hd}, 0.125f,
                           decoded.data());
    EXPECT_EQ(got, decoded) << cpu::kv_format_name(f);
    const double err = exl3::test::rel_l2(got, want);
    std::printf("%s cache: attention rel-L2 %.4f vs fp32\n",
                std::string(cpu::kv_format_name(f)).c_str(), err);
    EXPECT_LT(err, bound) << cpu::kv_format_name(f);
    EXPECT_GT(err, 0.0) << cpu::kv_format_name(f);
  }
}

// The CPU engine on a random Qwen3: every format close to the fp32 cache over a prefill and a
// few decode steps, the bytes per token it reports, and a prefix-cached prompt's codes reused bit
// for bit.
TEST(KvQuant, CpuEngineFormatsStayCloseAndPrefixReuseIsExact) {
  exl3::test::TempDir dir;
  test::write_model(dir.path(), HfArch::kQwen3, exl3::test::test_seed());
  auto rng = exl3::test::make_rng();
  const auto ids = test::random_ids(rng, 24, 512);
  EngineOptions eo;
  eo.page_size = 4;
  eo.cache_tokens = 128;
  auto native = load_engine(dir.path(), eo);
  const auto want = test::prefill_then_decode(*native, ids, 20);
  // Logits rel-L2 of this random model, measured at 0.046-0.049 / 0.010-0.012 / 0.16-0.22
  // over seeds; a wrong decode or a missing query rotation gives about 1.
  const std::pair<KvFormat, double> bounds[] = {
      {KvFormat::kFp8, 0.08}, {KvFormat::kQ8, 0.02}, {KvFormat::kQ4, 0.35}};
  for (const auto& [f, bound] : bounds) {
    eo.kv_format = f;
    eo.prefix_cache = true;
    auto e = load_engine(dir.path(), eo);
    const auto info = e->kv_cache_info();
    EXPECT_EQ(info.format, f);
    // 2 layers, 2 kv heads of 64: K and V codes plus an fp16 per 32 channels.
    EXPECT_EQ(info.bytes_per_token,
              2u * 2u * static_cast<uint64_t>(cpu::kv_code_bytes(f, 128) + 128 / 32 * 2));
    const auto got = test::prefill_then_decode(*e, ids, 20);
    const double err = exl3::test::rel_l2(got, want);
    std::printf("%s cache: logits rel-L2 %.4f vs the fp32 cache\n",
                std::string(cpu::kv_format_name(f)).c_str(), err);
    EXPECT_LT(err, bound) << cpu::kv_format_name(f);
    EXPECT_GT(err, 0.0) << cpu::kv_format_name(f);
    // The prefill again: its 5 full pages are adopted, the rest computed over them.
    const auto s = e->new_sequence();
    const auto first = std::span(ids).first(20);
    EXPECT_EQ(e->adopt_prefix(s, first), 16);
    const auto tail = e->forward(s, first.subspan(16), LogitsMode::kAll);
    EXPECT_EQ(tail, std::vector<float>(got.begin() + 16 * 512, got.begin() + 20 * 512))
        << cpu::kv_format_name(f);
    e->drop_sequence(s);
  }
  EXPECT_EQ(native->kv_cache_info().bytes_per_token, 2u * 2u * 128u * 4u);
}

TEST(KvQuant, ModelsAQuantizedCacheCannotHoldAreRefused) {
  EngineOptions eo;
  eo.kv_format = KvFormat::kQ4;
  EXPECT_THAT(exl3::test::error_of([&] {
                (void)load_engine(exl3::test::model_data_dir() / "deepseek_v3_qlora", eo);
              }),
              HasSubstr("latent cache"));
  exl3::test::TempDir dir;
  test::write_model(dir.path(), HfArch::kQwen3, exl3::test::test_seed());
  ModelSpec spec = describe_model(Checkpoint::open(dir.path()));
  std::get<model::GqaAttentionSpec>(spec.layers[1].attention).head_dim = 80;
  EXPECT_THAT(exl3::test::error_of([&] { check_kv_format(spec, KvFormat::kFp8); }),
              HasSubstr("head_dim 80 (layer 1)"));
  EXPECT_NO_THROW(check_kv_format(spec, KvFormat::kNative));
}

}  // namespace
}  // namespace exl3::runtime
