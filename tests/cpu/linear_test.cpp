// CPU reference linear vs an independent fp64 computation with explicit Hadamard matrices, on
// fresh random trellis words, scales, biases and inputs.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cpu/linear.hpp"
#include "exl3/error.hpp"
#include "exl3/trellis/hadamard.hpp"
#include "exl3/trellis/tile.hpp"
#include "test_support.hpp"

namespace tr = exl3::trellis;
using exl3::cpu::ActDType;
using exl3::cpu::LinearView;

namespace {

struct RandomLinear {
  int64_t in, out;
  int K;
  tr::Codebook cb;
  std::vector<uint16_t> trellis, suh, svh;
  std::vector<float> bias;

  RandomLinear(int64_t in_, int64_t out_, int K_, tr::Codebook cb_, bool with_bias, std::mt19937_64& rng)
      : in(in_), out(out_), K(K_), cb(cb_) {
    trellis.resize(static_cast<size_t>(in / 16 * (out / 16) * 16 * K));
    for (auto& w : trellis) w = static_cast<uint16_t>(rng());
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < in; ++i) suh.push_back(tr::float_to_half(0.05f * nd(rng)));
    for (int64_t i = 0; i < out; ++i) svh.push_back(tr::float_to_half(0.5f * nd(rng)));
    if (with_bias) {
      for (int64_t i = 0; i < out; ++i) bias.push_back(nd(rng));
    }
  }
  LinearView view() const { return LinearView{trellis, in, out, K, cb, suh, svh, bias}; }

  // W[k, n] = suh[k] (B_k W_hat B_n)[k, n] svh[n] with explicit +-1 matrices, in fp64.
  std::vector<double> weight_fp64() const {
    std::vector<double> what(static_cast<size_t>(in * out));
    uint16_t t[256];
    for (int64_t i = 0; i < in / 16; ++i) {
      for (int64_t j = 0; j < out / 16; ++j) {
        tr::decode_tile_bits(tr::tile_ptr(trellis.data(), K, out / 16, i, j), K, cb, t);
        for (int r = 0; r < 16; ++r) {
          for (int c = 0; c < 16; ++c) what[(16 * i + r) * out + 16 * j + c] = tr::half_to_float(t[16 * r + c]);
        }
      }
    }
    const double s = 1.0 / std::sqrt(128.0);
    std::vector<double> tmp(what.size(), 0.0), w(what.size(), 0.0);
    for (int64_t k = 0; k < in; ++k) {  // tmp = B_k W_hat
      const int64_t b0 = k / 128 * 128;
      for (int64_t kk = 0; kk < 128; ++kk) {
        const double h = tr::had_sign(static_cast<int>(k - b0), static_cast<int>(kk)) * s;
        for (int64_t n = 0; n < out; ++n) tmp[k * out + n] += h * what[(b0 + kk) * out + n];
      }
    }
    for (int64_t k = 0; k < in; ++k) {  // w = diag(suh) tmp B_n diag(svh)
      for (int64_t n = 0; n < out; ++n) {
        const int64_t c0 = n / 128 * 128;
        double acc = 0.0;
        for (int64_t nn = 0; nn < 128; ++nn) {
          acc += tmp[k * out + c0 + nn] * tr::had_sign(static_cast<int>(nn), static_cast<int>(n - c0)) * s;
        }
        w[k * out + n] = tr::half_to_float(suh[k]) * acc * tr::half_to_float(svh[n]);
      }
    }
    return w;
  }
};

const tr::Codebook kAllCb[] = {tr::Codebook::k3Inst, tr::Codebook::kMcg, tr::Codebook::kMul1};

}  // namespace

TEST(CpuLinear, ReconstructWeightMatchesExplicitFormula) {
  auto rng = exl3::test::make_rng();
  for (auto cb : kAllCb) {
    for (int K : {1, 3, 8}) {
      RandomLinear L(256, 384, K, cb, false, rng);
      const auto ref = L.weight_fp64();
      const auto got = exl3::cpu::reconstruct_weight(L.view());
      EXPECT_LE(exl3::test::rel_l2(std::span<const float>(got), std::span<const double>(ref)), 1e-6)
          << "K=" << K << " cb=" << tr::codebook_name(cb);
    }
  }
}

