// mla_attend (attention over the MLA latent cache) against a double-precision CPU computation of
// the same softmax: long contexts, steps of one token (split over the context and merged) and of
// many (unsplit), DSA selection lists, heads that do not fill the last block, latent widths of
// DeepSeek-V3 (512 + 64) and odd small ones. Poisoned outputs, scattered pages, fresh inputs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/mla.hpp"
#include "exl3/trellis/half.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace exl3::cuda {
namespace {

struct Case {
  const char* name;
  MlaShape shape;
  int tokens;    // of one sequence, at the last positions of the context
  int context;   // positions the sequence holds
  int selected;  // > 0: each token attends to this many random positions of its range
};

template <typename T>
DeviceBuffer upload(const std::vector<T>& v, const char* what) {
  return DeviceBuffer(v.data(), v.size() * sizeof(T), what);
}

void run_case(const Case& c) {
  const MlaShape& s = c.shape;
  ASSERT_TRUE(mla_supports(s)) << c.name;
  auto rng = exl3::test::make_rng();
  std::normal_distribution<float> nd;
  const int page = 16, pages = (c.context + page - 1) / page, width = s.latent_width();
  const int n = c.tokens, h = s.heads, qk = s.qk();
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const auto slot = [&](int j) { return table[static_cast<size_t>(j / page)] * page + j % page; };
  // The cache in fp16, and the values the kernel reads as floats for the reference.
  std::vector<uint16_t> cache(static_cast<size_t>(pages * page * width));
  std::vector<float> lat(static_cast<size_t>(c.context * width));
  for (int j = 0; j < c.context; ++j) {
    for (int k = 0; k < width; ++k) {
      const uint16_t b = trellis::float_to_half(nd(rng));
      cache[static_cast<size_t>(slot(j) * width + k)] = b;
      lat[static_cast<size_t>(j * width + k)] = trellis::half_to_float(b);
    }
  }
  std::vector<float> q_lat(static_cast<size_t>(n * h * s.lora)), q(static_cast<size_t>(n * h * qk));
  for (auto& v : q_lat) v = 0.1f * nd(rng);
  for (auto& v : q) v = 0.1f * nd(rng);
  std::vector<int32_t> pos(static_cast<size_t>(n)), row(static_cast<size_t>(n), 0);
  for (int t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = c.context - n + t;
  // Selections: `selected` sorted distinct positions of 0..pos[t] (all when fewer).
  const int stride = std::max(c.selected, 1);
  std::vector<int32_t> sel(static_cast<size_t>(n * stride), 0), cnt(static_cast<size_t>(n), 0);
  std::vector<std::vector<int32_t>> cols(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) {
    auto& cl = cols[static_cast<size_t>(t)];
    cl.resize(static_cast<size_t>(pos[static_cast<size_t>(t)] + 1));
    std::iota(cl.begin(), cl.end(), 0);
    if (c.selected > 0) {
      std::shuffle(cl.begin(), cl.end(), rng);
      cl.resize(std::min(cl.size(), static_cast<size_t>(c.selected)));
      std::sort(cl.begin(), cl.end());
      std::copy(cl.begin(), cl.end(), sel.begin() + t * stride);
      cnt[static_cast<size_t>(t)] = static_cast<int32_t>(cl.size());
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(qk));
  std::vector<double> want(q_lat.size());
  for (int t = 0; t < n; ++t) {
    for (int hh = 0; hh < h; ++hh) {
      const float* ql = q_lat.data() + (t * h + hh) * s.lora;
      const float* qr = q.data() + (t * h + hh) * qk + s.nope;
      const auto& cl = cols[static_cast<size_t>(t)];
      std::vector<double> sc(cl.size());
      double mx = -1e300;
      for (size_t i = 0; i < cl.size(); ++i) {
        const float* l = lat.data() + cl[i] * width;
        double d = 0.0;
        for (int k = 0; k < s.lora; ++k) d += static_cast<double>(ql[k]) * l[k];
        for (int k = 0; k < 2 * s.rope_half; ++k) d += static_cast<double>(qr[k]) * l[s.lora + k];
        sc[i] = d * scale;
        mx = std::max(mx, sc[i]);
      }
      double sum = 0.0;
      for (auto& v : sc) sum += (v = std::exp(v - mx));
      double* o = want.data() + (t * h + hh) * s.lora;
      for (size_t i = 0; i < cl.size(); ++i) {
        const float* l = lat.data() + cl[i] * width;
        for (int k = 0; k < s.lora; ++k) o[k] += sc[i] / sum * l[k];
      }
    }
  }
  auto d_cache = upload(cache, "cache"), d_table = upload(table, "table"),
       d_qlat = upload(q_lat, "q_lat"), d_q = upload(q, "q"), d_pos = upload(pos, "pos"),
       d_row = upload(row, "row"), d_sel = upload(sel, "sel"), d_cnt = upload(cnt, "count");
  std::vector<float> poison(q_lat.size(), std::nanf(""));
  auto d_out = upload(poison, "o_lat");
  const size_t ws_bytes = mla_attend_workspace_bytes(n, s);
  DeviceBuffer ws(ws_bytes, "workspace");
  const PagedKv kv{d_cache.as<uint16_t>(), nullptr, d_table.as<int32_t>(), pages, page};
  EXL3_CUDA_CHECK(mla_attend(d_qlat.as<float>(), d_q.as<float>(),
                             c.selected > 0 ? d_sel.as<int32_t>() : nullptr, stride,
                             c.selected > 0 ? d_cnt.as<int32_t>() : nullptr,
                             {d_pos.as<int32_t>(), d_row.as<int32_t>()}, n, s, scale, kv, ws.get(),
                             ws_bytes, d_out.as<float>(), nullptr),
                  "mla_attend");
  std::vector<float> got(q_lat.size());
  EXL3_CUDA_CHECK(cudaMemcpy(got.data(), d_out.get(), got.size() * 4, cudaMemcpyDeviceToHost),
                  "copy");
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << c.name << " element " << i;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  const double err = std::sqrt(num / den);
  std::printf("%s: %d tokens, %d splits, rel-L2 %.3e\n", c.name, n, mla_attend_splits(n, s), err);
  EXPECT_LE(err, 1e-5) << c.name;  // fp32 queries and weights; the cache is the fp16 input
}

TEST(MlaAttend, MatchesCpuSoftmax) {
  EXL3_REQUIRE_GPU();
  // heads, nope, rope_half, v, lora
  const Case cases[] = {
      {"20 heads, 1 token, 1300 positions (split)", {20, 16, 32, 16, 512}, 1, 1300, 0},
      {"20 heads, 140 tokens, 1300 positions (unsplit)", {20, 16, 32, 16, 512}, 140, 1300, 0},
      {"4 heads lora 64, 40 tokens", {4, 16, 4, 16, 64}, 40, 40, 0},
      {"20 heads, DSA 700 of 1300, 140 tokens", {20, 16, 32, 16, 512}, 140, 1300, 700},
      {"6 heads lora 96, 1 token, 1300 positions", {6, 16, 8, 16, 96}, 1, 1300, 0},
      {"6 heads lora 96, 70 tokens, DSA 300", {6, 16, 8, 16, 96}, 70, 600, 300},
  };
  for (const Case& c : cases) run_case(c);
}

}  // namespace
}  // namespace exl3::cuda
