// Register-level trellis decode shared by the EXL3 GEMM kernels (tensor-core GEMM, swap-AB
// GEMV). Everything is a compile-time function of K so window offsets become immediates; the
// arithmetic is the codebook header's (include/exl3/trellis/codebook.hpp), bit for bit.
//
// Lane t of a warp owns sequence positions 8t..8t+7 of a tile (the format's tensor-core
// permutation): rows {2c, 2c+1, 2c+8, 2c+9} x columns {g, g+8} with g = t / 4, c = t % 4, as
// position j = 8t + i -> row 2c + (i & 1) + 8 * ((i >> 1) & 1), column g + 8 * (i >> 2).
// Its 8 states are 16-bit windows of the 7K + 16 stream bits ending at bit 8(t+1)K, read from
// three consecutive 32-bit words of the tile (two for K = 4).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::cuda::detail {

namespace tr = exl3::trellis;

// Where lane `lane`'s window span starts in a tile: words w0, w1, w2 (wrapping) and the bit
// offset inside w0. Same for every tile, so kernels compute it once.
template <int K>
struct LaneSpan {
  int w0, w1, w2, off;
  __device__ __forceinline__ explicit LaneSpan(int lane) {
    constexpr int kWords = 8 * K;
    const int bit0 = (8 * lane * K + K - 16 + 256 * K) % (256 * K);
    w0 = bit0 >> 5;
    off = bit0 & 31;
    w1 = (w0 + 1) % kWords;
    w2 = (w0 + 2) % kWords;
  }
};

// Words of the tile a lane's window span touches: K <= 2 spans at most 30 bits (two words at any
// offset), K = 4 starts at the lane-invariant offset 20 (exactly two), the rest need three.
template <int K>
constexpr int kLaneWords = (K <= 2 || K == 4) ? 2 : 3;

// Streaming load of trellis words: read once per kernel, so keep them out of L1 and leave it to
// the activations.
__device__ __forceinline__ uint32_t ld_stream(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// (x & kHalfPairMask) ^ kHalfPairXor in one LOP3: with both constants as immediates the compiler
// emits two, and this sits on the per-weight critical path.
__device__ __forceinline__ uint32_t half_pair_word_lop3(uint32_t x) {
  uint32_t y;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(y) : "r"(x), "r"(tr::kHalfPairMask), "r"(tr::kHalfPairXor));
  return y;
}

