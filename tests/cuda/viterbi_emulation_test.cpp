// The CUDA tile encoder's algorithm, run on the CPU: src/cuda/viterbi_body.hpp executed by the
// HostExec emulator (every thread of the 1024-thread block in turn, phase by phase) must reproduce
// the CPU encoder exactly. This checks the kernel's thread decomposition, index arithmetic, tie
// order and two-pass tail-biting logic on machines without a GPU (no `gpu` label: runs anywhere the
// CUDA build exists). Plus the argument checks that need no device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/viterbi_body.hpp"
#include "exl3/cuda/viterbi.hpp"
#include "exl3/error.hpp"
#include "exl3/quant/encode.hpp"
#include "exl3/quant/viterbi.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/codebook.hpp"
#include "test_support.hpp"

namespace {

namespace q = exl3::quant;
namespace tr = exl3::trellis;
namespace vit = exl3::cuda::vit;

constexpr tr::Codebook kCodebooks[] = {tr::Codebook::k3Inst, tr::Codebook::kMcg, tr::Codebook::kMul1};

template <int K>
unsigned emulate(tr::Codebook cb, const float* tiles, int64_t n, uint16_t* states, float* decoded) {
  switch (cb) {
    case tr::Codebook::kMcg:
      return vit::emulate_encode_tiles<K, tr::Codebook::kMcg>(tiles, n, states, decoded);
    case tr::Codebook::kMul1:
      return vit::emulate_encode_tiles<K, tr::Codebook::kMul1>(tiles, n, states, decoded);
    default:
      return vit::emulate_encode_tiles<K, tr::Codebook::k3Inst>(tiles, n, states, decoded);
  }
}

unsigned emulate_any(int K, tr::Codebook cb, const float* tiles, int64_t n, uint16_t* states, float* decoded) {
  switch (K) {
    case 1: return emulate<1>(cb, tiles, n, states, decoded);
    case 2: return emulate<2>(cb, tiles, n, states, decoded);
    case 3: return emulate<3>(cb, tiles, n, states, decoded);
    case 4: return emulate<4>(cb, tiles, n, states, decoded);
    case 5: return emulate<5>(cb, tiles, n, states, decoded);
    case 6: return emulate<6>(cb, tiles, n, states, decoded);
    case 7: return emulate<7>(cb, tiles, n, states, decoded);
    default: return emulate<8>(cb, tiles, n, states, decoded);
  }
}

double squared_error(const float* a, const float* b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}

// The emulated kernel and the CPU encoder run the same fp32 FMA arithmetic with the same tie order,
// so against the AVX2 path (FMA) the states agree exactly; against the scalar path (mul + add) the
// path may differ where costs differ in the last bit, so compare the error instead.
TEST(CudaViterbiEmulation, MatchesCpuEncoder) {
  auto rng = exl3::test::make_rng();
  const bool exact = q::viterbi_path_available(q::ViterbiPath::kAvx2);
  for (int K = 1; K <= 8; ++K) {
    for (tr::Codebook cb : kCodebooks) {
      const int n = K == 1 ? 1 : 2;
      std::normal_distribution<float> nd(0.0f, cb == tr::Codebook::kMul1 ? 1.0f : 1.2437f);
      std::vector<float> tiles(static_cast<size_t>(n) * tr::kTileSize);
      for (auto& x : tiles) x = nd(rng);
      std::vector<uint16_t> got(tiles.size()), want(tiles.size());
      std::vector<float> got_dec(tiles.size(), std::numeric_limits<float>::quiet_NaN()), want_dec(tiles.size());
      ASSERT_EQ(emulate_any(K, cb, tiles.data(), n, got.data(), got_dec.data()), 0u);
      q::encode_tiles(tiles.data(), n, K, cb, want.data(), want_dec.data(),
                      exact ? q::ViterbiPath::kAvx2 : q::ViterbiPath::kScalar);
      for (int t = 0; t < n; ++t) {
        const size_t o = static_cast<size_t>(t) * tr::kTileSize;
        EXPECT_TRUE(tr::is_tail_biting(got.data() + o, K)) << "K=" << K << " " << tr::codebook_name(cb);
        for (int p = 0; p < tr::kTileSize; ++p) {
          ASSERT_EQ(got_dec[o + p], tr::decode(got[o + p], cb)) << "K=" << K << " p=" << p;
        }
        if (exact) {
          for (int p = 0; p < tr::kTileSize; ++p) {
            ASSERT_EQ(got[o + p], want[o + p]) << "K=" << K << " " << tr::codebook_name(cb) << " tile " << t
                                               << " position " << p;
          }
        } else {
          const double eg = squared_error(got_dec.data() + o, tiles.data() + o, tr::kTileSize);
          const double ew = squared_error(want_dec.data() + o, tiles.data() + o, tr::kTileSize);
          EXPECT_NEAR(eg, ew, 1e-4 * ew + 1e-9) << "K=" << K << " " << tr::codebook_name(cb);
        }
      }
    }
  }
}

TEST(CudaViterbiEmulation, RecoversExactlyDecodableTiles) {
  auto rng = exl3::test::make_rng();
  for (int K : {2, 3, 6, 8}) {
    for (tr::Codebook cb : kCodebooks) {
      std::vector<uint16_t> symbols(tr::kTileSize), packed(tr::tile_words16(K)), truth(tr::kTileSize);
      for (auto& s : symbols) s = static_cast<uint16_t>(rng() & ((1u << K) - 1u));
      tr::pack_tile(symbols.data(), K, packed.data());
      tr::unpack_tile(packed.data(), K, truth.data());
      std::vector<float> target(tr::kTileSize), decoded(tr::kTileSize);
      for (int p = 0; p < tr::kTileSize; ++p) target[p] = tr::decode(truth[p], cb);
      std::vector<uint16_t> states(tr::kTileSize);
      ASSERT_EQ(emulate_any(K, cb, target.data(), 1, states.data(), decoded.data()), 0u);
      EXPECT_EQ(squared_error(decoded.data(), target.data(), tr::kTileSize), 0.0) << "K=" << K;
      EXPECT_TRUE(tr::is_tail_biting(states.data(), K));
    }
  }
}

TEST(CudaViterbiPlan, WorkspaceAndSharedMemory) {
  for (int K = 1; K <= 8; ++K) {
    EXPECT_EQ(exl3::cuda::encode_tiles_cuda_workspace(1, K), 256u + (size_t{256} << (16 - K)));
    EXPECT_EQ(exl3::cuda::encode_tiles_cuda_workspace(132, K), 256u + 132 * (size_t{256} << (16 - K)));
    EXPECT_EQ(exl3::cuda::encode_tiles_cuda_workspace(0, K), 0u);
  }
  EXPECT_EQ(exl3::cuda::encode_tiles_cuda_workspace(4, 0), 0u);
  EXPECT_EQ(exl3::cuda::encode_tiles_cuda_workspace(4, 9), 0u);
  // 8 MiB of back-pointers per tile at K = 1, 64 KiB at K = 8.
  EXPECT_EQ(vit::Cfg<1>::kBpBytes, size_t{8} << 20);
  EXPECT_EQ(vit::Cfg<8>::kBpBytes, size_t{64} << 10);
  EXPECT_LE(vit::Cfg<1>::kSmemBytes, size_t{227} << 10);
  EXPECT_LE(vit::Cfg<2>::kSmemBytes, size_t{227} << 10);
  EXPECT_LE(vit::Cfg<3>::kSmemBytes, size_t{227} << 10);
}

// Checks that happen before any CUDA call, so they hold without a device too.
TEST(CudaViterbiPlan, RejectsBadArgumentsWithoutTouchingTheDevice) {
  std::vector<float> tile(tr::kTileSize, 0.5f);
  std::vector<uint16_t> states(tr::kTileSize);
  for (int K : {0, 9, -1}) {
    EXPECT_EQ(exl3::cuda::encode_tiles_cuda(nullptr, 1, K, tr::Codebook::kMcg, nullptr, nullptr, nullptr, 0, nullptr),
              cudaErrorInvalidValue);
    EXPECT_THROW(exl3::cuda::encode_tiles_cuda_host(tile.data(), 1, K, tr::Codebook::kMcg, states.data()),
                 exl3::Error);
  }
  // Workspace too small for one tile.
  EXPECT_EQ(exl3::cuda::encode_tiles_cuda(nullptr, 1, 4, tr::Codebook::kMcg, nullptr, nullptr, nullptr, 1 << 20,
                                          nullptr),
            cudaErrorInvalidValue);
  tile[7] = std::numeric_limits<float>::infinity();
  try {
    exl3::cuda::encode_tiles_cuda_host(tile.data(), 1, 4, tr::Codebook::k3Inst, states.data());
    FAIL() << "expected exl3::Error";
  } catch (const exl3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tile 0 position 7"), std::string::npos) << e.what();
  }
}

TEST(CudaViterbiPlan, EncodeTilesOnCpuIsEncodeTiles) {
  auto rng = exl3::test::make_rng();
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> tiles(3 * tr::kTileSize);
  for (auto& x : tiles) x = nd(rng);
  std::vector<uint16_t> a(tiles.size()), b(tiles.size());
  std::vector<float> da(tiles.size()), db(tiles.size());
  q::encode_tiles_on(q::Device::kCpu, tiles.data(), 3, 3, tr::Codebook::kMul1, a.data(), da.data());
  q::encode_tiles(tiles.data(), 3, 3, tr::Codebook::kMul1, b.data(), db.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(da, db);
  EXPECT_EQ(q::parse_device("cpu"), q::Device::kCpu);
  EXPECT_EQ(q::parse_device("cuda"), q::Device::kCuda);
  EXPECT_STREQ(q::device_name(q::Device::kCuda), "cuda");
  EXPECT_THROW(q::parse_device("tpu"), exl3::Error);
  EXPECT_TRUE(q::encode_device_available(q::Device::kCpu));
}

}  // namespace
