// The quantized KV cache formats on CUDA (exl3/cpu/kv_codec.hpp) against the CPU codec:
//   - qk_norm_rope_store writes the codes and scales the host codec makes of the keys (rotated in
//     q8 / q4) and the values, bit for bit, and rotates the queries as cpu_ops::rotate_heads does;
//   - decode (split-KV and one block) and prefill attention over a quantized cache equal an fp64
//     softmax over the decoded rows (the decode kernel stages decoded rows as fp16, so its
//     reference rounds them the same way), NaN-poisoned outputs, a token's bits the same alone
//     and in a batch;
//   - the CUDA engine with each format: its error against the fp32 cache that of the CPU engine
//     with the same format (prefill, replayed decode graphs), and the memory it reports.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../runtime/runtime_test_util.hpp"
#include "exl3/cpu/kv_codec.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/runtime/cpu_ops.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/trellis/half.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace {

namespace cu = exl3::cuda;
namespace cpu = exl3::cpu;
namespace tr = exl3::trellis;
using cpu::KvFormat;
using cu::DeviceBuffer;

constexpr KvFormat kQuantized[] = {KvFormat::kFp8, KvFormat::kQ8, KvFormat::kQ4};
constexpr int kPage = 16;

std::vector<float> normal(std::mt19937_64& rng, size_t n, float sigma) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& b) {
  std::vector<T> h(b.bytes() / sizeof(T));
  EXL3_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), "download");
  return h;
}

// A paged cache of `slots` token slots (pages dealt in shuffled order to the sequences) in format
// f, with its host codes and the rows they decode to.
struct Cache {
  KvFormat f;
  int nkv, hd;
  int64_t slots;
  std::vector<uint8_t> kq, vq;
  std::vector<uint16_t> ks, vs;
  std::vector<float> kd, vd;  // decoded [slots, nkv * hd]
  DeviceBuffer dkq, dvq, dks, dvs;

  Cache(KvFormat format, int kv_heads, int head_dim, int64_t n)
      : f(format), nkv(kv_heads), hd(head_dim), slots(n) {
    const auto w = static_cast<size_t>(nkv * hd);
    kq.assign(static_cast<size_t>(n * nkv * cpu::kv_code_bytes(f, hd)), 0);
    vq.assign(kq.size(), 0);
    ks.assign(static_cast<size_t>(n) * w / cpu::kKvGroup, 0);
    vs.assign(ks.size(), 0);
    kd.assign(static_cast<size_t>(n) * w, 0.0f);
    vd.assign(kd.size(), 0.0f);
  }
  // Encodes row `slot` of keys and values (nkv * hd each) on the host.
  void put(int64_t slot, const float* k, const float* v) {
    const int64_t w = nkv * hd, groups = w / cpu::kKvGroup;
    const int64_t gb = cpu::kv_code_bytes(f, cpu::kKvGroup);
    for (int64_t g = 0; g < groups; ++g) {
      const auto at = static_cast<size_t>(slot * groups + g);
      ks[at] = cpu::kv_encode_group(f, k + g * cpu::kKvGroup, kq.data() + at * gb);
      vs[at] = cpu::kv_encode_group(f, v + g * cpu::kKvGroup, vq.data() + at * gb);
      cpu::kv_decode_group(f, kq.data() + at * gb, ks[at],
                           kd.data() + slot * w + g * cpu::kKvGroup);
      cpu::kv_decode_group(f, vq.data() + at * gb, vs[at],
                           vd.data() + slot * w + g * cpu::kKvGroup);
    }
  }
  void upload() {
    dkq = DeviceBuffer::upload(kq, "kq");
    dvq = DeviceBuffer::upload(vq, "vq");
    dks = DeviceBuffer::upload(ks, "ks");
    dvs = DeviceBuffer::upload(vs, "vs");
  }
  // Device buffers of the same sizes, filled with 0xAB (for the store kernel to overwrite).
  void allocate_poisoned() {
    for (auto* b : {&dkq, &dvq, &dks, &dvs}) {
      *b = DeviceBuffer((b == &dkq || b == &dvq ? kq.size() : ks.size() * 2), "cache");
      EXL3_CUDA_CHECK(cudaMemset(b->get(), 0xAB, b->bytes()), "poison");
    }
  }
  cu::PagedKv kv(const int32_t* tables, int32_t max_pages) const {
    cu::PagedKv p{nullptr, nullptr, tables, max_pages, kPage};
    p.format = f;
    p.kq = dkq.as<uint8_t>();
    p.vq = dvq.as<uint8_t>();
    p.ks = dks.as<uint16_t>();
    p.vs = dvs.as<uint16_t>();
    return p;
  }
};

