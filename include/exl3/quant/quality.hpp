// Quantizer quality and speed measurements, as library functions behind `exl3 bench quant`.
#pragma once

#include <cstdint>
#include <vector>

#include "exl3/trellis/codebook.hpp"

namespace exl3::quant {

// Viterbi-only NMSE exllamav3's encoder reaches on i.i.d. Gaussian tiles (H200, 64 tiles;
// docs/format.md, Viterbi tile encoder), for K = 1..8.
double exllamav3_nmse(int bits);

struct QualityRow {
  trellis::Codebook codebook = trellis::Codebook::k3Inst;
  int bits = 0;
  int tiles = 0;
  double nmse = 0.0;      // mse / sigma^2
  double rd_bound = 0.0;  // Gaussian rate-distortion bound 2^(-2K)
  double ratio = 0.0;     // nmse / rd_bound
  double goal = 0.0;      // exllamav3_nmse(bits)
  double seconds = 0.0;   // encoder wall time
  double tiles_per_s = 0.0;
};

// For each codebook (3INST, MCG, MUL1) and K in [min_bits, max_bits]: encodes num_tiles tiles of
// i.i.d. N(0, sigma^2), sigma = 1.2437 (the 3INST/MCG codebook RMS) or 1.0 (MUL1), as exllamav3's
// tests draw them. The same tiles serve every K of a codebook. threads = 0: the caller's arena.
std::vector<QualityRow> quality_table(int num_tiles = 256, uint64_t seed = 0, int threads = 0,
                                      int min_bits = 1, int max_bits = 8);

struct LdlqGain {
  int64_t in_features = 0;
  int64_t out_features = 0;
  int bits = 0;
  trellis::Codebook codebook = trellis::Codebook::k3Inst;
  double proxy_plain = 0.0;  // proxy error without feedback
  double proxy_ldlq = 0.0;   // proxy error with LDLQ
  double gain = 0.0;         // proxy_plain / proxy_ldlq (> 1: LDLQ helps)
};

// Quantizes one synthetic layer twice (same seed, with and without LDLQ) and compares the proxy
// errors. The weight and Hessian follow the recipe of the conformance cases: W ~ 0.02 N(0,1) with
// log-normal row/column scales and 0.2% outliers x6; H = X^T X / 512 for 512 calibration rows with
// log-normal per-channel skew (sigma 0.75) plus a rank-8 correlated component. g_scale > 0 fixes
// the global scale for both runs instead of searching (QuantOptions::g_scale).
LdlqGain ldlq_gain(int64_t in_features = 256, int64_t out_features = 384, int bits = 4,
                   trellis::Codebook cb = trellis::Codebook::k3Inst, uint64_t seed = 0,
                   int threads = 0, double g_scale = 0.0);

struct EncoderSpeed {
  int bits = 0;
  trellis::Codebook codebook = trellis::Codebook::k3Inst;
  int threads = 0;
  int tiles = 0;
  double seconds = 0.0;
  double tiles_per_s = 0.0;
  const char* path = "";  // viterbi_path_name()
};

// Encoder throughput on num_tiles Gaussian tiles with `threads` TBB threads (0 = all).
EncoderSpeed encoder_speed(int bits, trellis::Codebook cb, int num_tiles, int threads,
                           uint64_t seed = 0);

}  // namespace exl3::quant
