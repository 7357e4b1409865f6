// Tile encoder: the tail-biting bitshift-trellis Viterbi search (docs/format.md, Viterbi tile
// encoder).
//
// One tile = 256 weights in tensor-core sequence order (trellis::perm_index). The encoder picks the
// 256 16-bit states, each the previous state shifted left by K bits plus a new K-bit symbol,
// wrapping around the tile, whose decoded codebook values have the least squared error against
// the tile. Costs are fp32 (exllamav3 uses fp16), so results are not bit-identical with
// exllamav3's encoder, but the search is the same two-pass algorithm and never worse.
#pragma once

#include <cstdint>

#include "exl3/trellis/codebook.hpp"

namespace exl3::quant {

// Which per-position kernel runs the search. kAuto picks AVX2+FMA when the CPU has it.
enum class ViterbiPath : uint8_t { kAuto, kScalar, kAvx2 };

// True when `path` can run on this CPU (kAuto and kScalar always can).
bool viterbi_path_available(ViterbiPath path);

// Name of the kernel `path` resolves to on this CPU: "avx2" or "scalar".
const char* viterbi_path_name(ViterbiPath path = ViterbiPath::kAuto);

// The decoded value of every 16-bit state (65536 floats, exact fp16 values), built once per
// codebook and shared by all callers.
const float* codebook_lut(trellis::Codebook cb);

// Encodes n tiles. tiles: [n, 256] fp32 in sequence order. states_out: [n, 256] full 16-bit
// states, every tile tail-biting (trellis::is_tail_biting holds). decoded_out (nullable):
// [n, 256] decoded values of those states. Tiles run in parallel with TBB (the caller's arena
// bounds the threads). Throws exl3::Error for K outside 1..8 or a non-finite input value.
void encode_tiles(const float* tiles, int64_t n, int K, trellis::Codebook cb, uint16_t* states_out,
                  float* decoded_out = nullptr, ViterbiPath path = ViterbiPath::kAuto);

// Packs n tiles of 256 states into the stored trellis words: [n, 16*K] (trellis::pack_tile).
void pack_tiles(const uint16_t* states, int64_t n, int K, uint16_t* words_out);

}  // namespace exl3::quant
