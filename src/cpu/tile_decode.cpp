// Tile decode for the CPU path: a portable scalar version built from the shared trellis header,
// and an AVX2/F16C version used when the CPU supports it. Both produce identical fp16 values
// (tests/cpu/tile_decode_test.cpp checks every state of every codebook and every K).
//
// The vector version keeps the exact rounding of the format: the two fp16 halves of 3INST/MCG are
// normal numbers (exponent forced to 0b011xx), so they widen to fp32 with integer shifts, their
// sum is exact in fp32, and vcvtps2ph (round to nearest even) performs the single fp16 rounding.
// For MUL1, h * k_inv + k_bias is exact in fp32 (22 significant bits), so FMA + vcvtps2ph equals
// the GPU's __hfma.
#include <cstdint>
#include <cstring>

#include "cpu/tile_decode.hpp"

#include "cpu/cpu_features.hpp"

#include "exl3/cpu/linear.hpp"
#include "exl3/trellis/tile.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define EXL3_X86 1
#endif

namespace exl3::cpu {
namespace {

using trellis::Codebook;

// Circular word buffer: ext[0] = U[last], ext[1..n] = U[0..n-1], ext[n+1] = U[0], so every
// 16-bit window (which may wrap around the tile) is inside one 64-bit pair ext[w], ext[w+1].
struct StateWindow {
  uint32_t ext[8 * trellis::kMaxBits + 2];

  StateWindow(const uint16_t* tile, int K) {
    const int n = trellis::tile_words32(K);
    for (int i = 0; i < n; ++i) ext[i + 1] = trellis::tile_word32(tile, i);
    ext[0] = ext[n];
    ext[n + 1] = ext[1];
  }

  // State of position p; bit index shifted by 32 so that negative window starts stay >= 0.
  uint32_t state(int K, int p) const {
    const int start = (p + 1) * K - trellis::kStateBits + 32;
    const int w = start >> 5;
    const int off = start & 31;
    const uint64_t pair = (static_cast<uint64_t>(ext[w]) << 32) | ext[w + 1];
    return static_cast<uint32_t>(pair >> (48 - off)) & 0xFFFFu;
  }
};

// Row-major destination of each sequence position, as a table so the scatter is one load each.
struct PermTable {
  uint8_t dst[trellis::kTileSize];
  constexpr PermTable() : dst() {
    for (int p = 0; p < trellis::kTileSize; ++p) dst[p] = static_cast<uint8_t>(trellis::perm_index(p));
  }
};
constexpr PermTable kPerm;

#if defined(EXL3_X86)

#define EXL3_AVX2 __attribute__((target("avx2,fma,f16c")))

// fp16 bits (normal numbers only) in the low 16 bits of each lane -> fp32.
EXL3_AVX2 inline __m256 widen_normal_half(__m256i h) {
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
  const __m256i mag = _mm256_add_epi32(_mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7FFF)), 13),
                                       _mm256_set1_epi32(112 << 23));
  return _mm256_castsi256_ps(_mm256_or_si256(sign, mag));
}

// Round each lane to the nearest fp16 value (ties to even), returned as fp32.
EXL3_AVX2 inline __m256 round_half(__m256 v) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

EXL3_AVX2 inline __m256 decode8(__m256i s, Codebook cb) {
  if (cb == Codebook::kMul1) {
    const __m256i x = _mm256_mullo_epi32(s, _mm256_set1_epi32(static_cast<int>(trellis::kMul1Mult)));
    const __m256i m8 = _mm256_set1_epi32(0x00FF00FF);
    const __m256i pairs = _mm256_add_epi32(_mm256_and_si256(x, m8), _mm256_and_si256(_mm256_srli_epi32(x, 8), m8));
    const __m256i bs = _mm256_add_epi32(_mm256_and_si256(pairs, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(pairs, 16));
    const __m256 h = _mm256_add_ps(_mm256_cvtepi32_ps(bs), _mm256_set1_ps(1024.0f));
    const __m256 v = _mm256_fmadd_ps(h, _mm256_set1_ps(trellis::half_to_float(trellis::kMul1InvBits)),
                                     _mm256_set1_ps(trellis::half_to_float(trellis::kMul1BiasBits)));
    return round_half(v);
  }
  __m256i x;
  if (cb == Codebook::kMcg) {
    x = _mm256_mullo_epi32(s, _mm256_set1_epi32(static_cast<int>(trellis::kMcgMult)));
  } else {
    x = _mm256_add_epi32(_mm256_mullo_epi32(s, _mm256_set1_epi32(static_cast<int>(trellis::k3InstMult))),
                         _mm256_set1_epi32(static_cast<int>(trellis::k3InstAdd)));
  }
  const __m256i y = _mm256_xor_si256(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(trellis::kHalfPairMask))),
                                     _mm256_set1_epi32(static_cast<int>(trellis::kHalfPairXor)));
  const __m256 lo = widen_normal_half(y);
  const __m256 hi = widen_normal_half(_mm256_srli_epi32(y, 16));
  return round_half(_mm256_add_ps(lo, hi));
}

