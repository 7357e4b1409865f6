// The CUDA tensor-parallel engine (internal; users go through load_engine with EngineOptions::tp
// and device cuda). Built only with EXL3_HAVE_NCCL.
#pragma once

#include <memory>

#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/engine.hpp"

namespace exl3::runtime {

#if defined(EXL3_HAVE_NCCL)
// `opts.tp` ranks, rank r on CUDA device r, each driven by its own thread of this process.
std::unique_ptr<Engine> make_cuda_tp_engine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts);
#endif

}  // namespace exl3::runtime
