// Warp-level tensor-core and async-copy primitives shared by the kernels that use them (the
// trellis GEMV and GEMM, decode and prefill attention): mma.sync m16n8k16 with fp16 inputs and
// fp32 accumulators, ldmatrix fragment loads from shared memory, and 16-byte cp.async copies.
//
// Fragment layout of m16n8k16 (lane = 4 g + c): A (16 x 16, row-major) a0 = (row g, cols 2c,
// 2c+1), a1 = (row g+8, same cols), a2 = (row g, cols 2c+8, 2c+9), a3 = (row g+8, cols 2c+8,
// 2c+9); B (16 x 8, k x n) b0 = (k 2c, 2c+1; n g), b1 = (k 2c+8, 2c+9; n g); C (16 x 8, fp32)
// c0, c1 = (row g, cols 2c, 2c+1), c2, c3 = (row g+8, same cols).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace exl3::cuda::detail {

__device__ __forceinline__ uint32_t half2_bits(__half2 h) {
  return *reinterpret_cast<uint32_t*>(&h);
}

// x = hi + lo with hi = fp16(x) and lo = fp16(x - hi), as half2 pairs of (a, b): an fp32 operand
// of an fp16 mma as two fp16 operands, keeping about 22 bits of it (the attention kernels' q and
// softmax weights).
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  hi = half2_bits(h);
  lo = half2_bits(__floats2half2_rn(a - hf.x, b - hf.y));
}

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  mma16816(c, a[0], a[1], a[2], a[3], b0, b1);
}

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 fp16 matrices: lanes 8 i .. 8 i + 7 give the row addresses (16 bytes each) of
// matrix i, and r[i] receives the lane's pair of matrix i (row lane / 4, cols 2 (lane % 4) + 0, 1;
// with .trans, col lane / 4 and rows 2 (lane % 4) + 0, 1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(smem)), "l"(gmem));
}

// As cp_async16, but when `copy` is false the 16 bytes are zero-filled and nothing is read
// (gmem must still be a valid address).
__device__ __forceinline__ void cp_async16_or_zero(void* smem, const void* gmem, bool copy) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
               "l"(gmem), "r"(copy ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

}  // namespace exl3::cuda::detail
