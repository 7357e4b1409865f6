// The CUDA tile encoder's per-block algorithm, written once for two executors (internal header).
//
// The kernel (src/cuda/viterbi.cu) runs encode_tile_body<K, CB>(DeviceExec) with one thread block
// of kThreads threads per tile; the CPU test emulator (HostExec, below, compiled by g++ only) runs
// the very same code with a loop over the threads of each phase, so the index arithmetic, the
// thread decomposition and the tie order are checked bit for bit against the CPU encoder on
// machines without a GPU (tests/cuda/viterbi_test.cpp). Only the barriers, the block argmin's
// warp shuffles and the vector loads/stores differ between the two executors.
//
// Trellis at position p (docs/format.md, Viterbi tile encoder): a 16-bit state s = k | j | r with
// k = top K bits, j = middle 16-2K bits, r = low K bits. Its in-edge is s >> K = (k, j) and its
// out-edge is s & (E-1) = (j, r). So every j is an independent R x R block per step:
//   cur[(j, r)] = min over k (ascending, strict <) of prev[(k, j)] + (lut[(k, j, r)] - w)^2.
// Costs are fp32 with one fused multiply-add per candidate (bit-identical to the CPU AVX2 step).
//
// Thread decomposition (kThreads = 1024, 64 candidates per thread per step for every K):
//   thread t -> k-slice ks = t / U, then within the slice rq = u % RQ (RC consecutive r values)
//   and jb = u / RQ; the thread serves G j-groups j = jb + g * JT. Lanes of a warp have
//   consecutive (jb, rq), so LUT loads (RC halves each) and cost loads/stores are contiguous.
//   K = 1, 2 (E = 32768, 16384 edges): one cost buffer; every thread first stages its prev costs
//     in registers (G x KC), barrier, then writes cur in place (two barriers per step).
//   K = 3..8: two cost buffers (one barrier per step); K >= 6 splits k across KS warp groups,
//     whose partial minima are merged in ascending k order after a barrier.
//   Codebook values: K >= 2 keep all 65536 decoded values as fp16 in shared memory (128 KiB);
//   K = 1 has no room next to its 128 KiB cost buffer and decodes on the fly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/codebook.hpp"
#include "exl3/trellis/half.hpp"
#include "exl3/trellis/hd.hpp"

#if !defined(__CUDACC__)
#include <cmath>
#include <vector>
#endif

#if defined(__CUDA_ARCH__)
#define EXL3_VIT_UNROLL _Pragma("unroll")
#define EXL3_VIT_UNROLL_K _Pragma("unroll 8")
#else
#define EXL3_VIT_UNROLL
#define EXL3_VIT_UNROLL_K
#endif

namespace exl3::cuda::vit {

namespace tr = exl3::trellis;

inline constexpr int kThreads = 1024;
inline constexpr int kPositions = tr::kTileSize;  // 256
inline constexpr int kStatusBytes = 256;          // head of the workspace: failure counter

EXL3_HD float inf_f() { return tr::bits_float(0x7F800000u); }

template <int K>
struct Cfg {
  static_assert(K >= 1 && K <= 8);
  static constexpr int R = 1 << K;             // candidates per out-edge (values of k)
  static constexpr int E = 1 << (16 - K);      // edges
  static constexpr int J = 1 << (16 - 2 * K);  // independent R x R blocks per step
  static constexpr int T = kThreads;
  static constexpr bool kStaged = K <= 2;
  static constexpr bool kLutSmem = K >= 2;
  static constexpr int RC = K == 3 ? 8 : ((K == 2 || K == 4) ? 4 : 2);
  static constexpr int KS = K <= 5 ? 1 : (1 << (K - 5));
  static constexpr int KC = R / KS;
  static constexpr int U = T / KS;
  static constexpr int RQ = R / RC;
  static constexpr int JT = U / RQ;
  static constexpr int G = J / JT;
  static constexpr int NB = kStaged ? 1 : 2;   // cost buffers
  static constexpr int kStagedRegs = kStaged ? G * KC : 1;
  static_assert(KC * KS == R && U * KS == T && RQ * RC == R && JT * RQ == U && G * JT == J);
  static_assert(G * KC * RC == (1 << 16) / T, "every thread evaluates the same number of candidates");
  static_assert(!kStaged || (KS == 1 && RQ == 1));

