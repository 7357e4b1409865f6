// Sample: a wrapped diagonal of tiles, 3 wide, so every tile row and column is hit, plus the
// tiles of highest and lowest RMS. Search: a coarse grid 0.1..1.9 (step 0.2) on every third
// sampled tile, a fine grid of +-2 steps of 0.075 around the coarse best on all of them, then a
// parabola through the best fine point and its neighbours (moved at most half a step), g >= 0.01.
// Every candidate of a stage goes to the encoder as one batch, so the tiles run in parallel.
#include "quant/scale_search.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "exl3/quant/viterbi.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "quant/tiles.hpp"

namespace exl3::quant::detail {

namespace tr = exl3::trellis;

namespace {

constexpr int kDiagWidth = 3;
constexpr double kFineStep = 0.075;
constexpr double kMinScale = 0.01;

std::vector<std::pair<int64_t, int64_t>> sample_tiles(const float* w, int64_t rows, int64_t cols) {
  const int64_t tk = rows / 16, tn = cols / 16;
  std::vector<std::pair<int64_t, int64_t>> picks;
  const int64_t diag_len = std::max(tk, tn);
  for (int64_t i = 0; i < diag_len; ++i) {
    for (int64_t d = 0; d < kDiagWidth; ++d) picks.emplace_back(i % tk, (i + d) % tn);
  }
  // Extreme tiles by mean square; ties broken by index so the sample is deterministic.
  std::vector<double> ms(static_cast<size_t>(tk * tn), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      ms[(r / 16) * tn + c / 16] += static_cast<double>(w[r * cols + c]) * w[r * cols + c];
  }
  const int64_t total = tk * tn;
  const int64_t num_x = std::min(std::max<int64_t>(8, diag_len * kDiagWidth / 16), (total + 1) / 2);
  std::vector<int64_t> order(static_cast<size_t>(total));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ms[a] > ms[b]; });
  for (int64_t i = 0; i < num_x; ++i) picks.emplace_back(order[i] / tn, order[i] % tn);
  for (int64_t i = 0; i < num_x; ++i)
    picks.emplace_back(order[total - 1 - i] / tn, order[total - 1 - i] % tn);
  return picks;
}

// Mean squared error of each scale over the given tiles (sequence order), in one encoder batch.
std::vector<double> evaluate(const std::vector<float>& tiles, const std::vector<double>& scales,
                             int K, tr::Codebook cb, Device device) {
  const int64_t n = static_cast<int64_t>(tiles.size()) / tr::kTileSize;
  std::vector<double> mse(scales.size(), std::numeric_limits<double>::infinity());
  std::vector<size_t> live;
  for (size_t i = 0; i < scales.size(); ++i) {
    if (scales[i] > 0.0) live.push_back(i);  // the fine grid can step below zero; skip those
  }
  if (live.empty() || n == 0) return mse;
  std::vector<float> batch(live.size() * tiles.size());
  for (size_t s = 0; s < live.size(); ++s) {
    const auto g = static_cast<float>(scales[live[s]]);
    for (size_t i = 0; i < tiles.size(); ++i) batch[s * tiles.size() + i] = g * tiles[i];
  }
  std::vector<uint16_t> states(batch.size());
  std::vector<float> decoded(batch.size());
  encode_tiles_on(device, batch.data(), static_cast<int64_t>(live.size()) * n, K, cb, states.data(),
               decoded.data());
  for (size_t s = 0; s < live.size(); ++s) {
    const double g = scales[live[s]];
    double se = 0.0;
    for (size_t i = 0; i < tiles.size(); ++i) {
      const double d = decoded[s * tiles.size() + i] / g - tiles[i];
      se += d * d;
    }
    mse[live[s]] = se / static_cast<double>(tiles.size());
  }
  return mse;
}

}  // namespace

double ldlq_drift(int K) {
  switch (K) {
    case 1:
      return 1.08;
    case 2:
      return 1.018;
    case 3:
      return 1.004;
    default:
      return 1.0;
  }
}

double search_global_scale(const float* w_r, int64_t rows, int64_t cols, int K, tr::Codebook cb,
                           Device device, double drift) {
  const auto picks = sample_tiles(w_r, rows, cols);
  std::vector<float> all(picks.size() * tr::kTileSize), sub;
  for (size_t i = 0; i < picks.size(); ++i) {
    gather_tile(w_r, cols, picks[i].first, picks[i].second, static_cast<float>(drift),
                all.data() + i * tr::kTileSize);
  }
  for (size_t i = 0; i < picks.size(); i += 3) {
    sub.insert(sub.end(), all.begin() + static_cast<int64_t>(i * tr::kTileSize),
               all.begin() + static_cast<int64_t>((i + 1) * tr::kTileSize));
  }

  std::vector<double> coarse;
  for (int i = 0; i < 10; ++i) coarse.push_back(0.1 + 0.2 * i);
  const auto mse1 = evaluate(sub, coarse, K, cb, device);
  const double center = coarse[std::min_element(mse1.begin(), mse1.end()) - mse1.begin()];

  std::vector<double> fine;
  for (int i = 0; i < 5; ++i) fine.push_back(center + kFineStep * (i - 2));
  const auto mse2 = evaluate(all, fine, K, cb, device);
  const auto best = static_cast<int>(std::min_element(mse2.begin(), mse2.end()) - mse2.begin());
  double offset = 0.0;
  if (best > 0 && best < 4) {
    const double y0 = mse2[best - 1], y1 = mse2[best], y2 = mse2[best + 1];
    const double denom = y0 - 2.0 * y1 + y2;
    if (std::isfinite(denom) && denom > 0.0)
      offset = std::clamp(0.5 * (y0 - y2) / denom, -0.5, 0.5);
  }
  return std::max(fine[best] + offset * kFineStep, kMinScale);
}

}  // namespace exl3::quant::detail