// Page tables of `seqs` sequences of up to max_pages pages each, pages dealt in shuffled order.
std::vector<int32_t> shuffled_tables(int seqs, int max_pages, std::mt19937_64& rng) {
  std::vector<int32_t> t(static_cast<size_t>(seqs * max_pages));
  std::iota(t.begin(), t.end(), 0);
  std::shuffle(t.begin(), t.end(), rng);
  return t;
}

int64_t slot_of(const std::vector<int32_t>& tables, int max_pages, int row, int pos) {
  return static_cast<int64_t>(tables[static_cast<size_t>(row * max_pages + pos / kPage)]) * kPage +
         pos % kPage;
}

TEST(CudaKvQuant, StoreWritesTheHostCodecsBits) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  for (const int hd : {32, 64, 128, 256}) {
    for (const KvFormat f : kQuantized) {
      const int nh = 8, nkv = 2, n = 37;
      const int max_pages = (n + kPage - 1) / kPage;
      const auto tables = shuffled_tables(1, max_pages, rng);
      auto q = normal(rng, static_cast<size_t>(n * nh * hd), 1.0f);
      auto k = normal(rng, static_cast<size_t>(n * nkv * hd), 2.0f);
      for (int i = 0; i < n * nkv; ++i) k[static_cast<size_t>(i * hd + 3)] *= 15.0f;  // outliers
      const auto v = normal(rng, static_cast<size_t>(n * nkv * hd), 0.7f);
      std::vector<int32_t> pos(static_cast<size_t>(n)), rows(static_cast<size_t>(n), 0);
      std::iota(pos.begin(), pos.end(), 0);
      Cache want(f, nkv, hd, static_cast<int64_t>(max_pages) * kPage);
      auto kr = k, qr = q;
      if (cpu::kv_rotates_keys(f)) {
        exl3::runtime::cpu_ops::rotate_heads(kr.data(), n * nkv, hd);
        exl3::runtime::cpu_ops::rotate_heads(qr.data(), n * nh, hd);
      }
      for (int t = 0; t < n; ++t) {
        want.put(slot_of(tables, max_pages, 0, t), kr.data() + t * nkv * hd,
                 v.data() + t * nkv * hd);
      }
      Cache got(f, nkv, hd, want.slots);
      got.allocate_poisoned();
      // Slots no token is written to keep the poison: compare only the written ones.
      auto dq = DeviceBuffer::upload(q, "q");
      const auto dk = DeviceBuffer::upload(k, "k"), dv = DeviceBuffer::upload(v, "v");
      const auto dt = DeviceBuffer::upload(tables, "tables");
      const auto dp = DeviceBuffer::upload(pos, "pos"), dr = DeviceBuffer::upload(rows, "rows");
      const std::vector<float> cs(2, 0.0f);  // no RoPE channels (rotary_half 0)
      const auto dcs = DeviceBuffer::upload(cs, "rope");
      const cu::AttnShape shape{nh, nkv, hd, 0, 0};
      EXL3_CUDA_CHECK(
          cu::qk_norm_rope_store(dq.as<float>(), dk.as<float>(), dv.as<float>(), nullptr, nullptr,
                                 1e-6f, dcs.as<float>(), {dp.as<int32_t>(), dr.as<int32_t>()}, n,
                                 shape, got.kv(dt.as<int32_t>(), max_pages), nullptr),
          "store");
      EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "sync");
      EXPECT_EQ(download<float>(dq), qr) << "hd " << hd;
      const auto kq = download<uint8_t>(got.dkq), vq = download<uint8_t>(got.dvq);
      const auto ks = download<uint16_t>(got.dks), vs = download<uint16_t>(got.dvs);
      const int64_t cb = nkv * cpu::kv_code_bytes(f, hd), sb = nkv * hd / cpu::kKvGroup;
      int64_t bad = 0;
      for (int t = 0; t < n; ++t) {
        const int64_t s = slot_of(tables, max_pages, 0, t);
        for (int64_t i = 0; i < cb; ++i) {
          const auto at = static_cast<size_t>(s * cb + i);
          bad += kq[at] != want.kq[at];
          bad += vq[at] != want.vq[at];
        }
        for (int64_t i = 0; i < sb; ++i) {
          const auto at = static_cast<size_t>(s * sb + i);
          bad += ks[at] != want.ks[at];
          bad += vs[at] != want.vs[at];
        }
      }
      EXPECT_EQ(bad, 0) << cpu::kv_format_name(f) << " hd " << hd;
    }
  }
}

