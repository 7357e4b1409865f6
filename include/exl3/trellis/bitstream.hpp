// The EXL3 tile bitstream (docs/format.md, Bitstream and Tile permutation): tail-biting state
// windows, packing, and the tensor-core element permutation.
//
// One tile = 16x16 weights = 256 symbols of K bits = 16*K stored int16 words. Read as 8*K
// little-endian uint32 words U[m], the stream is MSB-first: stream bit b is bit (31 - b%32) of
// U[b/32]. Sequence position p owns bits [p*K, p*K + K); its 16-bit state is the window that ends
// at the last bit of symbol p, wrapping around the end of the same tile.
#pragma once

#include <cstdint>

#include "exl3/trellis/hd.hpp"

namespace exl3::trellis {

inline constexpr int kTileDim = 16;
inline constexpr int kTileSize = 256;    // weights (= symbols = states) per tile
inline constexpr int kStateBits = 16;
inline constexpr int kMinBits = 1;
inline constexpr int kMaxBits = 8;

EXL3_HD constexpr int tile_words16(int K) { return 16 * K; }  // stored int16 words per tile
EXL3_HD constexpr int tile_words32(int K) { return 8 * K; }   // uint32 words per tile
EXL3_HD constexpr bool valid_bits(int K) { return K >= kMinBits && K <= kMaxBits; }

// The tile's i-th little-endian uint32 word from its stored int16 words.
EXL3_HD uint32_t tile_word32(const uint16_t* tile, int i) {
  return static_cast<uint32_t>(tile[2 * i]) | (static_cast<uint32_t>(tile[2 * i + 1]) << 16);
}

// State of sequence position p (0..255) in a tile of K-bit symbols.
EXL3_HD uint32_t unpack_state(const uint16_t* tile, int K, int p) {
  const int total = 256 * K;
  // First bit of the 16-bit window ending at bit (p+1)*K, taken modulo the stream length.
  int start = (p + 1) * K - kStateBits;
  if (start < 0) start += total;
  const int w = start >> 5;
  const int off = start & 31;
  const int w1 = (w + 1 == 8 * K) ? 0 : w + 1;
  const uint64_t pair = (static_cast<uint64_t>(tile_word32(tile, w)) << 32) | tile_word32(tile, w1);
  return static_cast<uint32_t>(pair >> (64 - kStateBits - off)) & 0xFFFFu;
}

// All 256 states of a tile, in sequence order.
EXL3_HD void unpack_tile(const uint16_t* tile, int K, uint16_t* states) {
  for (int p = 0; p < kTileSize; ++p) states[p] = static_cast<uint16_t>(unpack_state(tile, K, p));
}

// Pack 256 states into 16*K int16 words. Only the low K bits of each state (its newest symbol)
// are stored; a valid trellis is tail-biting, so unpack_tile() gives the states back.
EXL3_HD void pack_tile(const uint16_t* states, int K, uint16_t* tile) {
  for (int i = 0; i < 8 * K; ++i) {
    uint32_t word = 0;
    for (int b = 0; b < 32; ++b) {
      const int bit = 32 * i + b;  // stream bit index, MSB first in the word
      const int p = bit / K;
      const int within = bit - p * K;  // 0 = most significant bit of symbol p
      const uint32_t sym = states[p] & ((1u << K) - 1u);
      word |= ((sym >> (K - 1 - within)) & 1u) << (31 - b);
    }
    tile[2 * i] = static_cast<uint16_t>(word & 0xFFFFu);
    tile[2 * i + 1] = static_cast<uint16_t>(word >> 16);
  }
}

// Tail-biting invariant of a 256-state sequence: state_p == ((state_{p-1} << K) | sym_p) & 0xFFFF
// for every p, with state_{-1} = state_255.
EXL3_HD bool is_tail_biting(const uint16_t* states, int K) {
  uint32_t prev = states[kTileSize - 1];
  for (int p = 0; p < kTileSize; ++p) {
    const uint32_t s = states[p];
    if (((prev << K) & 0xFFFFu) != (s & ~((1u << K) - 1u) & 0xFFFFu)) return false;
    prev = s;
  }
  return true;
}

// Tensor-core permutation: sequence position p -> (row r = input offset k, column c = output
// offset n) inside the 16x16 tile, following the mma.m16n8k16 B-fragment layout. Lane t = p/8
// holds positions 8t..8t+7, which fill its two B fragments (columns 0-7 and 8-15).
EXL3_HD constexpr int perm_row(int p) {
  const int t = p >> 3;
  const int j = p & 7;
  return 2 * (t & 3) + (j & 1) + ((j & 2) << 2);  // row step [0, 1, 8, 9][j % 4]
}

EXL3_HD constexpr int perm_col(int p) { return ((p >> 3) >> 2) + ((p & 7) >= 4 ? 8 : 0); }

// Row-major index (16*r + c) of sequence position p.
EXL3_HD constexpr int perm_index(int p) { return 16 * perm_row(p) + perm_col(p); }

// Inverse: the sequence position that holds tile element (r, c).
EXL3_HD constexpr int perm_position(int r, int c) {
  const int t = (c & 7) * 4 + ((r & 7) >> 1);
  const int j = ((r & 1) | ((r & 8) ? 2 : 0)) + ((c & 8) ? 4 : 0);
  return 8 * t + j;
}

}  // namespace exl3::trellis