TEST(CpuLinear, ForwardMatchesFp64AllDtypes) {
  auto rng = exl3::test::make_rng();
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const struct {
    int64_t in, out;
  } shapes[] = {{128, 128}, {256, 384}, {384, 256}};
  int K = 1;
  for (const auto& sh : shapes) {
    for (auto cb : kAllCb) {
      K = K % 8 + 1;  // cycle K across cases; every K appears over the 9 combinations
      RandomLinear L(sh.in, sh.out, K, cb, (K & 1) != 0, rng);
      const auto w = L.weight_fp64();
      for (int64_t m : {1, 3, 8, 17}) {
        std::vector<float> x32(static_cast<size_t>(m * sh.in));
        for (auto& v : x32) v = nd(rng);
        std::vector<uint16_t> x16(x32.size()), xb16(x32.size());
        for (size_t i = 0; i < x32.size(); ++i) {
          x16[i] = tr::float_to_half(x32[i]);
          xb16[i] = tr::float_to_bf16(x32[i]);
        }
        const struct {
          ActDType t;
          const void* p;
        } acts[] = {{ActDType::kF32, x32.data()}, {ActDType::kF16, x16.data()}, {ActDType::kBF16, xb16.data()}};
        for (const auto& a : acts) {
          std::vector<double> ref(static_cast<size_t>(m * sh.out), 0.0);
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t k = 0; k < sh.in; ++k) {
              const int64_t idx = r * sh.in + k;
              const double xv = a.t == ActDType::kF32   ? x32[idx]
                                : a.t == ActDType::kF16 ? tr::half_to_float(x16[idx])
                                                        : tr::bf16_to_float(xb16[idx]);
              for (int64_t n = 0; n < sh.out; ++n) ref[r * sh.out + n] += xv * w[k * sh.out + n];
            }
            for (int64_t n = 0; n < sh.out; ++n) ref[r * sh.out + n] += L.bias.empty() ? 0.0 : L.bias[n];
          }
          std::vector<float> y(ref.size(), NAN);  // poisoned
          exl3::cpu::linear_forward(L.view(), a.p, a.t, m, y.data());
          EXPECT_LE(exl3::test::rel_l2(std::span<const float>(y), std::span<const double>(ref)), 1e-5)
              << sh.in << "x" << sh.out << " K=" << K << " cb=" << tr::codebook_name(cb) << " m=" << m;
        }
      }
    }
  }
}

TEST(CpuLinear, RowsAreBatchInvariant) {
  auto rng = exl3::test::make_rng();
  RandomLinear L(256, 256, 3, tr::Codebook::kMcg, true, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t m = 9;
  std::vector<float> x(static_cast<size_t>(m * 256));
  for (auto& v : x) v = nd(rng);
  std::vector<float> all(static_cast<size_t>(m * 256), NAN);
  exl3::cpu::linear_forward(L.view(), x.data(), ActDType::kF32, m, all.data());
  for (int64_t r = 0; r < m; ++r) {
    std::vector<float> one(256, NAN);
    exl3::cpu::linear_forward(L.view(), x.data() + r * 256, ActDType::kF32, 1, one.data());
    for (int n = 0; n < 256; ++n) ASSERT_EQ(one[n], all[r * 256 + n]) << "row " << r;
  }
}

TEST(CpuLinear, RejectsInconsistentView) {
  auto rng = exl3::test::make_rng();
  RandomLinear L(128, 128, 2, tr::Codebook::k3Inst, false, rng);
  auto v = L.view();
  v.bits = 3;  // trellis size no longer matches
  EXPECT_THROW(exl3::cpu::reconstruct_w_hat(v), exl3::Error);
  v = L.view();
  v.suh = v.suh.subspan(1);
  float y[128];
  float x[128] = {};
  EXPECT_THROW(exl3::cpu::linear_forward(v, x, ActDType::kF32, 1, y), exl3::Error);
}