// Attention over a host-made quantized cache: the decode kernel for one token per sequence at
// several context lengths (one block and split-KV), and the prefill kernel over tiles of one long
// sequence.
TEST(CudaKvQuant, AttentionReadsTheCodes) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  for (const int hd : {64, 128}) {
    for (const KvFormat f : kQuantized) {
      const int nh = 8, nkv = 2;
      const std::vector<int32_t> positions = {0, 40, 300, 1500};
      const int seqs = static_cast<int>(positions.size());
      const int max_pages = (positions.back() + kPage) / kPage;
      const auto tables = shuffled_tables(seqs, max_pages, rng);
      Cache c(f, nkv, hd, static_cast<int64_t>(seqs) * max_pages * kPage);
      const auto k = normal(rng, static_cast<size_t>(c.slots * nkv * hd), 1.0f);
      const auto v = normal(rng, k.size(), 1.0f);
      for (int64_t s = 0; s < c.slots; ++s)
        c.put(s, k.data() + s * nkv * hd, v.data() + s * nkv * hd);
      c.upload();
      const auto dt = DeviceBuffer::upload(tables, "tables");
      const cu::PagedKv kv = c.kv(dt.as<int32_t>(), max_pages);
      const cu::AttnShape shape{nh, nkv, hd, hd / 2, 0};
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      // fp64 attention of query q (nh heads) at `pos` of sequence `row` over the decoded rows,
      // rounded to fp16 where the kernel stages them so.
      const auto reference = [&](const float* q, int row, int pos, bool half_rows) {
        std::vector<double> out(static_cast<size_t>(nh * hd), 0.0);
        const auto val = [&](const std::vector<float>& d, int64_t s, int kvh, int x) {
          const float y = d[static_cast<size_t>((s * nkv + kvh) * hd + x)];
          return static_cast<double>(half_rows ? tr::round_to_half(y) : y);
        };
        for (int h = 0; h < nh; ++h) {
          const int kvh = h / (nh / nkv);
          std::vector<double> sc(static_cast<size_t>(pos + 1));
          double mx = -1e300;
          for (int j = 0; j <= pos; ++j) {
            const int64_t s = slot_of(tables, max_pages, row, j);
            double d = 0;
            for (int x = 0; x < hd; ++x)
              d += static_cast<double>(q[h * hd + x] * scale) * val(c.kd, s, kvh, x);
            sc[static_cast<size_t>(j)] = d;
            mx = std::max(mx, d);
          }
          double den = 0;
          for (auto& e : sc) den += (e = std::exp(e - mx));
          for (int j = 0; j <= pos; ++j) {
            const int64_t s = slot_of(tables, max_pages, row, j);
            for (int x = 0; x < hd; ++x)
              out[static_cast<size_t>(h * hd + x)] +=
                  sc[static_cast<size_t>(j)] / den * val(c.vd, s, kvh, x);
          }
        }
        return out;
      };

      // Decode: token i of sequence i at positions[i].
      const auto q = normal(rng, static_cast<size_t>(seqs * nh * hd), 1.0f);
      std::vector<int32_t> list(static_cast<size_t>(seqs)), rows(list.size());
      std::iota(list.begin(), list.end(), 0);
      std::iota(rows.begin(), rows.end(), 0);
      const auto dq = DeviceBuffer::upload(q, "q"), dl = DeviceBuffer::upload(list, "list");
      const auto dp = DeviceBuffer::upload(positions, "pos"),
                 dr = DeviceBuffer::upload(rows, "rows");
      DeviceBuffer out(q.size() * 4, "out");
      const size_t ws_bytes = cu::attention_decode_workspace_bytes(seqs, shape, kv);
      DeviceBuffer ws(ws_bytes, "ws");
      if (ws_bytes > 0) EXL3_CUDA_CHECK(cudaMemset(ws.get(), 0, ws_bytes), "zero");
      std::vector<float> split_bits;
      for (const bool split : {true, false}) {
        EXL3_CUDA_CHECK(cudaMemset(out.get(), 0xFF, out.bytes()), "poison");
        EXL3_CUDA_CHECK(cu::attention_decode(dq.as<float>(), dl.as<int32_t>(), seqs,
                                             {dp.as<int32_t>(), dr.as<int32_t>()}, shape, scale, kv,
                                             split ? ws.get() : nullptr, split ? ws_bytes : 0,
                                             out.as<float>(), nullptr),
                        "decode");
        EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "sync");
        const auto got = download<float>(out);
        for (int i = 0; i < seqs; ++i) {
          const auto want =
              reference(q.data() + i * nh * hd, i, positions[static_cast<size_t>(i)], true);
          const std::vector<float> row(got.begin() + i * nh * hd, got.begin() + (i + 1) * nh * hd);
          EXPECT_LT(exl3::test::rel_l2(row, want), 2e-5)
              << cpu::kv_format_name(f) << " hd " << hd << " pos "
              << positions[static_cast<size_t>(i)] << (split ? " split" : " one block");
        }
        if (split) split_bits = got;
      }
      // The longest token alone: the same bits as in the batch.
      EXL3_CUDA_CHECK(cudaMemset(out.get(), 0xFF, out.bytes()), "poison");
      EXL3_CUDA_CHECK(cu::attention_decode(dq.as<float>(), dl.as<int32_t>() + seqs - 1, 1,
                                           {dp.as<int32_t>(), dr.as<int32_t>()}, shape, scale, kv,
                                           ws.get(), ws_bytes, out.as<float>(), nullptr),
                      "decode alone");
      EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "sync");
      const auto alone = download<float>(out);
      const size_t from = static_cast<size_t>((seqs - 1) * nh * hd);
      EXPECT_TRUE(std::equal(alone.begin() + static_cast<ptrdiff_t>(from), alone.end(),
                             split_bits.begin() + static_cast<ptrdiff_t>(from)))
          << cpu::kv_format_name(f) << " hd " << hd;

      // Prefill: tokens 0..69 of sequence 3 in tiles of 32, 32 and 6.
      const int n = 70;
      const auto qp = normal(rng, static_cast<size_t>(n * nh * hd), 1.0f);
      std::vector<int32_t> ppos(n), prow(n, 3);
      std::iota(ppos.begin(), ppos.end(), 0);
      const std::vector<int32_t> first = {0, 32, 64}, len = {32, 32, 6};
      const auto dqp = DeviceBuffer::upload(qp, "q"), dpp = DeviceBuffer::upload(ppos, "pos");
      const auto dpr = DeviceBuffer::upload(prow, "rows");
      const auto df = DeviceBuffer::upload(first, "first"), dlen = DeviceBuffer::upload(len, "len");
      DeviceBuffer pout(qp.size() * 4, "out");
      EXL3_CUDA_CHECK(cudaMemset(pout.get(), 0xFF, pout.bytes()), "poison");
      EXL3_CUDA_CHECK(cu::attention_prefill(dqp.as<float>(), df.as<int32_t>(), dlen.as<int32_t>(),
                                            3, {dpp.as<int32_t>(), dpr.as<int32_t>()}, shape, scale,
                                            kv, pout.as<float>(), nullptr),
                      "prefill");
      EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "sync");
      const auto pgot = download<float>(pout);
      for (const int t : {0, 31, 32, 50, 69}) {
        const auto want = reference(qp.data() + t * nh * hd, 3, t, false);
        const std::vector<float> row(pgot.begin() + t * nh * hd, pgot.begin() + (t + 1) * nh * hd);
        EXPECT_LT(exl3::test::rel_l2(row, want), 2e-5)
            << cpu::kv_format_name(f) << " hd " << hd << " prefill token " << t;
      }
    }
  }
}

