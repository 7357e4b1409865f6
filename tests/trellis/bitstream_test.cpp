// Tile bitstream: worked examples of docs/format.md (Bitstream), pack/unpack round trips, the
// tail-biting invariant and the tensor-core permutation.
#include <algorithm>
#include <array>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/trellis/bitstream.hpp"
#include "test_support.hpp"

namespace tr = exl3::trellis;

namespace {
// Tail-biting sliding-window states from 256 symbols: state_p = sum_s sym[p-s] << (K*s).
std::array<uint16_t, 256> states_from_symbols(const std::vector<uint32_t>& sym, int K) {
  std::array<uint16_t, 256> st{};
  for (int p = 0; p < 256; ++p) {
    uint32_t s = 0;
    for (int back = 0; back * K < 16 + K; ++back) s |= sym[(p - back + 256) % 256] << (K * back);
    st[p] = static_cast<uint16_t>(s & 0xFFFFu);
  }
  return st;
}
}  // namespace

TEST(Bitstream, WorkedExampleK2) {
  std::vector<uint32_t> sym(256);
  for (int p = 0; p < 256; ++p) sym[p] = (p / 8) % 4;
  const auto st = states_from_symbols(sym, 2);
  std::vector<uint16_t> tile(32);
  tr::pack_tile(st.data(), 2, tile.data());
  EXPECT_EQ(tile[0], 0x5555);
  EXPECT_EQ(tile[1], 0x0000);
  EXPECT_EQ(tile[2], 0xFFFF);
  EXPECT_EQ(tile[3], 0xAAAA);
  EXPECT_EQ(tr::tile_word32(tile.data(), 0), 0x00005555u);
  EXPECT_EQ(tr::tile_word32(tile.data(), 1), 0xAAAAFFFFu);
  EXPECT_EQ(tr::unpack_state(tile.data(), 2, 0), 0xFFFCu);
  EXPECT_EQ(tr::unpack_state(tile.data(), 2, 1), 0xFFF0u);
  EXPECT_EQ(tr::unpack_state(tile.data(), 2, 6), 0xC000u);
  EXPECT_EQ(tr::unpack_state(tile.data(), 2, 255), 0xFFFFu);
}

TEST(Bitstream, WorkedExampleK3) {
  std::vector<uint32_t> sym(256);
  for (int p = 0; p < 256; ++p) sym[p] = p % 8;
  const auto st = states_from_symbols(sym, 3);
  std::vector<uint16_t> tile(48);
  tr::pack_tile(st.data(), 3, tile.data());
  EXPECT_EQ(tile[0], 0x7705);
  EXPECT_EQ(tile[1], 0x0539);
  EXPECT_EQ(tile[2], 0x0539);
  EXPECT_EQ(tile[3], 0x3977);
  EXPECT_EQ(tr::tile_word32(tile.data(), 0), 0x05397705u);
  EXPECT_EQ(tr::unpack_state(tile.data(), 3, 0), 0xCBB8u);
  EXPECT_EQ(tr::unpack_state(tile.data(), 3, 1), 0x5DC1u);
}

TEST(Bitstream, RandomRoundTripAllK) {
  auto rng = exl3::test::make_rng();
  for (int K = 1; K <= 8; ++K) {
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<uint32_t> sym(256);
      for (auto& s : sym) s = static_cast<uint32_t>(rng()) & ((1u << K) - 1u);
      const auto st = states_from_symbols(sym, K);
      ASSERT_TRUE(tr::is_tail_biting(st.data(), K));
      std::vector<uint16_t> tile(tr::tile_words16(K), 0xDEAD);
      tr::pack_tile(st.data(), K, tile.data());
      std::array<uint16_t, 256> back{};
      tr::unpack_tile(tile.data(), K, back.data());
      ASSERT_EQ(back, st) << "K=" << K;
      // Unpack of arbitrary words is always tail-biting, and re-packs to the same words.
      std::vector<uint16_t> noise(tr::tile_words16(K));
      for (auto& w : noise) w = static_cast<uint16_t>(rng());
      tr::unpack_tile(noise.data(), K, back.data());
      ASSERT_TRUE(tr::is_tail_biting(back.data(), K));
      std::vector<uint16_t> repacked(tr::tile_words16(K));
      tr::pack_tile(back.data(), K, repacked.data());
      ASSERT_EQ(repacked, noise);
    }
  }
}

TEST(Bitstream, TailBitingDetectsBrokenSequence) {
  std::vector<uint32_t> sym(256, 1);
  auto st = states_from_symbols(sym, 4);
  ASSERT_TRUE(tr::is_tail_biting(st.data(), 4));
  st[100] ^= 0x0100;  // corrupt a non-symbol bit
  EXPECT_FALSE(tr::is_tail_biting(st.data(), 4));
}

TEST(Permutation, SpecExamplesAndBijection) {
  const int rows[8] = {0, 1, 8, 9, 0, 1, 8, 9};
  const int cols[8] = {0, 0, 0, 0, 8, 8, 8, 8};
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(tr::perm_row(p), rows[p]);
    EXPECT_EQ(tr::perm_col(p), cols[p]);
  }
  EXPECT_EQ(tr::perm_row(8), 2);
  EXPECT_EQ(tr::perm_col(8), 0);
  EXPECT_EQ(tr::perm_row(255), 15);
  EXPECT_EQ(tr::perm_col(255), 15);
  std::set<int> seen;
  for (int p = 0; p < 256; ++p) {
    seen.insert(tr::perm_index(p));
    EXPECT_EQ(tr::perm_position(tr::perm_row(p), tr::perm_col(p)), p);
  }
  EXPECT_EQ(seen.size(), 256u);
  static_assert(tr::perm_index(255) == 255);
}
