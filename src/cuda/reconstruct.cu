// Reconstruct kernel: one warp per 16x16 tile, each lane decoding 8 sequence positions (its two
// mma B fragments) straight from the shared trellis header, so host and device decode agree by
// construction (tests/cuda/reconstruct_test.cpp checks it bit for bit).
#include "exl3/cuda/reconstruct.hpp"
#include "exl3/trellis/dispatch.hpp"

#include "exl3/trellis/tile.hpp"

namespace exl3::cuda {
namespace {

namespace tr = exl3::trellis;

template <int K, tr::Codebook CB>
__global__ void reconstruct_kernel(const uint16_t* __restrict__ trellis, int64_t tiles_k,
                                   int64_t tiles_n, int64_t out_features,
                                   uint16_t* __restrict__ out) {
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (tile >= tiles_k * tiles_n) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = tile / tiles_n, j = tile % tiles_n;
  const uint16_t* src = trellis + tile * tr::tile_words16(K);
  for (int q = 0; q < 8; ++q) {
    const int p = lane * 8 + q;
    const uint16_t v = tr::decode_bits_t<CB>(tr::unpack_state(src, K, p));
    out[(16 * i + tr::perm_row(p)) * out_features + 16 * j + tr::perm_col(p)] = v;
  }
}

template <int K>
cudaError_t launch_k(const uint16_t* t, int64_t tk, int64_t tn, int64_t out, tr::Codebook cb,
                     uint16_t* o, cudaStream_t s) {
  constexpr int kWarps = 8;
  const int64_t blocks = (tk * tn + kWarps - 1) / kWarps;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks)), block(32 * kWarps);
  tr::with_codebook(cb, [&](auto c) {
    reconstruct_kernel<K, decltype(c)::value><<<grid, block, 0, s>>>(t, tk, tn, out, o);
  });
  return cudaGetLastError();
}

}  // namespace

cudaError_t reconstruct_w_hat(const uint16_t* d_trellis, int64_t in_features, int64_t out_features,
                              int K, trellis::Codebook cb, uint16_t* d_out, cudaStream_t stream) {
  if (in_features <= 0 || out_features <= 0 || in_features % 16 != 0 || out_features % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t tk = in_features / 16, tn = out_features / 16;
  return tr::with_bits(K, cudaErrorInvalidValue, [&](auto k) {
    return launch_k<decltype(k)::value>(d_trellis, tk, tn, out_features, cb, d_out, stream);
  });
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

}  // namespace exl3::cuda
