// K = 5 instances of the tensor-core EXL3 GEMM and the swap-AB GEMV (one file per bit width so builds parallelise).
#include "cuda/gemv.cuh"
#include "cuda/mma_gemm.cuh"

namespace exl3::cuda::detail {
template cudaError_t mma_gemm_k<5>(const uint16_t*, trellis::Codebook, const __half*, int64_t, int64_t, int64_t, int,
                                   float*, cudaStream_t);
template int mma_blocks_per_sm_k<5>(trellis::Codebook);
template cudaError_t gemv_k<5>(const uint16_t*, trellis::Codebook, const __half*, int64_t, int64_t, int64_t, int,
                               float*, cudaStream_t);
template int gemv_blocks_per_sm_k<5>(trellis::Codebook);
}  // namespace exl3::cuda::detail
