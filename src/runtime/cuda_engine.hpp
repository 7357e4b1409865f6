// The CUDA engine (internal; users go through load_engine). Built only with EXL3_HAVE_CUDA.
#pragma once

#include <memory>

#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/model/tp_plan.hpp"

namespace exl3::runtime {

class NcclCommunicator;

// One tensor-parallel rank: the engine loads only this rank's slices of `plan`, all-reduces the
// row-parallel outputs and all-gathers the logits through `comm` (which must outlive it); only
// rank 0 returns logits. The caller's thread must have made the rank's device current.
struct CudaRank {
  const TpPlan* plan = nullptr;
  int rank = 0;
  NcclCommunicator* comm = nullptr;
};

#if defined(EXL3_HAVE_CUDA)
std::unique_ptr<Engine> make_cuda_engine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts,
                                         const CudaRank* rank = nullptr);
#endif

}  // namespace exl3::runtime