  // Shared memory layout (bytes, 16-aligned sections).
  static constexpr size_t kLutOff = 0;
  static constexpr size_t kLutBytes = kLutSmem ? 65536 * 2 : 0;
  static constexpr size_t kCostOff = kLutOff + kLutBytes;
  static constexpr size_t kCostBytes = static_cast<size_t>(NB) * E * 4;
  static constexpr size_t kPartCOff = kCostOff + kCostBytes;
  static constexpr size_t kPartCBytes = KS > 1 ? static_cast<size_t>(KS) * E * 4 : 0;
  static constexpr size_t kPartKOff = kPartCOff + kPartCBytes;
  static constexpr size_t kPartKBytes = KS > 1 ? static_cast<size_t>(KS) * E : 0;
  static constexpr size_t kWOff = kPartKOff + kPartKBytes;  // 256 fp32 tile values
  static constexpr size_t kRedCOff = kWOff + kPositions * 4;  // 32 warp minima
  static constexpr size_t kRedIOff = kRedCOff + 32 * 4;
  static constexpr size_t kStatesOff = kRedIOff + 32 * 4;  // 256 uint16 states
  static constexpr size_t kMiscOff = kStatesOff + kPositions * 2;  // [0] = edge
  static constexpr size_t kSmemBytes = kMiscOff + 16;
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the sm_90 per-block shared memory");

  // Back-pointer scratch per tile in flight: one byte (the winning k) per position and out-edge.
  static constexpr size_t kBpBytes = static_cast<size_t>(kPositions) * E;
};

// Runtime lookups of the per-K constants (host wrappers, tests).
EXL3_HD constexpr size_t bp_bytes_per_tile(int K) { return static_cast<size_t>(kPositions) << (16 - K); }

// ---- small helpers: vector loads/stores of RC elements (device: one instruction) ---------------

template <int RC, tr::Codebook CB, bool kLutSmem>
EXL3_HD void load_values(const uint16_t* lut, uint32_t s0, float* l) {
  if constexpr (!kLutSmem) {
    EXL3_VIT_UNROLL
    for (int i = 0; i < RC; ++i) l[i] = tr::half_to_float(tr::decode_bits_t<CB>(s0 + static_cast<uint32_t>(i)));
  } else {
#if defined(__CUDA_ARCH__)
    const uint16_t* p = lut + s0;
    if constexpr (RC == 2) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(p));
      l[0] = f.x, l[1] = f.y;
    } else if constexpr (RC == 4) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&v.x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&v.y));
      l[0] = a.x, l[1] = a.y, l[2] = b.x, l[3] = b.y;
    } else {
      static_assert(RC == 8);
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&v.x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&v.y));
      const float2 c = __half22float2(*reinterpret_cast<const __half2*>(&v.z));
      const float2 d = __half22float2(*reinterpret_cast<const __half2*>(&v.w));
      l[0] = a.x, l[1] = a.y, l[2] = b.x, l[3] = b.y, l[4] = c.x, l[5] = c.y, l[6] = d.x, l[7] = d.y;
    }
#else
    for (int i = 0; i < RC; ++i) l[i] = tr::half_to_float(lut[s0 + static_cast<uint32_t>(i)]);
#endif
  }
}