// The engines: CUDA with each format against the CPU engine with the same format and against the
// fp32 CPU cache, over a prefill and replayed decode steps. The two engines' activations differ in
// their last bits, so a key near a rounding boundary gets the neighbouring code on one of them:
// on the H200 their logits differ by about the format's own error at q8 (1.1e-2 against 1.1e-2)
// and by less at fp8 and q4 (2.2e-2 against 4.7e-2, 5.4e-2 against 0.2), as two independent
// roundings would (at most sqrt(2) times one). So the checks are: the CUDA engine's error against
// the fp32 cache is the CPU engine's, and the two quantized engines differ by no more than two
// independent roundings.
TEST(CudaKvQuant, EngineErrorIsTheCpuEnginesInEveryFormat) {
  EXL3_REQUIRE_GPU();
  using namespace exl3::runtime;
  exl3::test::TempDir dir;
  test::write_model(dir.path(), exl3::HfArch::kQwen3, exl3::test::test_seed());
  auto rng = exl3::test::make_rng();
  const auto ids = test::random_ids(rng, 60, 512);
  EngineOptions eo;
  eo.page_size = 4;
  eo.cache_tokens = 256;
  auto fp32 = load_engine(dir.path(), eo);
  const auto exact = test::prefill_then_decode(*fp32, ids, 40);
  for (const KvFormat f : kQuantized) {
    eo.kv_format = f;
    eo.device = Device::kCpu;
    auto cpu_engine = load_engine(dir.path(), eo);
    eo.device = Device::kCuda;
    auto gpu = load_engine(dir.path(), eo);
    EXPECT_EQ(gpu->kv_cache_info().bytes_per_token, cpu_engine->kv_cache_info().bytes_per_token);
    const auto want = test::prefill_then_decode(*cpu_engine, ids, 40);
    const auto got = test::prefill_then_decode(*gpu, ids, 40);
    const double e_cpu = exl3::test::rel_l2(want, exact);
    const double e_gpu = exl3::test::rel_l2(got, exact);
    const double cross = exl3::test::rel_l2(got, want);
    const std::string name(cpu::kv_format_name(f));
    std::printf("%s cache vs fp32: CPU %.3e, CUDA %.3e; CUDA vs CPU %.3e\n", name.c_str(), e_cpu,
                e_gpu, cross);
    EXPECT_GT(e_gpu, 0.6 * e_cpu) << name;
    EXPECT_LT(e_gpu, 1.6 * e_cpu) << name;
    EXPECT_LT(cross, 1.6 * e_cpu) << name;
  }
}

}  // namespace
