// Every CPU tile-decode path equals the shared header's decode bit for bit, for every K x codebook
// on random words (which exercise every state value many times over).
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/tile_decode.hpp"
#include "exl3/cpu/linear.hpp"
#include "exl3/trellis/tile.hpp"
#include "test_support.hpp"

namespace tr = exl3::trellis;

TEST(TileDecode, AllPathsMatchHeader) {
  auto rng = exl3::test::make_rng();
  for (int K = 1; K <= 8; ++K) {
    for (int c = 0; c < tr::kNumCodebooks; ++c) {
      const auto cb = static_cast<tr::Codebook>(c);
      for (int rep = 0; rep < 64; ++rep) {
        std::vector<uint16_t> tile(tr::tile_words16(K));
        for (auto& w : tile) w = static_cast<uint16_t>(rng());
        uint16_t ref_bits[256];
        tr::decode_tile_bits(tile.data(), K, cb, ref_bits);
        float scalar[256], vec[256], seq[256], rowmajor[256];
        std::fill_n(scalar, 256, NAN);
        std::fill_n(vec, 256, NAN);
        std::fill_n(rowmajor, 256, NAN);
        exl3::cpu::detail::decode_seq_scalar(tile.data(), K, cb, scalar);
        exl3::cpu::decode_tile_seq(tile.data(), K, cb, seq);
        exl3::cpu::decode_tile_f32(tile.data(), K, cb, rowmajor);
        const bool have_vec = exl3::cpu::detail::decode_seq_vector(tile.data(), K, cb, vec);
        for (int p = 0; p < 256; ++p) {
          const float ref = tr::decode(tr::unpack_state(tile.data(), K, p), cb);
          ASSERT_EQ(scalar[p], ref) << "K=" << K << " cb=" << c << " p=" << p;
          ASSERT_EQ(seq[p], ref);
          if (have_vec) {
            ASSERT_EQ(vec[p], ref) << "vector path K=" << K << " cb=" << c << " p=" << p;
          }
          ASSERT_EQ(rowmajor[tr::perm_index(p)], tr::half_to_float(ref_bits[tr::perm_index(p)]));
        }
      }
    }
  }
}

TEST(TileDecode, VectorCodebookEveryState) {
  std::vector<uint32_t> states(65536);
  for (uint32_t s = 0; s < 65536; ++s) states[s] = s;
  std::vector<float> out(65536);
  for (int c = 0; c < tr::kNumCodebooks; ++c) {
    const auto cb = static_cast<tr::Codebook>(c);
    if (!exl3::cpu::detail::decode_states_vector(states.data(), 65536, cb, out.data())) {
      GTEST_SKIP() << "no AVX2/F16C on this CPU";
    }
    for (uint32_t s = 0; s < 65536; ++s) ASSERT_EQ(out[s], tr::decode(s, cb)) << "cb=" << c << " state=" << s;
  }
}