template <int RC>
EXL3_HD void store_floats(float* dst, const float* v) {
#if defined(__CUDA_ARCH__)
  if constexpr (RC == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(v[0], v[1]);
  } else {
    EXL3_VIT_UNROLL
    for (int i = 0; i < RC; i += 4) *reinterpret_cast<float4*>(dst + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  }
#else
  for (int i = 0; i < RC; ++i) dst[i] = v[i];
#endif
}

template <int RC>
EXL3_HD void store_bytes(uint8_t* dst, const uint32_t* k) {
#if defined(__CUDA_ARCH__)
  if constexpr (RC == 2) {
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(k[0] | (k[1] << 8));
  } else if constexpr (RC == 4) {
    *reinterpret_cast<uint32_t*>(dst) = k[0] | (k[1] << 8) | (k[2] << 16) | (k[3] << 24);
  } else {
    *reinterpret_cast<uint2*>(dst) = make_uint2(k[0] | (k[1] << 8) | (k[2] << 16) | (k[3] << 24),
                                                k[4] | (k[5] << 8) | (k[6] << 16) | (k[7] << 24));
  }
#else
  for (int i = 0; i < RC; ++i) dst[i] = static_cast<uint8_t>(k[i]);
#endif
}

EXL3_HD float fma_f(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// ---- the phases of one trellis step ---------------------------------------------------------

// K = 1, 2: copies thread t's prev costs into its registers (before the in-place update).
template <int K>
EXL3_HD void load_phase(int t, const float* cost, float* staged) {
  using C = Cfg<K>;
  EXL3_VIT_UNROLL
  for (int g = 0; g < C::G; ++g) {
    const uint32_t j = static_cast<uint32_t>(t + g * C::JT);
    EXL3_VIT_UNROLL
    for (int kk = 0; kk < C::KC; ++kk) staged[g * C::KC + kk] = cost[(static_cast<uint32_t>(kk) << (16 - 2 * K)) | j];
  }
}

// Thread t's candidates for one step. prev: cost buffer (unused when staged); cur: the output
// buffer (KS == 1) ; part_c/part_k: per-slice minima (KS > 1); bp: this position's back-pointer
// row, or null when the position needs none.
template <int K, tr::Codebook CB>
EXL3_HD void compute_phase(int t, const float* prev, const float* staged, const uint16_t* lut, float w, float* cur,
                           float* part_c, uint8_t* part_k, uint8_t* bp) {
  using C = Cfg<K>;
  const int ks = t / C::U;
  const int u = t % C::U;
  const uint32_t r0 = static_cast<uint32_t>((u % C::RQ) * C::RC);
  const int jb = u / C::RQ;
  EXL3_VIT_UNROLL
  for (int g = 0; g < C::G; ++g) {
    const uint32_t j = static_cast<uint32_t>(jb + g * C::JT);
    // best = +inf, bk = first k is the same as taking the first candidate unconditionally: a
    // finite candidate beats +inf, an infinite one (unreachable in-edge) never beats anything.
    float best[C::RC];
    uint32_t bk[C::RC];
    EXL3_VIT_UNROLL
    for (int i = 0; i < C::RC; ++i) {
      best[i] = inf_f();
      bk[i] = static_cast<uint32_t>(ks * C::KC);
    }
    EXL3_VIT_UNROLL_K
    for (int kk = 0; kk < C::KC; ++kk) {
      const uint32_t k = static_cast<uint32_t>(ks * C::KC + kk);
      float pc;
      if constexpr (C::kStaged) {
        pc = staged[g * C::KC + kk];
      } else {
        pc = prev[(k << (16 - 2 * K)) | j];
      }
      float l[C::RC];
      load_values<C::RC, CB, C::kLutSmem>(lut, (k << (16 - K)) | (j << K) | r0, l);
      EXL3_VIT_UNROLL
      for (int i = 0; i < C::RC; ++i) {
        const float d = l[i] - w;
        const float c = fma_f(d, d, pc);
        if (c < best[i]) {  // strict: the smallest k wins a tie
          best[i] = c;
          bk[i] = k;
        }
      }
    }
    const uint32_t e0 = (j << K) | r0;
    if constexpr (C::KS == 1) {
      store_floats<C::RC>(cur + e0, best);
      if (bp != nullptr) store_bytes<C::RC>(bp + e0, bk);
    } else {
      store_floats<C::RC>(part_c + static_cast<size_t>(ks) * C::E + e0, best);
      store_bytes<C::RC>(part_k + static_cast<size_t>(ks) * C::E + e0, bk);
    }
  }
}

// K >= 6: merges the KS slice minima of out-edge e in ascending k order (strict <).
template <int K>
EXL3_HD void reduce_phase(int e, const float* part_c, const uint8_t* part_k, float* cur, uint8_t* bp) {
  using C = Cfg<K>;
  float best = part_c[e];
  uint32_t bk = part_k[e];
  EXL3_VIT_UNROLL
  for (int s = 1; s < C::KS; ++s) {
    const float c = part_c[s * C::E + e];
    if (c < best) {
      best = c;
      bk = part_k[s * C::E + e];
    }
  }
  cur[e] = best;
  if (bp != nullptr) bp[e] = static_cast<uint8_t>(bk);
}

// Follows back-pointers from out-edge e at position `last` down to `first`, storing the full
// states when `states` is non-null; returns the in-edge of the state at `first`.
template <int K>
EXL3_HD uint32_t trace_back(const uint8_t* bp, int first, int last, uint32_t e, uint16_t* states) {
  constexpr int E = Cfg<K>::E;
  for (int p = last; p >= first; --p) {
    const uint32_t k = bp[static_cast<size_t>(p) * E + e];
    const uint32_t s = (k << (16 - K)) | e;
    if (states != nullptr) states[p] = static_cast<uint16_t>(s);
    e = s >> K;
  }
  return e;
}

// Builds the fp16 codebook table in shared memory (K >= 2; once per block).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int K, tr::Codebook CB, class Exec>
EXL3_HD void build_lut(Exec& ex, unsigned char* smem) {
  using C = Cfg<K>;
  if constexpr (C::kLutSmem) {
    auto* lut = reinterpret_cast<uint16_t*>(smem + C::kLutOff);
    ex.each([&](int t) {
      for (uint32_t s = static_cast<uint32_t>(t); s < 65536u; s += C::T) lut[s] = tr::decode_bits_t<CB>(s);
    });
    ex.sync();
  }
}

// One trellis pass over positions first_pos, first_pos+1, ... (mod 256), 256 steps; back-pointers
// are written only for positions < bp_limit. Returns the index of the cost buffer holding the
// final costs.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int K, tr::Codebook CB, class Exec>
EXL3_HD int run_pass(Exec& ex, unsigned char* smem, uint8_t* bp, int first_pos, int bp_limit) {
  using C = Cfg<K>;
  const auto* lut = reinterpret_cast<const uint16_t*>(smem + C::kLutOff);
  auto* cost = reinterpret_cast<float*>(smem + C::kCostOff);
  auto* part_c = reinterpret_cast<float*>(smem + C::kPartCOff);
  auto* part_k = reinterpret_cast<uint8_t*>(smem + C::kPartKOff);
  const auto* wv = reinterpret_cast<const float*>(smem + C::kWOff);
  int a = 0;  // buffer holding prev
  for (int step = 0; step < kPositions; ++step) {
    const int p = (first_pos + step) & (kPositions - 1);
    const float w = wv[p];
    uint8_t* row = p < bp_limit ? bp + static_cast<size_t>(p) * C::E : nullptr;
    if constexpr (C::kStaged) {
      ex.each([&](int t) { load_phase<K>(t, cost, ex.staged(t)); });
      ex.sync();
      ex.each([&](int t) { compute_phase<K, CB>(t, cost, ex.staged(t), lut, w, cost, part_c, part_k, row); });
      ex.sync();
    } else {
      const float* prev = cost + static_cast<size_t>(a) * C::E;
      float* cur = cost + static_cast<size_t>(1 - a) * C::E;
      ex.each([&](int t) { compute_phase<K, CB>(t, prev, nullptr, lut, w, cur, part_c, part_k, row); });
      ex.sync();
      if constexpr (C::KS > 1) {
        ex.each([&](int t) {
          for (int e = t; e < C::E; e += C::T) reduce_phase<K>(e, part_c, part_k, cur, row);
        });
        ex.sync();
      }
      a = 1 - a;
    }
  }
  return a;
}

// Encodes one tile: w (256 fp32, sequence order) -> 256 tail-biting states (+ decoded values).
// bp: this block's back-pointer scratch (Cfg<K>::kBpBytes). Bumps *failures when the traced path
// does not close (an internal error; never expected).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int K, tr::Codebook CB, class Exec>
EXL3_HD void encode_tile_body(Exec& ex, unsigned char* smem, const float* tile, uint8_t* bp, uint16_t* states_out,
                              float* decoded_out, unsigned* failures) {
  using C = Cfg<K>;
  auto* cost = reinterpret_cast<float*>(smem + C::kCostOff);
  auto* wv = reinterpret_cast<float*>(smem + C::kWOff);
  auto* states = reinterpret_cast<uint16_t*>(smem + C::kStatesOff);
  auto* misc = reinterpret_cast<uint32_t*>(smem + C::kMiscOff);

  // Pass 1: unconstrained, positions 128..255, 0..127; only 0..127 keep back-pointers.
  ex.each([&](int t) {
    if (t < kPositions) wv[t] = tile[t];
    for (int e = t; e < C::E; e += C::T) cost[e] = 0.0f;
  });
  ex.sync();
  const int fa = run_pass<K, CB>(ex, smem, bp, kPositions / 2, kPositions / 2);
  const uint32_t best = ex.argmin(cost + static_cast<size_t>(fa) * C::E, C::E, smem + C::kRedCOff,
                                  smem + C::kRedIOff);
  ex.single([&] { misc[0] = trace_back<K>(bp, 0, kPositions / 2 - 1, best, nullptr); });
  ex.sync();

  // Pass 2: position 0 may only leave from the start edge; trace back from it at 255.
  const uint32_t start = misc[0];
  ex.each([&](int t) {
    for (int e = t; e < C::E; e += C::T) cost[e] = static_cast<uint32_t>(e) == start ? 0.0f : inf_f();
  });
  ex.sync();
  const int fb = run_pass<K, CB>(ex, smem, bp, 0, kPositions);
  ex.single([&] {
    const uint32_t closed = trace_back<K>(bp, 0, kPositions - 1, start, states);
    const float final_cost = cost[static_cast<size_t>(fb) * C::E + start];
    if (closed != start || !(final_cost < inf_f())) ex.fail(failures);
  });
  ex.sync();
  ex.each([&](int t) {
    if (t < kPositions) {
      const uint16_t s = states[t];
      states_out[t] = s;
      if (decoded_out != nullptr) decoded_out[t] = tr::half_to_float(tr::decode_bits_t<CB>(s));
    }
  });
  ex.sync();  // the next tile reuses wv, states and the cost buffers
}

#if !defined(__CUDACC__)
// ---- CPU emulation of one thread block (tests) ---------------------------------------------

template <int K>
struct HostExec {
  std::vector<float> staged_regs = std::vector<float>(static_cast<size_t>(kThreads) * Cfg<K>::kStagedRegs);
  unsigned host_failures = 0;

  template <class F>
  void each(F&& f) {
    for (int t = 0; t < kThreads; ++t) f(t);
  }
  void sync() {}
  template <class F>
  void single(F&& f) {
    f();
  }
  float* staged(int t) { return staged_regs.data() + static_cast<size_t>(t) * Cfg<K>::kStagedRegs; }
  // First index of the minimum (std::min_element order).
  uint32_t argmin(const float* cost, int n, unsigned char*, unsigned char*) {
    int best = 0;
    for (int e = 1; e < n; ++e)
      if (cost[e] < cost[best]) best = e;
    return static_cast<uint32_t>(best);
  }
  void fail(unsigned*) { ++host_failures; }
};

// Runs the kernel's algorithm on the CPU for n tiles (one emulated block, tile after tile).
// Returns the number of tiles that failed to close (0 expected).
template <int K, tr::Codebook CB>
unsigned emulate_encode_tiles(const float* tiles, int64_t n, uint16_t* states, float* decoded) {
  using C = Cfg<K>;
  HostExec<K> ex;
  std::vector<unsigned char> smem(C::kSmemBytes + 16);
  std::vector<uint8_t> bp(C::kBpBytes);
  build_lut<K, CB>(ex, smem.data());
  for (int64_t i = 0; i < n; ++i) {
    encode_tile_body<K, CB>(ex, smem.data(), tiles + i * kPositions, bp.data(), states + i * kPositions,
                            decoded != nullptr ? decoded + i * kPositions : nullptr, nullptr);
  }
  return ex.host_failures;
}
#endif

}  // namespace exl3::cuda::vit
