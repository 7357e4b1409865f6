// One decoder layer on the CPU, built from any checkpoint (or tensor overlay) and run over the
// hidden states of one sequence: what the engine stacks, and what calibrated conversion runs
// layer by layer (original weights with an observer capturing each linear's inputs, then the
// freshly quantized weights to produce the next layer's inputs).
//
//   x += attention(rms_norm(x, input_norm));  x += mlp(rms_norm(x, post_attention_norm))
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "exl3/runtime/kv_cache.hpp"
#include "exl3/runtime/model_spec.hpp"

namespace exl3 {
class Checkpoint;
}
namespace exl3::moe {
struct MoeLayout;
}

namespace exl3::runtime {

// Sees the input of every linear as the layer runs. `linears` are the prefixes of the linears
// that read this same input x[m, in] (q/k/v together, gate/up together, then o_proj, down_proj;
// a routed expert sees only the rows routed to it). Called from the forward's thread.
class LinearObserver {
 public:
  virtual ~LinearObserver() = default;
  virtual void observe(std::span<const std::string> linears, const float* x, int64_t m,
                       int64_t in) = 0;
};

class DecoderLayer {
 public:
  // Loads layer `spec` of `model` from ckpt's tensors (the checkpoint must outlive the layer).
  // moe_layout: routed experts as exl3::moe views of this EXL3 layout; nullptr loads each
  // expert projection as a runtime Linear (EXL3 when `.trellis` exists, else HF weights).
  // Throws exl3::Error naming the checkpoint and tensor.
  DecoderLayer(const Checkpoint& ckpt, const ModelSpec& model, const LayerSpec& spec,
               const moe::MoeLayout* moe_layout);
  ~DecoderLayer();
  DecoderLayer(DecoderLayer&&) noexcept;
  DecoderLayer& operator=(DecoderLayer&&) noexcept;

  const LayerSpec& spec() const;
  // What this layer keeps per token in the KV cache.
  KvLayerShape kv_shape() const;

  // x[m, hidden] (updated in place): the new tokens at positions start .. start + m - 1 of
  // `seq`, whose cache entries of `cache_layer` the caller reserved.
  void forward(float* x, int64_t m, int64_t start, PagedKvCache& cache, int cache_layer,
               PagedKvCache::SeqId seq, LinearObserver* observer = nullptr) const;
  // x[n, hidden] of one whole sequence (positions 0 .. n-1), with a cache of its own that is
  // dropped afterwards. An observer needs routed experts as Linears (moe_layout nullptr).
  void forward_sequence(float* x, int64_t n, LinearObserver* observer = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace exl3::runtime
