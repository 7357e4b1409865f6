// CUDA tile encoder vs the CPU encoder on fresh random tiles, every K x codebook: tail-biting
// output, decoded_out == decode(state), per-tile error within 1% of the CPU's (and, against the
// CPU's AVX2 path, identical states: same fp32 FMA arithmetic and tie order), poisoned outputs
// fully overwritten, exact recovery of decodable tiles, batching through a small workspace, the
// host wrappers, bad arguments. Each test skips where no CUDA device exists.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/viterbi.hpp"
#include "exl3/error.hpp"
#include "exl3/quant/encode.hpp"
#include "exl3/quant/viterbi.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/codebook.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace {

namespace q = exl3::quant;
namespace tr = exl3::trellis;
using exl3::cuda::DeviceBuffer;
using exl3::cuda::encode_tiles_cuda;
using exl3::cuda::encode_tiles_cuda_workspace;

constexpr tr::Codebook kCodebooks[] = {tr::Codebook::k3Inst, tr::Codebook::kMcg,
                                       tr::Codebook::kMul1};

std::vector<float> gaussian_tiles(std::mt19937_64& rng, int64_t n, tr::Codebook cb) {
  std::normal_distribution<float> nd(0.0f, cb == tr::Codebook::kMul1 ? 1.0f : 1.2437f);
  std::vector<float> t(static_cast<size_t>(n) * tr::kTileSize);
  for (auto& x : t) x = nd(rng);
  return t;
}

double tile_mse(const float* a, const float* b) {
  double s = 0.0;
  for (int i = 0; i < tr::kTileSize; ++i)
    s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s / tr::kTileSize;
}

int tiles_for(int K) {
  return K == 1 ? 16 : (K == 2 ? 48 : 96);
}

// Runs the device encoder on host tiles with poisoned outputs. `flight` sets the workspace (tiles
// in flight; fewer than n makes blocks loop over several tiles). A CUDA error throws exl3::Error.
void run_device(const std::vector<float>& tiles, int64_t n, int K, tr::Codebook cb, int64_t flight,
                uint16_t state_poison, std::vector<uint16_t>& states, std::vector<float>* decoded) {
  const size_t elems = static_cast<size_t>(n) * tr::kTileSize;
  auto d_tiles = DeviceBuffer::of<float>(elems, "d_tiles");
  auto d_dec = DeviceBuffer::of<float>(elems, "d_dec");
  auto d_states = DeviceBuffer::of<uint16_t>(elems, "d_states");
  const size_t ws_bytes = encode_tiles_cuda_workspace(flight, K);
  DeviceBuffer d_ws(ws_bytes, "d_ws");
  std::vector<uint16_t> poison(elems, state_poison);
  EXL3_CUDA_CHECK(cudaMemcpy(d_tiles.as<float>(), tiles.data(), elems * 4, cudaMemcpyHostToDevice));
  EXL3_CUDA_CHECK(
      cudaMemcpy(d_states.as<uint16_t>(), poison.data(), elems * 2, cudaMemcpyHostToDevice));
  EXL3_CUDA_CHECK(cudaMemset(d_dec.as<float>(), 0xFF, elems * 4));  // poison decoded (NaN)
  EXL3_CUDA_CHECK(encode_tiles_cuda(d_tiles.as<float>(), n, K, cb, d_states.as<uint16_t>(),
                                    decoded != nullptr ? d_dec.as<float>() : nullptr, d_ws.get(),
                                    ws_bytes, nullptr));
  EXL3_CUDA_CHECK(cudaDeviceSynchronize());
  uint32_t failures = 1;
  EXL3_CUDA_CHECK(exl3::cuda::encode_tiles_cuda_failures(d_ws.get(), &failures, nullptr));
  EXPECT_EQ(failures, 0u) << "K=" << K << ": traced paths that do not close";
  states.resize(elems);
  EXL3_CUDA_CHECK(
      cudaMemcpy(states.data(), d_states.as<uint16_t>(), elems * 2, cudaMemcpyDeviceToHost));
  if (decoded != nullptr) {
    decoded->resize(elems);
    EXL3_CUDA_CHECK(
        cudaMemcpy(decoded->data(), d_dec.as<float>(), elems * 4, cudaMemcpyDeviceToHost));
  }
}

