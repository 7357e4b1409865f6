// Tile encoder: tail-biting output, exact recovery of decodable tiles, kernel agreement, packing.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "exl3/error.hpp"
#include "exl3/quant/viterbi.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/codebook.hpp"
#include "test_mode.hpp"
#include "test_support.hpp"

namespace {

namespace q = exl3::quant;
namespace tr = exl3::trellis;

constexpr tr::Codebook kCodebooks[] = {tr::Codebook::k3Inst, tr::Codebook::kMcg,
                                       tr::Codebook::kMul1};

std::vector<float> gaussian_tiles(std::mt19937_64& rng, int n, float sigma) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> t(static_cast<size_t>(n) * tr::kTileSize);
  for (auto& x : t) x = nd(rng);
  return t;
}

double squared_error(const float* a, const float* b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i)
    s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}

TEST(QuantViterbi, OutputIsTailBitingAndDecodesToDecodedOut) {
  auto rng = exl3::test::make_rng();
  constexpr int kTiles = 2;
  for (tr::Codebook cb : kCodebooks) {
    const auto tiles = gaussian_tiles(rng, kTiles, cb == tr::Codebook::kMul1 ? 1.0f : 1.2437f);
    for (int K = 1; K <= 8; ++K) {
      std::vector<uint16_t> states(tiles.size());
      std::vector<float> decoded(tiles.size());
      q::encode_tiles(tiles.data(), kTiles, K, cb, states.data(), decoded.data());
      for (int t = 0; t < kTiles; ++t) {
        EXPECT_TRUE(tr::is_tail_biting(states.data() + t * tr::kTileSize, K))
            << tr::codebook_name(cb) << " K=" << K << " tile " << t;
      }
      for (size_t i = 0; i < states.size(); ++i) {
        ASSERT_EQ(decoded[i], tr::decode(states[i], cb))
            << tr::codebook_name(cb) << " K=" << K << " i=" << i;
      }
    }
  }
}

// A tile decoded from a valid trellis has a zero-cost path, so the optimum reproduces it exactly
// (the two-pass search keeps it: the first pass's path is optimal, hence zero-cost, too).
TEST(QuantViterbi, RecoversExactlyDecodableTiles) {
  auto rng = exl3::test::make_rng();
  for (tr::Codebook cb : kCodebooks) {
    for (int K = 1; K <= 8; ++K) {
      std::vector<uint16_t> symbols(tr::kTileSize), packed(tr::tile_words16(K)),
          truth(tr::kTileSize);
      for (auto& s : symbols) s = static_cast<uint16_t>(rng() & ((1u << K) - 1u));
      tr::pack_tile(symbols.data(), K, packed.data());
      tr::unpack_tile(packed.data(), K, truth.data());
      ASSERT_TRUE(tr::is_tail_biting(truth.data(), K));
      std::vector<float> target(tr::kTileSize), decoded(tr::kTileSize);
      for (int p = 0; p < tr::kTileSize; ++p) target[p] = tr::decode(truth[p], cb);
      std::vector<uint16_t> states(tr::kTileSize);
      q::encode_tiles(target.data(), 1, K, cb, states.data(), decoded.data());
      EXPECT_EQ(squared_error(decoded.data(), target.data(), tr::kTileSize), 0.0)
          << tr::codebook_name(cb) << " K=" << K;
      EXPECT_TRUE(tr::is_tail_biting(states.data(), K));
    }
  }
}

// The scalar kernel is the portable reference; the AVX2 kernel must find a path of the same cost
// (fp32 rounding of FMA vs mul+add may pick a different path of equal cost within 1e-5).
TEST(QuantViterbi, ScalarAndAvx2KernelsAgree) {
  if (!q::viterbi_path_available(q::ViterbiPath::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  auto rng = exl3::test::make_rng();
  const auto tiles = gaussian_tiles(rng, 1, 1.2437f);
  const std::vector<int> bits =
      exl3::test::quant_fast_mode() ? std::vector<int>{3} : std::vector<int>{1, 2, 5, 8};
  for (int K : bits) {
    std::vector<uint16_t> s_avx(tr::kTileSize), s_ref(tr::kTileSize);
    std::vector<float> d_avx(tr::kTileSize), d_ref(tr::kTileSize);
    q::encode_tiles(tiles.data(), 1, K, tr::Codebook::kMcg, s_avx.data(), d_avx.data(),
                    q::ViterbiPath::kAvx2);
    q::encode_tiles(tiles.data(), 1, K, tr::Codebook::kMcg, s_ref.data(), d_ref.data(),
                    q::ViterbiPath::kScalar);
    EXPECT_TRUE(tr::is_tail_biting(s_ref.data(), K));
    const double e_avx = squared_error(d_avx.data(), tiles.data(), tr::kTileSize);
    const double e_ref = squared_error(d_ref.data(), tiles.data(), tr::kTileSize);
    EXPECT_NEAR(e_avx, e_ref, 1e-5 * e_ref + 1e-9) << "K=" << K;
  }
}

TEST(QuantViterbi, PackTilesRoundTripsThroughUnpack) {
  auto rng = exl3::test::make_rng();
  constexpr int kTiles = 3;
  const auto tiles = gaussian_tiles(rng, kTiles, 1.0f);
  for (int K : {1, 3, 7}) {
    std::vector<uint16_t> states(tiles.size()), words(kTiles * tr::tile_words16(K)),
        back(tr::kTileSize);
    q::encode_tiles(tiles.data(), kTiles, K, tr::Codebook::kMul1, states.data());
    q::pack_tiles(states.data(), kTiles, K, words.data());
    for (int t = 0; t < kTiles; ++t) {
      tr::unpack_tile(words.data() + t * tr::tile_words16(K), K, back.data());
      for (int p = 0; p < tr::kTileSize; ++p)
        ASSERT_EQ(back[p], states[t * tr::kTileSize + p]) << "K=" << K;
    }
  }
}

TEST(QuantViterbi, RejectsBadInput) {
  std::vector<float> tile(tr::kTileSize, 0.5f);
  std::vector<uint16_t> states(tr::kTileSize);
  EXPECT_THROW(q::encode_tiles(tile.data(), 1, 0, tr::Codebook::k3Inst, states.data()),
               exl3::Error);
  EXPECT_THROW(q::encode_tiles(tile.data(), 1, 9, tr::Codebook::k3Inst, states.data()),
               exl3::Error);
  tile[5] = std::nanf("");
  try {
    q::encode_tiles(tile.data(), 1, 4, tr::Codebook::k3Inst, states.data());
    FAIL() << "expected exl3::Error";
  } catch (const exl3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tile 0 position 5"), std::string::npos) << e.what();
  }
}

TEST(QuantViterbi, CodebookLutMatchesDecode) {
  for (tr::Codebook cb : kCodebooks) {
    const float* lut = q::codebook_lut(cb);
    for (uint32_t s = 0; s < 65536; s += 97) ASSERT_EQ(lut[s], tr::decode(s, cb));
  }
}

}  // namespace
