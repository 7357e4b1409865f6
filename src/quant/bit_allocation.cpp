// Bit allocation (docs/format.md, Bit allocation; after exllamav3's conversion/allocation.py): K
// is an integer per tensor, so a fractional target is met by raising whole groups from
// floor(target) by one bit.
// The layers nearest either end of the stack are the most sensitive, so they are raised first.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "exl3/error.hpp"
#include "exl3/quant/convert.hpp"
#include "exl3/trellis/bitstream.hpp"

namespace exl3::quant {

std::vector<int> allocate_bits(const std::vector<AllocGroup>& groups, int num_layers,
                               double target_bits) {
  if (!std::isfinite(target_bits) || target_bits < trellis::kMinBits ||
      target_bits > trellis::kMaxBits) {
    fail("bit allocation: target {} bits per weight outside {}..{}", target_bits,
         trellis::kMinBits, trellis::kMaxBits);
  }
  const int base = static_cast<int>(std::floor(target_bits));
  std::vector<int> k(groups.size(), base);
  if (base >= trellis::kMaxBits || groups.empty()) return k;

  // Budget in bit-weights. long double keeps the sums exact far beyond any real model's size.
  long double total = 0, used = 0;
  for (const auto& g : groups) {
    if (g.weights <= 0) fail("bit allocation: group '{}' has no weights", g.id);
    total += static_cast<long double>(g.weights);
    used += static_cast<long double>(g.weights) * base;
  }
  const long double budget = total * static_cast<long double>(target_bits);

  auto distance = [&](const AllocGroup& g) {
    return std::min(g.layer, std::max(0, num_layers - 1 - g.layer));
  };
  std::vector<size_t> order(groups.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& ga = groups[a];
    const auto& gb = groups[b];
    if (distance(ga) != distance(gb)) return distance(ga) < distance(gb);
    if (ga.layer != gb.layer) return ga.layer < gb.layer;
    return ga.rank < gb.rank;
  });
  // A tiny tolerance so a target that is exactly reachable (e.g. 2.5 with equal halves) is not
  // missed through rounding of the product.
  const long double eps = total * 1e-12L;
  for (const size_t i : order) {
    const auto extra = static_cast<long double>(groups[i].weights);
    if (used + extra <= budget + eps) {
      used += extra;
      ++k[i];
    }
  }
  return k;
}

}  // namespace exl3::quant