TEST(CudaViterbi, MatchesCpuEncoderEveryKAndCodebook) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  const bool cpu_fma = q::viterbi_path_available(q::ViterbiPath::kAvx2);
  for (int K = 1; K <= 8; ++K) {
    for (tr::Codebook cb : kCodebooks) {
      const int n = tiles_for(K);
      const auto tiles = gaussian_tiles(rng, n, cb);
      std::vector<uint16_t> got, want(tiles.size());
      std::vector<float> got_dec, want_dec(tiles.size());
      run_device(tiles, n, K, cb, n, 0xFFFF, got, &got_dec);
      q::encode_tiles(tiles.data(), n, K, cb, want.data(), want_dec.data());

      double sum_got = 0.0, sum_want = 0.0;
      int identical_tiles = 0;
      for (int t = 0; t < n; ++t) {
        const size_t o = static_cast<size_t>(t) * tr::kTileSize;
        ASSERT_TRUE(tr::is_tail_biting(got.data() + o, K))
            << "K=" << K << " " << tr::codebook_name(cb) << " tile " << t;
        for (int p = 0; p < tr::kTileSize; ++p) {
          ASSERT_EQ(got_dec[o + p], tr::decode(got[o + p], cb))  // also: no NaN poison left
              << "K=" << K << " " << tr::codebook_name(cb) << " tile " << t << " position " << p;
        }
        const double eg = tile_mse(got_dec.data() + o, tiles.data() + o);
        const double ew = tile_mse(want_dec.data() + o, tiles.data() + o);
        sum_got += eg;
        sum_want += ew;
        EXPECT_TRUE(std::abs(eg - ew) <= 0.01 * ew || std::abs(eg - ew) <= 1e-6)
            << "K=" << K << " " << tr::codebook_name(cb) << " tile " << t << ": gpu mse " << eg
            << " cpu " << ew;
        identical_tiles +=
            std::memcmp(got.data() + o, want.data() + o, tr::kTileSize * 2) == 0 ? 1 : 0;
      }
      EXPECT_NEAR(sum_got / n, sum_want / n, 0.01 * sum_want / n)
          << "K=" << K << " " << tr::codebook_name(cb);
      if (cpu_fma) {
        // Same fp32 FMA costs, same tie order: the same path, bit for bit.
        EXPECT_EQ(identical_tiles, n) << "K=" << K << " " << tr::codebook_name(cb)
                                      << ": tiles whose states differ from the CPU (AVX2) encoder";
      }
    }
  }
}

// Outputs are written everywhere (two different poisons give identical results), with and
// without decoded_out, and a workspace for 3 tiles in flight gives the same states as one for all.
TEST(CudaViterbi, DeterministicAcrossPoisonsAndWorkspaceSizes) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  for (int K : {1, 2, 4, 7}) {
    const int n = K == 1 ? 7 : 21;
    const auto tiles = gaussian_tiles(rng, n, tr::Codebook::kMcg);
    std::vector<uint16_t> a, b, c;
    std::vector<float> da;
    run_device(tiles, n, K, tr::Codebook::kMcg, n, 0xFFFF, a, &da);
    run_device(tiles, n, K, tr::Codebook::kMcg, 3, 0x0000, b, nullptr);
    run_device(tiles, n, K, tr::Codebook::kMcg, 1, 0x5A5A, c, nullptr);
    EXPECT_EQ(a, b) << "K=" << K;
    EXPECT_EQ(a, c) << "K=" << K;
  }
}

TEST(CudaViterbi, RecoversExactlyDecodableTiles) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  for (int K = 1; K <= 8; ++K) {
    for (tr::Codebook cb : kCodebooks) {
      const int n = K == 1 ? 4 : 16;
      std::vector<float> target(static_cast<size_t>(n) * tr::kTileSize);
      std::vector<uint16_t> symbols(tr::kTileSize), packed(tr::tile_words16(K)),
          truth(tr::kTileSize);
      for (int t = 0; t < n; ++t) {
        for (auto& s : symbols) s = static_cast<uint16_t>(rng() & ((1u << K) - 1u));
        tr::pack_tile(symbols.data(), K, packed.data());
        tr::unpack_tile(packed.data(), K, truth.data());
        ASSERT_TRUE(tr::is_tail_biting(truth.data(), K));
        for (int p = 0; p < tr::kTileSize; ++p)
          target[t * tr::kTileSize + p] = tr::decode(truth[p], cb);
      }
      std::vector<uint16_t> states;
      std::vector<float> decoded;
      run_device(target, n, K, cb, n, 0xFFFF, states, &decoded);
      for (int t = 0; t < n; ++t) {
        const size_t o = static_cast<size_t>(t) * tr::kTileSize;
        EXPECT_EQ(tile_mse(decoded.data() + o, target.data() + o), 0.0)
            << "K=" << K << " " << tr::codebook_name(cb) << " tile " << t;
        EXPECT_TRUE(tr::is_tail_biting(states.data() + o, K));
      }
    }
  }
}

