// Runtime -> compile-time dispatch (exl3/trellis/dispatch.hpp): every K and codebook reaches the
// instance with its own constant, and out-of-range values take the documented fallback.
#include <cstdint>

#include <gtest/gtest.h>

#include "exl3/trellis/dispatch.hpp"

namespace tr = exl3::trellis;
using tr::Codebook;

TEST(Dispatch, WithBitsPassesEachKAsAConstant) {
  for (int K = 1; K <= 8; ++K) {
    EXPECT_EQ(tr::with_bits(K, -1, [](auto k) { return decltype(k)::value; }), K);
  }
  for (int K : {0, 9, -3})
    EXPECT_EQ(tr::with_bits(K, -1, [](auto k) { return decltype(k)::value; }), -1);
}

TEST(Dispatch, WithCodebookPassesEachCodebookAsAConstant) {
  for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
    EXPECT_EQ(tr::with_codebook(cb, [](auto c) { return decltype(c)::value; }), cb);
    // The constant is usable as a template argument, as the kernel instances use it.
    const uint16_t bits =
        tr::with_codebook(cb, [](auto c) { return tr::decode_bits_t<decltype(c)::value>(0x1234); });
    EXPECT_EQ(bits, tr::decode_bits(0x1234, cb));
  }
  // A value outside the enum decodes as 3INST, as the kernels' per-site switches did.
  EXPECT_EQ(tr::with_codebook(static_cast<Codebook>(7), [](auto c) { return decltype(c)::value; }),
            Codebook::k3Inst);
}