// Codebook decode of two states into one half2 (value of s0 in the low half), bit-exact with the
// scalar codebook: one __hadd per 3INST/MCG value, one __hfma per MUL1 value.
template <tr::Codebook CB>
__device__ __forceinline__ uint32_t decode_pair(uint32_t s0, uint32_t s1) {
  if constexpr (CB == tr::Codebook::kMul1) {
    const uint32_t h0 = __dp4a(s0 * tr::kMul1Mult, 0x01010101u, 0x6400u);  // unsigned bytes
    const uint32_t h1 = __dp4a(s1 * tr::kMul1Mult, 0x01010101u, 0x6400u);
    const uint32_t h = __byte_perm(h0, h1, 0x5410);
    const __half2 kinv = __halves2half2(__ushort_as_half(tr::kMul1InvBits), __ushort_as_half(tr::kMul1InvBits));
    const __half2 kbias = __halves2half2(__ushort_as_half(tr::kMul1BiasBits), __ushort_as_half(tr::kMul1BiasBits));
    const __half2 v = __hfma2(*reinterpret_cast<const __half2*>(&h), kinv, kbias);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    uint32_t x0, x1;
    if constexpr (CB == tr::Codebook::kMcg) {
      x0 = s0 * tr::kMcgMult;
      x1 = s1 * tr::kMcgMult;
    } else {
      x0 = s0 * tr::k3InstMult + tr::k3InstAdd;
      x1 = s1 * tr::k3InstMult + tr::k3InstAdd;
    }
    const uint32_t y0 = half_pair_word_lop3(x0), y1 = half_pair_word_lop3(x1);
    const uint32_t lo = __byte_perm(y0, y1, 0x5410), hi = __byte_perm(y0, y1, 0x7632);
    const __half2 v = __hadd2(*reinterpret_cast<const __half2*>(&lo), *reinterpret_cast<const __half2*>(&hi));
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// 3INST/MCG: the 32-bit word whose two fp16 halves sum to the state's value, unrounded. A kernel
// that multiplies both halves by the same activation and accumulates in fp32 gets the exact
// two-term codebook value without the PRMT/HADD2 pairing (the fp16 rounding of the sum is
// skipped: at most 2^-11 relative per weight).
template <tr::Codebook CB>
__device__ __forceinline__ uint32_t decode_halves(uint32_t s) {
  static_assert(CB != tr::Codebook::kMul1, "MUL1 values are not a sum of two halves");
  if constexpr (CB == tr::Codebook::kMcg) {
    return half_pair_word_lop3(s * tr::kMcgMult);
  } else {
    return half_pair_word_lop3(s * tr::k3InstMult + tr::k3InstAdd);
  }
}

// 16 bits starting at bit R (MSB-first) of the 96-bit value v0:v1:v2. Byte-aligned windows inside
// one word are a single PRMT; others a funnel shift plus a shift or mask.
template <int R>
__device__ __forceinline__ uint32_t window16(uint32_t v0, uint32_t v1, uint32_t v2) {
  static_assert(R >= 0 && R + 16 <= 96, "window outside the three words");
  constexpr int W = R / 32, B = R % 32;  // word holding the first bit, bit offset inside it
  const uint32_t lo = W == 0 ? v0 : (W == 1 ? v1 : v2);
  if constexpr (B + 16 <= 32) {
    if constexpr (B % 8 == 0) {
      return __byte_perm(lo, 0u, 0x4400u | ((3u - B / 8) << 4) | (2u - B / 8));
    } else {
      return (lo >> (16 - B)) & 0xFFFFu;
    }
  } else {
    const uint32_t next = W == 0 ? v1 : v2;  // the window straddles into the next word
    return __funnelshift_l(next, lo, B) >> 16;
  }
}

// For K = 4 and 8 every lane's window span starts at the same bit offset within its first word
// (8*lane*K is a multiple of 32), so the windows sit at compile-time positions of the raw words.
template <int K>
constexpr bool kLaneInvariantOffset = (8 * K) % 32 == 0;
template <int K>
constexpr int kFixedOffset = ((K - 16) % 32 + 32) % 32;

template <int K, tr::Codebook CB, int O>
__device__ __forceinline__ void decode_windows(uint32_t v0, uint32_t v1, uint32_t v2, uint32_t (&b)[4]) {
  b[0] = decode_pair<CB>(window16<O + 0 * K>(v0, v1, v2), window16<O + 1 * K>(v0, v1, v2));
  b[1] = decode_pair<CB>(window16<O + 2 * K>(v0, v1, v2), window16<O + 3 * K>(v0, v1, v2));
  b[2] = decode_pair<CB>(window16<O + 4 * K>(v0, v1, v2), window16<O + 5 * K>(v0, v1, v2));
  b[3] = decode_pair<CB>(window16<O + 6 * K>(v0, v1, v2), window16<O + 7 * K>(v0, v1, v2));
}

// The lane's 8 states from its three words: at fixed positions for K = 4, 8, otherwise after
// normalising the words so the first window starts at bit 0.
template <int K, tr::Codebook CB>
__device__ __forceinline__ void decode_lane(uint32_t u0, uint32_t u1, uint32_t u2, int off, uint32_t (&b)[4]) {
  if constexpr (kLaneInvariantOffset<K>) {
    decode_windows<K, CB, kFixedOffset<K>>(u0, u1, u2, b);
  } else {
    const uint32_t v0 = __funnelshift_l(u1, u0, off);
    const uint32_t v1 = __funnelshift_l(u2, u1, off);
    const uint32_t v2 = u2 << off;
    decode_windows<K, CB, 0>(v0, v1, v2, b);
  }
}

// The lane's 8 states as unrounded half-pair words (see decode_halves), in position order.
template <int K, tr::Codebook CB, int O>
__device__ __forceinline__ void decode_windows_halves(uint32_t v0, uint32_t v1, uint32_t v2, uint32_t (&y)[8]) {
  y[0] = decode_halves<CB>(window16<O + 0 * K>(v0, v1, v2));
  y[1] = decode_halves<CB>(window16<O + 1 * K>(v0, v1, v2));
  y[2] = decode_halves<CB>(window16<O + 2 * K>(v0, v1, v2));
  y[3] = decode_halves<CB>(window16<O + 3 * K>(v0, v1, v2));
  y[4] = decode_halves<CB>(window16<O + 4 * K>(v0, v1, v2));
  y[5] = decode_halves<CB>(window16<O + 5 * K>(v0, v1, v2));
  y[6] = decode_halves<CB>(window16<O + 6 * K>(v0, v1, v2));
  y[7] = decode_halves<CB>(window16<O + 7 * K>(v0, v1, v2));
}

template <int K, tr::Codebook CB>
__device__ __forceinline__ void decode_lane_halves(uint32_t u0, uint32_t u1, uint32_t u2, int off, uint32_t (&y)[8]) {
  if constexpr (kLaneInvariantOffset<K>) {
    decode_windows_halves<K, CB, kFixedOffset<K>>(u0, u1, u2, y);
  } else {
    const uint32_t v0 = __funnelshift_l(u1, u0, off);
    const uint32_t v1 = __funnelshift_l(u2, u1, off);
    const uint32_t v2 = u2 << off;
    decode_windows_halves<K, CB, 0>(v0, v1, v2, y);
  }
}

}  // namespace exl3::cuda::detail
