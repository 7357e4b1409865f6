// Host-memory wrapper and throughput helper around encode_tiles_cuda (g++: exl3::Error, fmt).
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/viterbi.hpp"
#include "exl3/error.hpp"
#include "exl3/trellis/bitstream.hpp"

namespace exl3::cuda {

namespace {

namespace tr = exl3::trellis;

constexpr size_t kMaxScratch = size_t{2} << 30;    // back-pointer scratch cap (2 GiB)
constexpr int64_t kChunkTiles = int64_t{1} << 16;  // tiles per upload (64 Ki tiles = 16 MiB fp32)

// Tiles in flight for n tiles: the resident blocks (no benefit beyond), within the scratch cap.
int64_t tiles_in_flight(int64_t n, int K) {
  const int64_t resident = encode_tiles_cuda_resident_tiles(K);
  if (resident < 1) fail("CUDA encode_tiles: no usable CUDA device (or K={} invalid)", K);
  const auto per_tile =
      static_cast<int64_t>(encode_tiles_cuda_workspace(2, K) - encode_tiles_cuda_workspace(1, K));
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(kMaxScratch) / per_tile);
  return std::max<int64_t>(1, std::min({n, resident, cap}));
}

}  // namespace

void encode_tiles_cuda_host(const float* tiles, int64_t n, int K, trellis::Codebook cb,
                            uint16_t* states, float* decoded) {
  if (!tr::valid_bits(K)) fail("encode_tiles_cuda_host: K={} outside 1..8", K);
  if (n < 0) fail("encode_tiles_cuda_host: negative tile count {}", n);
  if (n == 0) return;
  if (tiles == nullptr || states == nullptr)
    fail("encode_tiles_cuda_host: null tile or state buffer");
  for (int64_t i = 0; i < n * tr::kTileSize; ++i) {
    if (!std::isfinite(tiles[i])) {
      fail("encode_tiles_cuda_host: tile {} position {} is {} (inputs must be finite)",
           i / tr::kTileSize, i % tr::kTileSize, tiles[i]);
    }
  }
  const int64_t chunk = std::min(n, kChunkTiles);
  const int64_t flight = tiles_in_flight(chunk, K);
  const size_t ws_bytes = encode_tiles_cuda_workspace(flight, K);
  const auto tile_bytes = static_cast<size_t>(tr::kTileSize);
  DeviceBuffer d_tiles(static_cast<size_t>(chunk) * tile_bytes * sizeof(float),
                       "the encoder's tiles");
  DeviceBuffer d_states(static_cast<size_t>(chunk) * tile_bytes * sizeof(uint16_t),
                        "the encoder's states");
  DeviceBuffer d_decoded(
      decoded != nullptr ? static_cast<size_t>(chunk) * tile_bytes * sizeof(float) : 0,
      "the encoder's decoded values");
  DeviceBuffer d_ws(ws_bytes, "the encoder's back-pointer workspace");
  for (int64_t first = 0; first < n; first += chunk) {
    const int64_t m = std::min(chunk, n - first);
    const size_t elems = static_cast<size_t>(m) * tile_bytes;
    EXL3_CUDA_CHECK(cudaMemcpy(d_tiles.get(), tiles + first * tr::kTileSize, elems * sizeof(float),
                               cudaMemcpyHostToDevice),
                    "CUDA encode_tiles: uploading tiles");
    EXL3_CUDA_CHECK(encode_tiles_cuda(d_tiles.as<float>(), m, K, cb, d_states.as<uint16_t>(),
                                      decoded != nullptr ? d_decoded.as<float>() : nullptr,
                                      d_ws.get(), ws_bytes, nullptr),
                    "CUDA encode_tiles: launching the encoder");
    uint32_t failures = 0;
    EXL3_CUDA_CHECK(encode_tiles_cuda_failures(d_ws.get(), &failures, nullptr),
                    "CUDA encode_tiles: running the encoder");
    if (failures != 0) {
      fail("CUDA encode_tiles: internal error, {} of {} traced paths are not tail-biting (K={})",
           failures, m, K);
    }
    EXL3_CUDA_CHECK(cudaMemcpy(states + first * tr::kTileSize, d_states.get(),
                               elems * sizeof(uint16_t), cudaMemcpyDeviceToHost),
                    "CUDA encode_tiles: downloading states");
    if (decoded != nullptr) {
      EXL3_CUDA_CHECK(cudaMemcpy(decoded + first * tr::kTileSize, d_decoded.get(),
                                 elems * sizeof(float), cudaMemcpyDeviceToHost),
                      "CUDA encode_tiles: downloading decoded values");
    }
  }
}

double encode_tiles_cuda_tiles_per_second(int K, trellis::Codebook cb, int n) {
  if (!tr::valid_bits(K)) fail("encode_tiles_cuda_tiles_per_second: K={} outside 1..8", K);
  if (n < 1) fail("encode_tiles_cuda_tiles_per_second: tile count {} must be positive", n);
  std::mt19937_64 rng(0x5EED + static_cast<uint64_t>(K));
  std::normal_distribution<float> nd(0.0f, cb == trellis::Codebook::kMul1 ? 1.0f : 1.2437f);
  std::vector<float> host(static_cast<size_t>(n) * tr::kTileSize);
  for (auto& x : host) x = nd(rng);

  const int64_t flight = tiles_in_flight(n, K);
  const size_t ws_bytes = encode_tiles_cuda_workspace(flight, K);
  DeviceBuffer d_tiles(host.size() * sizeof(float), "the encoder's tiles");
  DeviceBuffer d_states(host.size() * sizeof(uint16_t), "the encoder's states");
  DeviceBuffer d_ws(ws_bytes, "the encoder's back-pointer workspace");
  EXL3_CUDA_CHECK(
      cudaMemcpy(d_tiles.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
      "CUDA encode_tiles: uploading tiles");

  cudaEvent_t start = nullptr, stop = nullptr;
  EXL3_CUDA_CHECK(cudaEventCreate(&start), "CUDA encode_tiles: creating an event");
  EXL3_CUDA_CHECK(cudaEventCreate(&stop), "CUDA encode_tiles: creating an event");
  auto run = [&] {
    return encode_tiles_cuda(d_tiles.as<float>(), n, K, cb, d_states.as<uint16_t>(), nullptr,
                             d_ws.get(), ws_bytes, nullptr);
  };
  cudaError_t e = run();  // warm-up (module load, shared memory carve-out)
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaEventRecord(start, nullptr);
  if (e == cudaSuccess) e = run();
  if (e == cudaSuccess) e = cudaEventRecord(stop, nullptr);
  if (e == cudaSuccess) e = cudaEventSynchronize(stop);
  float ms = 0.0f;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start, stop);
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  EXL3_CUDA_CHECK(e, "CUDA encode_tiles: timing the encoder");
  return ms > 0.0f ? static_cast<double>(n) / (static_cast<double>(ms) * 1e-3) : 0.0;
}

}  // namespace exl3::cuda
