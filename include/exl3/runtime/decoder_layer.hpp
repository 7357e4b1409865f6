// One decoder layer on the CPU (the model's layer on a CPU backend of its own), built from any
// checkpoint (or tensor overlay) and run over the hidden states of one sequence: what calibrated
// conversion runs layer by layer (original weights with an observer capturing each linear's inputs,
// then the freshly quantized weights to produce the next layer's inputs).
//
//   x += attention(rms_norm(x, input_norm));  x += mlp(rms_norm(x, post_attention_norm))
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "exl3/model/spec.hpp"
#include "exl3/runtime/kv_cache.hpp"

namespace exl3 {
class Checkpoint;
}
namespace exl3::moe {
struct MoeLayout;
}

namespace exl3::runtime {
// The runtime runs the model layer's descriptions and plans: their names are its vocabulary.
using namespace exl3::model;  // NOLINT(google-build-using-namespace)

// Sees the input of every linear as the layer runs. `linears` are the prefixes of the linears
// that read this same input x[m, in] (q/k/v together, gate/up together, then o_proj, down_proj;
// a routed expert sees only the rows routed to it). Called from the forward's thread.
class LinearObserver {
 public:
  virtual ~LinearObserver() = default;
  virtual void observe(std::span<const std::string> linears, const float* x, int64_t m,
                       int64_t in) = 0;
};

class Linear;
// Loads one linear (prefix, in, out); empty = Linear::load on the layer's checkpoint.
using LinearLoadFn = std::function<Linear(const std::string& prefix, int64_t in, int64_t out)>;

// Per position of a sequence, the positions a DSA layer attends to.
using DsaSelection = std::vector<std::vector<int32_t>>;

class DecoderLayer {
 public:
  // Loads layer `spec` of `model` from ckpt's tensors (the checkpoint must outlive the layer).
  // moe_layout: routed experts as exl3::moe views of this EXL3 layout; nullptr loads each
  // expert projection as a runtime Linear (EXL3 when `.trellis` exists, else HF weights).
  // Throws exl3::Error naming the checkpoint and tensor.
  // load: how linears are loaded (the engine's MXFP8 overlay); empty = Linear::load.
  DecoderLayer(const Checkpoint& ckpt, const ModelSpec& model, const LayerSpec& spec,
               const moe::MoeLayout* moe_layout, const LinearLoadFn& load = {});
  ~DecoderLayer();
  DecoderLayer(DecoderLayer&&) noexcept;
  DecoderLayer& operator=(DecoderLayer&&) noexcept;

  const LayerSpec& spec() const;
  // What this layer keeps per token in the KV cache.
  KvLayerShape kv_shape() const;

  // x[n, hidden] (updated in place) of one whole sequence (positions 0 .. n-1), with a cache of
  // its own that is dropped afterwards. An observer needs routed experts as Linears (moe_layout
  // nullptr). dsa: the sequence's DSA token selection (per position, the positions it attends
  // to) as the layers hand it on: a layer with a full indexer writes it, one whose indexer is
  // `shared` reads it (and fails, naming the layer, when it is empty); other layers leave it.
  void forward_sequence(float* x, int64_t n, LinearObserver* observer = nullptr,
                        DsaSelection* dsa = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace exl3::runtime