TEST(CudaViterbi, HostWrappersMatchTheDevicePath) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  for (int K : {3, 5, 8}) {
    const int n = 40;
    const auto tiles = gaussian_tiles(rng, n, tr::Codebook::kMul1);
    std::vector<uint16_t> dev, host(tiles.size()), on(tiles.size());
    std::vector<float> dev_dec, host_dec(tiles.size(), std::numeric_limits<float>::quiet_NaN());
    run_device(tiles, n, K, tr::Codebook::kMul1, n, 0xFFFF, dev, &dev_dec);
    exl3::cuda::encode_tiles_cuda_host(tiles.data(), n, K, tr::Codebook::kMul1, host.data(),
                                       host_dec.data());
    q::encode_tiles_on(q::Device::kCuda, tiles.data(), n, K, tr::Codebook::kMul1, on.data());
    EXPECT_EQ(host, dev) << "K=" << K;
    EXPECT_EQ(host_dec, dev_dec) << "K=" << K;
    EXPECT_EQ(on, dev) << "K=" << K;
  }
  EXPECT_TRUE(q::encode_device_available(q::Device::kCuda));
}

TEST(CudaViterbi, RejectsBadArguments) {
  EXL3_REQUIRE_GPU();
  auto tiles = DeviceBuffer::of<float>(tr::kTileSize, "tiles");
  auto states = DeviceBuffer::of<uint16_t>(tr::kTileSize, "states");
  const size_t ws_bytes = encode_tiles_cuda_workspace(1, 8);
  DeviceBuffer ws(ws_bytes, "ws");
  EXL3_CUDA_CHECK(cudaMemset(tiles.as<float>(), 0, tr::kTileSize * 4));
  for (int K : {0, 9}) {
    EXPECT_EQ(encode_tiles_cuda(tiles.as<float>(), 1, K, tr::Codebook::kMcg, states.as<uint16_t>(),
                                nullptr, ws.get(), ws_bytes, nullptr),
              cudaErrorInvalidValue);
  }
  EXPECT_EQ(encode_tiles_cuda(tiles.as<float>(), -1, 8, tr::Codebook::kMcg, states.as<uint16_t>(),
                              nullptr, ws.get(), ws_bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(encode_tiles_cuda(tiles.as<float>(), 1, 8, tr::Codebook::kMcg, states.as<uint16_t>(),
                              nullptr, ws.get(), ws_bytes - 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(encode_tiles_cuda(nullptr, 1, 8, tr::Codebook::kMcg, states.as<uint16_t>(), nullptr,
                              ws.get(), ws_bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(encode_tiles_cuda(tiles.as<float>(), 0, 8, tr::Codebook::kMcg, states.as<uint16_t>(),
                              nullptr, ws.get(), ws_bytes, nullptr),
            cudaSuccess);
  EXL3_CUDA_CHECK(cudaDeviceSynchronize());
  EXL3_CUDA_CHECK(cudaGetLastError());
}

// Not a pass/fail benchmark: records tiles/s per K (MCG) so runs leave a trace in the test log.
TEST(CudaViterbi, ThroughputReport) {
  EXL3_REQUIRE_GPU();
  for (int K = 1; K <= 8; ++K) {
    const int64_t resident = exl3::cuda::encode_tiles_cuda_resident_tiles(K);
    ASSERT_GT(resident, 0) << "K=" << K;
    const int n = static_cast<int>(resident * (K == 1 ? 1 : 2));
    const double tps = exl3::cuda::encode_tiles_cuda_tiles_per_second(K, tr::Codebook::kMcg, n);
    EXPECT_GT(tps, 0.0);
    std::printf("[ viterbi ] K=%d mcg: %.0f tiles/s (%d tiles, %lld resident)\n", K, tps, n,
                static_cast<long long>(resident));
    RecordProperty("tiles_per_second_K" + std::to_string(K),
                   std::to_string(static_cast<int64_t>(tps)));
  }
}

}  // namespace
