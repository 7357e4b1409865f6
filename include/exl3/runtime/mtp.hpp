// Speculative decoding with the model's own MTP layer (multi-token prediction: DeepSeek-V3 / V3.2
// and GLM-5 checkpoints carry one as model.layers.{num_hidden_layers}; see MtpLayerSpec) as the
// draft. The MTP head is an Engine, so SpeculativeDecoder runs it like a draft model; what
// differs is what it reads. Its position p takes the token at p + 1 and the target's last hidden
// state at p, so its cache holds one entry fewer than the tokens it has been fed, and it asks the
// target for hidden states (Engine::keep_hidden_states) of the sequence it drafts for
// (Engine::new_draft_sequence). A draft step past what the target has computed chains: the MTP
// layer's own output at p - 1 stands in for the target's hidden state at p. Those entries are
// provisional: once the target has scored the position (the verify pass), the next forward
// rebuilds them from the target's hidden states, so after every round the head's cache holds
// what it would have computed had it followed the accepted tokens from the start.
//
// The head has its own KV pages and scratch (its own backend); it shares only the target's
// checkpoint files. CPU only: the CUDA engine hands out no hidden states, and loading refuses.
#pragma once

#include <memory>

#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/engine.hpp"

namespace exl3::runtime {

// The first MTP layer of `ckpt` (the checkpoint `target` was loaded from) as a draft engine for
// `target`, with opts' page size and KV capacity. Throws exl3::Error naming the checkpoint and
// the problem: a CUDA target, a model without MTP layers, a missing tensor or a shape that
// differs from config.json's.
std::unique_ptr<Engine> load_mtp_draft(Engine& target, const Checkpoint& ckpt,
                                       const EngineOptions& opts);

}  // namespace exl3::runtime
