// CUDA tile encoder: the tail-biting bitshift-trellis Viterbi search (docs/format.md, Viterbi tile
// encoder) on the GPU, the same algorithm and tie order as the CPU encoder
// (exl3/quant/viterbi.hpp): fp32 costs with one fused multiply-add per candidate, strict '<' with
// k ascending (the smallest k wins a tie), the final argmin takes the smallest edge index. Its
// output matches the CPU encoder's AVX2 path bit for bit (same arithmetic) and the scalar path up
// to fp32 rounding of mul+add vs FMA.
//
// The device entry point never throws and never synchronises: it returns the launch's
// cudaError_t. The *_host helpers allocate, copy and throw exl3::Error on failure.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/trellis/codebook.hpp"

namespace exl3::cuda {

// Workspace bytes for `n_tiles_in_flight` tiles encoded concurrently: a 256-byte status header plus
// one back-pointer byte per position and out-edge, 256 * 2^(16-K) bytes per tile (8 MiB at K = 1,
// 64 KiB at K = 8). 0 for K outside 1..8 or n_tiles_in_flight < 1.
size_t encode_tiles_cuda_workspace(int64_t n_tiles_in_flight, int K);

// Tiles the device runs concurrently (SMs x resident blocks per SM, one tile per block): a
// workspace for more tiles than this brings no speed. 0 when there is no device or K is invalid.
int64_t encode_tiles_cuda_resident_tiles(int K);

// Encodes n tiles on the device. d_tiles: [n, 256] fp32 in sequence order (finite values; the
// output for a non-finite input is unspecified but still written). d_states_out: [n, 256] full
// 16-bit states, each tile tail-biting (trellis::is_tail_biting). d_decoded_out (nullable):
// [n, 256] the decoded values of those states (trellis::decode). The workspace sets how many tiles
// run at once: (workspace_bytes - 256) / (256 * 2^(16-K)) of them, at least one; tiles beyond that
// are taken in turn by the same blocks, so any n runs in one launch. Asynchronous on `stream`.
// Returns cudaErrorInvalidValue for K outside 1..8, n < 0, null buffers (n > 0) or a workspace
// too small for one tile; otherwise the launch's error.
cudaError_t encode_tiles_cuda(const float* d_tiles, int64_t n, int K, trellis::Codebook cb,
                              uint16_t* d_states_out, float* d_decoded_out, void* d_workspace,
                              size_t workspace_bytes, cudaStream_t stream);

// Number of tiles whose traced path failed to close in the encode_tiles_cuda calls on this
// workspace since it was last reset (each call resets it first). Always 0 unless the encoder has
// a bug. Synchronises `stream`.
cudaError_t encode_tiles_cuda_failures(const void* d_workspace, uint32_t* count,
                                       cudaStream_t stream);

// Host-memory convenience: tiles/states/decoded in host memory (decoded nullable). Allocates device
// buffers, encodes in chunks with a back-pointer scratch of at most 2 GiB, and checks the result.
// Throws exl3::Error for K outside 1..8, non-finite inputs (naming the tile and position, like the
// CPU encode_tiles), and CUDA failures.
void encode_tiles_cuda_host(const float* tiles, int64_t n, int K, trellis::Codebook cb,
                            uint16_t* states, float* decoded = nullptr);

// Throughput benchmark: encodes n random Gaussian tiles (scale 1.2437 for 3INST/MCG, 1.0 for
// MUL1) once to warm up, then times one more run with CUDA events. Returns tiles per second.
// Throws exl3::Error on CUDA failures.
double encode_tiles_cuda_tiles_per_second(int K, trellis::Codebook cb, int n);

}  // namespace exl3::cuda
