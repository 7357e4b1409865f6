// Tail-biting Viterbi driver: two passes per tile (docs/format.md, Viterbi tile encoder), parallel
// over tiles.
//
// Pass 1 runs unconstrained from position 128, wrapping around to 127, and traces the best path
// back to position 0: its in-edge E is where a good circular path wants to start. Pass 2 runs from
// position 0 with every in-edge but E at infinite cost and traces back from out-edge E at
// position 255, so the result closes on itself (state_255's low bits are state_0's high bits).
#include "exl3/quant/viterbi.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <tbb/cache_aligned_allocator.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include "exl3/error.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "quant/viterbi_step.hpp"

namespace exl3::quant {

namespace tr = exl3::trellis;

namespace {

// 64-byte aligned storage: the step kernels load 32 bytes at multiples of 32 bytes, and a load
// that straddles a cache line costs about twice as much.
template <typename T>
using AlignedVector = std::vector<T, tbb::cache_aligned_allocator<T>>;

AlignedVector<float> build_lut(tr::Codebook cb) {
  AlignedVector<float> lut(65536);
  for (uint32_t s = 0; s < 65536; ++s) lut[s] = tr::decode(s, cb);
  return lut;
}

struct Scratch {
  AlignedVector<float> cost_a, cost_b;
  std::vector<uint8_t> history;  // 256 positions of back-pointer planes
  void fit(int K) {
    const auto edges = static_cast<size_t>(detail::edge_count(K));
    if (cost_a.size() < edges) {
      cost_a.resize(edges);
      cost_b.resize(edges);
    }
    const auto bytes = static_cast<size_t>(tr::kTileSize * detail::plane_bytes(K));
    if (history.size() < bytes) history.resize(bytes);
  }
};

detail::StepFn resolve_step(ViterbiPath path, int K) {
  if (path == ViterbiPath::kScalar) return detail::step_scalar(K);
  detail::StepFn avx2 = detail::step_avx2(K);
  if (path == ViterbiPath::kAvx2 && avx2 == nullptr)
    fail("Viterbi: the AVX2 path is not available on this CPU");
  return avx2 != nullptr ? avx2 : detail::step_scalar(K);
}

// Follows back-pointers from out-edge `e` at position `last` down to position `first`, writing
// the full states; returns the in-edge of the state at `first`.
uint32_t trace_back(const uint8_t* history, int K, int first, int last, uint32_t e,
                    uint16_t* states) {
  const int64_t row = detail::plane_bytes(K);
  for (int p = last; p >= first; --p) {
    const uint32_t k = detail::read_backpointer(history + p * row, K, e);
    const uint32_t s = (k << (16 - K)) | e;
    states[p] = static_cast<uint16_t>(s);
    e = s >> K;
  }
  return e;
}

void encode_tile(const float* w, int K, const float* lut, detail::StepFn step, Scratch& scratch,
                 uint16_t* states) {
  const int edges = detail::edge_count(K);
  const int64_t row = detail::plane_bytes(K);
  float* prev = scratch.cost_a.data();
  float* cur = scratch.cost_b.data();
  uint8_t* history = scratch.history.data();

  // Pass 1: positions 128..255, 0..127. Only 0..127 are traced, so only they keep history.
  std::fill_n(prev, edges, 0.0f);
  for (int i = 0; i < tr::kTileSize; ++i) {
    const int p = (128 + i) & 255;
    step(lut, prev, w[p], cur, p < 128 ? history + p * row : nullptr);
    std::swap(prev, cur);
  }
  const auto best = static_cast<uint32_t>(std::min_element(prev, prev + edges) - prev);
  const uint32_t start_edge = trace_back(history, K, 0, 127, best, states);

  // Pass 2: position 0 may only leave from start_edge; end on out-edge start_edge at 255.
  std::fill_n(prev, edges, std::numeric_limits<float>::infinity());
  prev[start_edge] = 0.0f;
  for (int p = 0; p < tr::kTileSize; ++p) {
    step(lut, prev, w[p], cur, history + p * row);
    std::swap(prev, cur);
  }
  const uint32_t closed = trace_back(history, K, 0, 255, start_edge, states);
  // Any 256-step path can reach any edge, so the constrained optimum is finite and starts at
  // start_edge; anything else is a bug in the step kernels.
  if (closed != start_edge || !std::isfinite(prev[start_edge])) {
    fail("Viterbi: internal error, traced path is not tail-biting (K={})", K);
  }
}

}  // namespace

bool viterbi_path_available(ViterbiPath path) {
  return path != ViterbiPath::kAvx2 || detail::cpu_has_avx2();
}

const char* viterbi_path_name(ViterbiPath path) {
  if (path == ViterbiPath::kScalar) return "scalar";
  return detail::cpu_has_avx2() ? "avx2" : "scalar";
}

const float* codebook_lut(tr::Codebook cb) {
  static const AlignedVector<float> lut_3inst = build_lut(tr::Codebook::k3Inst);
  static const AlignedVector<float> lut_mcg = build_lut(tr::Codebook::kMcg);
  static const AlignedVector<float> lut_mul1 = build_lut(tr::Codebook::kMul1);
  switch (cb) {
    case tr::Codebook::kMcg:
      return lut_mcg.data();
    case tr::Codebook::kMul1:
      return lut_mul1.data();
    default:
      return lut_3inst.data();
  }
}

void encode_tiles(const float* tiles, int64_t n, int K, tr::Codebook cb, uint16_t* states_out,
                  float* decoded_out, ViterbiPath path) {
  if (!tr::valid_bits(K)) fail("encode_tiles: K={} outside 1..8", K);
  if (n < 0) fail("encode_tiles: negative tile count {}", n);
  if (n == 0) return;
  if (tiles == nullptr || states_out == nullptr) fail("encode_tiles: null tile or state buffer");
  for (int64_t i = 0; i < n * tr::kTileSize; ++i) {
    if (!std::isfinite(tiles[i])) {
      fail("encode_tiles: tile {} position {} is {} (inputs must be finite)", i / tr::kTileSize,
           i % tr::kTileSize, tiles[i]);
    }
  }
  const detail::StepFn step = resolve_step(path, K);
  const float* lut = codebook_lut(cb);
  tbb::enumerable_thread_specific<Scratch> scratch;
  tbb::parallel_for(int64_t{0}, n, [&](int64_t t) {
    Scratch& s = scratch.local();
    s.fit(K);
    uint16_t* states = states_out + t * tr::kTileSize;
    encode_tile(tiles + t * tr::kTileSize, K, lut, step, s, states);
    if (decoded_out != nullptr) {
      float* dec = decoded_out + t * tr::kTileSize;
      for (int p = 0; p < tr::kTileSize; ++p) dec[p] = lut[states[p]];
    }
  });
}

void pack_tiles(const uint16_t* states, int64_t n, int K, uint16_t* words_out) {
  if (!tr::valid_bits(K)) fail("pack_tiles: K={} outside 1..8", K);
  for (int64_t t = 0; t < n; ++t) {
    tr::pack_tile(states + t * tr::kTileSize, K, words_out + t * tr::tile_words16(K));
  }
}

}  // namespace exl3::quant
