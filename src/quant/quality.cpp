// Benchmarks of the encoder and quantizer on synthetic data (see quality.hpp for the recipes).
#include "exl3/quant/quality.hpp"

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include <tbb/task_arena.h>

#include "exl3/error.hpp"
#include "exl3/quant/quantize.hpp"
#include "exl3/quant/viterbi.hpp"
#include "exl3/trellis/bitstream.hpp"

namespace exl3::quant {

namespace tr = exl3::trellis;

namespace {

// Runs f in an arena of `threads` threads, or in the caller's arena for 0.
template <typename F>
auto in_arena(int threads, F&& f) {
  if (threads < 0) fail("quant bench: threads {} must be >= 0", threads);
  if (threads == 0) return f();
  tbb::task_arena arena(threads);
  return arena.execute(f);
}

double tile_sigma(tr::Codebook cb) {
  return cb == tr::Codebook::kMul1 ? 1.0 : 1.2437;
}

std::vector<float> gaussian_tiles(int n, double sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, sigma);
  std::vector<float> t(static_cast<size_t>(n) * tr::kTileSize);
  for (auto& x : t) x = static_cast<float>(nd(rng));
  return t;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double exllamav3_nmse(int bits) {
  static constexpr double table[8] = {0.275, 0.069, 0.018, 0.0047, 0.0014, 0.0005, 0.0002, 0.0001};
  if (!tr::valid_bits(bits)) fail("exllamav3_nmse: K={} outside 1..8", bits);
  return table[bits - 1];
}

std::vector<QualityRow> quality_table(int num_tiles, uint64_t seed, int threads, int min_bits,
                                      int max_bits) {
  if (num_tiles <= 0) fail("quality_table: num_tiles {} must be positive", num_tiles);
  if (!tr::valid_bits(min_bits) || !tr::valid_bits(max_bits) || min_bits > max_bits) {
    fail("quality_table: bit range {}..{} must lie in 1..8", min_bits, max_bits);
  }
  return in_arena(threads, [&] {
    std::vector<QualityRow> rows;
    for (int c = 0; c < tr::kNumCodebooks; ++c) {
      const auto cb = static_cast<tr::Codebook>(c);
      const double sigma = tile_sigma(cb);
      const std::vector<float> tiles =
          gaussian_tiles(num_tiles, sigma, seed + static_cast<uint64_t>(c));
      std::vector<uint16_t> states(tiles.size());
      std::vector<float> decoded(tiles.size());
      for (int K = min_bits; K <= max_bits; ++K) {
        const auto t0 = std::chrono::steady_clock::now();
        encode_tiles(tiles.data(), num_tiles, K, cb, states.data(), decoded.data());
        QualityRow row;
        row.seconds = seconds_since(t0);
        double se = 0.0;
        for (size_t i = 0; i < tiles.size(); ++i) {
          const double d = static_cast<double>(decoded[i]) - tiles[i];
          se += d * d;
        }
        row.codebook = cb;
        row.bits = K;
        row.tiles = num_tiles;
        row.nmse = se / static_cast<double>(tiles.size()) / (sigma * sigma);
        row.rd_bound = std::ldexp(1.0, -2 * K);
        row.ratio = row.nmse / row.rd_bound;
        row.goal = exllamav3_nmse(K);
        row.tiles_per_s = num_tiles / row.seconds;
        rows.push_back(row);
      }
    }
    return rows;
  });
}

LdlqGain ldlq_gain(int64_t in_features, int64_t out_features, int bits, tr::Codebook cb,
                   uint64_t seed, int threads, double g_scale) {
  if (in_features <= 0 || out_features <= 0)
    fail("ldlq_gain: shape [{}, {}] must be positive", in_features, out_features);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int64_t in = in_features, out = out_features;

  // Weight: 0.02 N(0,1) * exp(0.3 N) per column * exp(0.2 N) per row, 0.2% outliers x6.
  std::vector<double> col(static_cast<size_t>(out)), row(static_cast<size_t>(in));
  for (auto& x : col) x = std::exp(0.3 * nd(rng));
  for (auto& x : row) x = std::exp(0.2 * nd(rng));
  std::vector<float> w(static_cast<size_t>(in * out));
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t j = 0; j < out; ++j)
      w[i * out + j] = static_cast<float>(0.02 * nd(rng) * col[j] * row[i]);
  }
  std::uniform_int_distribution<int64_t> pos(0, in * out - 1);
  for (int64_t i = 0; i < in * out / 500; ++i) w[pos(rng)] *= 6.0f;

  // Calibration: X = N(0,1) * exp(0.75 N) per channel + N(0,1)[512, 8] . 0.5 N(0,1)[8, in].
  constexpr int64_t kRows = 512, kRank = 8;
  std::vector<double> skew(static_cast<size_t>(in)), mix(static_cast<size_t>(kRank * in));
  for (auto& x : skew) x = std::exp(0.75 * nd(rng));
  for (auto& x : mix) x = 0.5 * nd(rng);
  std::vector<double> x(static_cast<size_t>(kRows * in));
  for (int64_t r = 0; r < kRows; ++r) {
    double z[kRank];
    for (auto& v : z) v = nd(rng);
    for (int64_t c = 0; c < in; ++c) {
      double v = nd(rng) * skew[c];
      for (int64_t t = 0; t < kRank; ++t) v += z[t] * mix[t * in + c];
      x[r * in + c] = v;
    }
  }
  std::vector<double> h(static_cast<size_t>(in * in), 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    const double* xr = x.data() + r * in;
    for (int64_t a = 0; a < in; ++a) {
      for (int64_t b = 0; b <= a; ++b) h[a * in + b] += xr[a] * xr[b] / kRows;
    }
  }
  for (int64_t a = 0; a < in; ++a) {
    for (int64_t b = 0; b < a; ++b) h[b * in + a] = h[a * in + b];
  }

  HessianView hv;
  hv.f64 = h.data();
  hv.rows = hv.cols = in;
  QuantOptions o;
  o.bits = bits;
  o.codebook = cb;
  o.seed = seed;
  o.threads = threads;
  o.g_scale = g_scale;
  LdlqGain g;
  g.in_features = in;
  g.out_features = out;
  g.bits = bits;
  g.codebook = cb;
  g.proxy_ldlq = quantize_tensor(w.data(), in, out, o, &hv).proxy_err;
  o.ldlq = false;
  g.proxy_plain = quantize_tensor(w.data(), in, out, o, &hv).proxy_err;
  g.gain = g.proxy_plain / g.proxy_ldlq;
  return g;
}

EncoderSpeed encoder_speed(int bits, tr::Codebook cb, int num_tiles, int threads, uint64_t seed) {
  if (num_tiles <= 0) fail("encoder_speed: num_tiles {} must be positive", num_tiles);
  const std::vector<float> tiles = gaussian_tiles(num_tiles, tile_sigma(cb), seed);
  std::vector<uint16_t> states(tiles.size());
  EncoderSpeed s;
  s.bits = bits;
  s.codebook = cb;
  s.threads = threads;
  s.tiles = num_tiles;
  s.path = viterbi_path_name();
  s.seconds = in_arena(threads, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    encode_tiles(tiles.data(), num_tiles, bits, cb, states.data());
    return seconds_since(t0);
  });
  s.tiles_per_s = num_tiles / s.seconds;
  return s;
}

}  // namespace exl3::quant
