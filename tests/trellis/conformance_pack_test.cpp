// exllamav3's own pack/unpack vectors and decode LUTs (../shared/conformance/tensors/
// exl3_public_pack.safetensors), checked bit for bit against the shared trellis header.
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/codebook.hpp"
#include "test_support.hpp"

namespace tr = exl3::trellis;

namespace {
const tr::Codebook kAll[] = {tr::Codebook::k3Inst, tr::Codebook::kMcg, tr::Codebook::kMul1};
}

TEST(ConformancePack, DecodeLutsAllStates) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto store = exl3::TensorStore::open(dir / "tensors" / "exl3_public_pack.safetensors");
  for (auto cb : kAll) {
    const auto lut = exl3::copy_tensor<uint16_t>(store.at(fmt::format("codebook.{}.values", tr::codebook_name(cb))));
    ASSERT_EQ(lut.size(), 65536u);
    for (uint32_t s = 0; s < 65536; ++s) {
      ASSERT_EQ(tr::decode_bits(s, cb), lut[s]) << tr::codebook_name(cb) << " state " << s;
    }
  }
}

TEST(ConformancePack, PackUnpackAllK) {
  EXL3_REQUIRE_CONFORMANCE(dir);
  const auto store = exl3::TensorStore::open(dir / "tensors" / "exl3_public_pack.safetensors");
  for (int K = 1; K <= 8; ++K) {
    for (const char* kind : {"real", "random"}) {
      const auto states = exl3::copy_tensor<uint16_t>(store.at(fmt::format("pack.k{}.{}.states", K, kind)));
      const auto packed = exl3::copy_tensor<uint16_t>(store.at(fmt::format("pack.k{}.{}.packed", K, kind)));
      ASSERT_EQ(states.size(), 4u * 256u);
      ASSERT_EQ(packed.size(), 4u * 16u * K);
      for (int t = 0; t < 4; ++t) {
        const uint16_t* st = states.data() + 256 * t;
        const uint16_t* pk = packed.data() + 16 * K * t;
        EXPECT_TRUE(tr::is_tail_biting(st, K)) << "K=" << K << " " << kind << " tile " << t;
        std::vector<uint16_t> mine(16 * K);
        tr::pack_tile(st, K, mine.data());
        EXPECT_EQ(mine, std::vector<uint16_t>(pk, pk + 16 * K)) << "pack K=" << K << " " << kind << " tile " << t;
        uint16_t back[256];
        tr::unpack_tile(pk, K, back);
        EXPECT_EQ(std::vector<uint16_t>(back, back + 256), std::vector<uint16_t>(st, st + 256))
            << "unpack K=" << K << " " << kind << " tile " << t;
        if (std::string(kind) == "real") {
          for (auto cb : kAll) {
            const auto dec = exl3::copy_tensor<uint16_t>(
                store.at(fmt::format("pack.k{}.real.decoded_{}", K, tr::codebook_name(cb))));
            for (int p = 0; p < 256; ++p) ASSERT_EQ(tr::decode_bits(st[p], cb), dec[256 * t + p]);
          }
        }
      }
    }
  }
}
