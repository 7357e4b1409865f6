// The CPU tensor-parallel engine (internal; users go through load_engine with EngineOptions::tp).
#pragma once

#include <memory>

#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/engine.hpp"

namespace exl3::runtime {

// `opts.tp` ranks in one process, each on its own thread with its own weight slices and KV heads,
// joined by the in-process communicator (an all-reduce after every row-parallel layer and the
// embedding, an all-gather of the vocab-parallel logits).
std::unique_ptr<Engine> make_tp_cpu_engine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts);

}  // namespace exl3::runtime
