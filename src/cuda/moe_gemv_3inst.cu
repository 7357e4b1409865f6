// 3INST instances of the grouped MoE GEMV (one file per codebook so builds parallelise).
#include "cuda/moe_gemv.cuh"
#include "cuda/moe_kernels.hpp"

namespace exl3::cuda::detail {
template cudaError_t launch_moe_gemv_cb<trellis::Codebook::k3Inst>(const MoeGemvArgs&, int, int, cudaStream_t);
}  // namespace exl3::cuda::detail
