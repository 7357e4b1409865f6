// The CUDA engine (internal; users go through load_engine). Built only with EXL3_HAVE_CUDA.
#pragma once

#include <memory>

#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/engine.hpp"

namespace exl3::runtime {

#if defined(EXL3_HAVE_CUDA)
std::unique_ptr<Engine> make_cuda_engine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts);
#endif

}  // namespace exl3::runtime
