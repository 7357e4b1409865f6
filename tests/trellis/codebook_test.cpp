// Codebook decode: the worked examples and statistics of docs/format.md (Codebooks).
#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "exl3/trellis/codebook.hpp"

namespace tr = exl3::trellis;
using tr::Codebook;

TEST(Codebook, WorkedExamples) {
  struct Case {
    uint32_t state;
    uint16_t inst3, mcg, mul1;
  };
  const Case cases[] = {{0x0000, 0x3A25, 0x3F60, 0xC2E8},
                        {0x0001, 0xBB5B, 0x304E, 0x3921},
                        {0x1234, 0xC066, 0x3E0F, 0xB89E},
                        {0xBEEF, 0x424B, 0xC293, 0x3124},
                        {0xFFFF, 0xB110, 0x3ACD, 0xB936}};
  for (const auto& c : cases) {
    EXPECT_EQ(tr::decode_bits(c.state, Codebook::k3Inst), c.inst3) << std::hex << c.state;
    EXPECT_EQ(tr::decode_bits(c.state, Codebook::kMcg), c.mcg) << std::hex << c.state;
    EXPECT_EQ(tr::decode_bits(c.state, Codebook::kMul1), c.mul1) << std::hex << c.state;
    EXPECT_EQ(tr::decode_bits_t<Codebook::kMcg>(c.state), c.mcg);
  }
  // Intermediate values docs/format.md lists for 3INST at 0x1234 and MUL1 at 0x0001.
  EXPECT_EQ(0x1234u * tr::k3InstMult + tr::k3InstAdd, 0xD321A5CCu);
  EXPECT_EQ(tr::half_pair_word(0xD321A5CCu), 0xB841BEACu);
  EXPECT_EQ(tr::byte_sum(0x0001u * tr::kMul1Mult), 605u);
  EXPECT_EQ(tr::decode(0x1234, Codebook::k3Inst), -2.19921875f);
  EXPECT_EQ(tr::decode(0x0001, Codebook::kMul1), 0.64111328125f);
}

TEST(Codebook, Statistics) {
  struct Expect {
    Codebook cb;
    double rms, min, max;
    size_t distinct;
  };
  const Expect expects[] = {{Codebook::k3Inst, 1.243711, -3.957, 3.973, 10598},
                            {Codebook::kMcg, 1.244112, -3.949, 3.949, 10746},
                            {Codebook::kMul1, 1.000312, -3.453, 3.348, 913}};
  for (const auto& e : expects) {
    double sq = 0.0, mn = 1e9, mx = -1e9;
    std::set<uint16_t> distinct;
    for (uint32_t s = 0; s < 65536; ++s) {
      const double v = tr::decode(s, e.cb);
      sq += v * v;
      mn = std::min(mn, v);
      mx = std::max(mx, v);
      distinct.insert(tr::decode_bits(s, e.cb));
    }
    EXPECT_NEAR(std::sqrt(sq / 65536.0), e.rms, 5e-7) << tr::codebook_name(e.cb);
    EXPECT_NEAR(mn, e.min, 1e-3);
    EXPECT_NEAR(mx, e.max, 1e-3);
    EXPECT_EQ(distinct.size(), e.distinct);
  }
}

TEST(Codebook, MarkersAndNames) {
  EXPECT_EQ(tr::kMcgMarker, -877912083);
  EXPECT_EQ(tr::kMul1Marker, -2082680531);
  EXPECT_STREQ(tr::codebook_name(Codebook::k3Inst), "3inst");
  EXPECT_STREQ(tr::codebook_name(Codebook::kMcg), "mcg");
  EXPECT_STREQ(tr::codebook_name(Codebook::kMul1), "mul1");
}
