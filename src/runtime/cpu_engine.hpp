// The CPU reference engine (internal; users go through load_engine).
#pragma once

#include <memory>

#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/engine.hpp"

namespace exl3::runtime {

std::unique_ptr<Engine> make_cpu_engine(const Checkpoint& ckpt, ModelSpec spec,
                                        const EngineOptions& opts);

}  // namespace exl3::runtime