// n must be a multiple of 8.
EXL3_AVX2 void decode_states_avx2(const uint32_t* states, int n, Codebook cb, float* out) {
  for (int p = 0; p < n; p += 8) {
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(states + p));
    _mm256_storeu_ps(out + p, decode8(s, cb));
  }
}


// Per-K constants of the byte-shuffle state extraction. For a group of 8 positions starting at
// p (p % 8 == 0), p*K bits is a whole number of bytes, so window i of the group starts at byte
// q_i = ((1+i)K) / 8, bit o_i = ((1+i)K) % 8 of the group's 16-byte slice of the padded stream
// (2 bytes of wrap-around prefix make the window start (p+1+i)K - 16 non-negative). The shuffle
// puts bytes q_i, q_i+1, q_i+2 big-endian into lane i; a shift by 16 - o_i leaves the state.
struct ShuffleTable {
  alignas(32) uint8_t mask[trellis::kMaxBits + 1][32];
  alignas(32) uint32_t shift[trellis::kMaxBits + 1][8];
  constexpr ShuffleTable() : mask(), shift() {
    for (int K = 1; K <= trellis::kMaxBits; ++K) {
      for (int i = 0; i < 8; ++i) {
        const int bit = (1 + i) * K;
        const int q = bit / 8;
        const int lane_base = (i % 4) * 4 + (i / 4) * 16;  // byte of lane i in the 256-bit vector
        mask[K][lane_base + 0] = 0x80;                      // zero
        mask[K][lane_base + 1] = static_cast<uint8_t>(q + 2);
        mask[K][lane_base + 2] = static_cast<uint8_t>(q + 1);
        mask[K][lane_base + 3] = static_cast<uint8_t>(q);
        shift[K][i] = static_cast<uint32_t>(16 - bit % 8);
      }
    }
  }
};
constexpr ShuffleTable kShuffle;

// Decodes a tile to fp32 values in sequence order (vals[p]).
EXL3_AVX2 void decode_seq_avx2(const uint16_t* tile, int K, Codebook cb, float* vals) {
  // Big-endian byte stream with 2 bytes of wrap-around prefix and 16 bytes of suffix.
  alignas(32) uint8_t bytes[2 + 32 * trellis::kMaxBits + 16];
  const int nbytes = 32 * K;
  for (int w = 0; w < 8 * K; ++w) {
    const uint32_t be = __builtin_bswap32(trellis::tile_word32(tile, w));
    std::memcpy(bytes + 2 + 4 * w, &be, 4);
  }
  bytes[0] = bytes[nbytes];
  bytes[1] = bytes[nbytes + 1];
  std::memcpy(bytes + 2 + nbytes, bytes + 2, 16);

  const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(kShuffle.mask[K]));
  const __m256i shift = _mm256_load_si256(reinterpret_cast<const __m256i*>(kShuffle.shift[K]));
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  for (int p = 0; p < trellis::kTileSize; p += 8) {
    const __m128i slice = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + p * K / 8));
    const __m256i gathered = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(slice), mask);
    const __m256i states = _mm256_and_si256(_mm256_srlv_epi32(gathered, shift), low16);
    _mm256_storeu_ps(vals + p, decode8(states, cb));
  }
}

bool cpu_has_avx2() {
  static const bool ok = cpu_has_avx2_fma(/*need_f16c=*/true);
  return ok;
}

#endif  // EXL3_X86

}  // namespace

namespace detail {

void decode_seq_scalar(const uint16_t* tile, int K, Codebook cb, float* vals) {
  const StateWindow win(tile, K);
  for (int p = 0; p < trellis::kTileSize; ++p) vals[p] = trellis::decode(win.state(K, p), cb);
}

bool decode_seq_vector(const uint16_t* tile, int K, Codebook cb, float* vals) {
#if defined(EXL3_X86)
  if (cpu_has_avx2()) {
    decode_seq_avx2(tile, K, cb, vals);
    return true;
  }
#else
  (void)tile, (void)K, (void)cb, (void)vals;
#endif
  return false;
}

bool decode_states_vector(const uint32_t* states, int n, Codebook cb, float* out) {
#if defined(EXL3_X86)
  if (cpu_has_avx2() && n % 8 == 0) {
    decode_states_avx2(states, n, cb, out);
    return true;
  }
#else
  (void)states, (void)n, (void)cb, (void)out;
#endif
  return false;
}

}  // namespace detail

void decode_tile_seq(const uint16_t* tile, int K, Codebook cb, float* vals) {
  if (!detail::decode_seq_vector(tile, K, cb, vals)) detail::decode_seq_scalar(tile, K, cb, vals);
}

void decode_tile_f32(const uint16_t* tile, int K, Codebook cb, float* out) {
  alignas(32) float vals[trellis::kTileSize];
  decode_tile_seq(tile, K, cb, vals);
  for (int p = 0; p < trellis::kTileSize; ++p) out[kPerm.dst[p]] = vals[p];
}

const char* decode_path_name() {
#if defined(EXL3_X86)
  if (cpu_has_avx2()) return "avx2";
#endif
  return "scalar";
}

}  // namespace exl3::cpu
