// The backend op layer: what a model needs from a device, and nothing about how. The decoder
// (exl3/model/decoder.hpp) is written once over it; the CPU backend (fp32 reference) and the CUDA
// backend implement it in the runtime layer.
//
// Two halves:
//   load  the backend turns a tensor name (or one tensor-parallel rank's slice of it, as the
//         model's TpPlan says) into a Module it owns the weights of; the model keeps the handles.
//   run   ops over the current step's activations. The step (which tokens, which sequences and
//         positions, which rows want logits) is backend state set by the engine before the model
//         runs; ops read it. On CUDA an op only enqueues kernels (no allocation, no host sync),
//         so a whole step can be captured as a graph.
//
// Activations are fp32 [rows, width] in the backend's memory (host or device). Tensor
// parallelism is rank slicing at load plus all_reduce (identity at TP 1) inside the model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "exl3/model/spec.hpp"
#include "exl3/model/tp_plan.hpp"

namespace exl3::model {

// fp32 activations [rows, width] in the backend's memory.
struct Act {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t width = 0;
};

// A loaded module (a linear, a norm weight, an attention layer with its KV cache, a routed
// experts layer). Only the backend that made it looks inside.
class Module {
 public:
  virtual ~Module() = default;
};
using ModulePtr = std::unique_ptr<Module>;

// Where a linear's weights come from: the whole linear of the checkpoint, or one rank's slice of
// it (a column slice's outputs may be cut further to [out_offset, out_offset + out_count): an
// EXL3 k/v slice covers whole 128-channel blocks around the rank's kv heads).
struct LinearSource {
  std::string prefix;  // "model.layers.3.self_attn.q_proj"
  int64_t in = 0, out = 0;
  const TpLinearPlan* slice = nullptr;  // nullptr: the whole linear
  int rank = 0;
  int64_t out_offset = 0;
  int64_t out_count = -1;  // -1: every output of the slice
};

// The activation buffers a step uses, by role. A backend sizes each for the widest width the
// model reserves at load.
enum class Slot : uint8_t {
  kX,
  kH,
  kY,
  kQ,
  kK,
  kV,
  kAttn,
  kGate,
  kUp,
  kShared,
  kLatentQ,
  kLatentQNormed,
  kLatentKv,  // MLA: q_a_proj output, its norm, kv_a_proj_with_mqa output
  kNormedY,   // a sandwich norm's output (the normed attention or MLP output)
  kQNormed,
  kKNormed,     // q and k after a q/k norm across all heads (QkNorm::kAcrossHeads)
  kQueryGate,   // q_proj's output with an output gate: [query, gate] per head
  kOutputGate,  // that gate, de-interleaved; the shared expert's gate logit
  kMixerIn,     // gated DeltaNet: in_proj_qkvz's output (Qwen3.5: in_proj_qkv's)
  kMixerGates,  // in_proj_ba's output (Qwen3.5: in_proj_b's)
  kMixerZ,      // Qwen3.5: in_proj_z's output
  kMixerA,      // Qwen3.5: in_proj_a's output
  kCount
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- load ----------------------------------------------------------------------------------
  // The token embedding (every rank holds all of it: the lookup needs no collective).
  virtual ModulePtr load_embedding() = 0;
  // An RMSNorm weight [width]; `eps` defaults to the model's rms_norm_eps. Under the model's
  // norm_unit_offset the norm scales by (1 + weight) (q/k norms of load_gqa too).
  virtual ModulePtr load_norm(const std::string& tensor, int64_t width,
                              std::optional<double> eps = std::nullopt) = 0;
  virtual ModulePtr load_linear(const LinearSource& src) = 0;
  // The tied head: the embedding's rows `vocab` (one rank's, or all) as a linear.
  virtual ModulePtr load_tied_head(Extent vocab) = 0;
  // GQA attention over `local` heads (a rank's window when first_q_head > 0 or heads are fewer
  // than the spec's): q/k norms, RoPE, this layer's KV cache. `cache_layer` numbers the
  // attention layers in load order.
  virtual ModulePtr load_gqa(const GqaAttentionSpec& spec, Extent q_heads, Extent kv_heads,
                             int cache_layer) = 0;
  // Multi-head latent attention over spec.num_heads heads (a rank's, under tensor parallelism):
  // kv_a_layernorm, `kv_b` (those heads' rows of kv_b_proj), a DSA indexer, and this layer's
  // latent KV cache (kv_lora_rank + qk_rope_head_dim floats per token, plus the indexer's key).
  virtual ModulePtr load_mla(const MlaAttentionSpec& spec, int cache_layer,
                             const LinearSource& kv_b) = 0;
  // A gated DeltaNet layer's mixer (GatedDeltaNetSpec): the convolution, decay parameters, gated
  // norm and the per-sequence recurrent state. `cache_layer` as load_gqa's (the layer holds no
  // keys or values). A backend without it fails naming the layer (the default).
  virtual ModulePtr load_gated_delta_net(const GatedDeltaNetSpec& spec, int cache_layer);
  // The router and routed experts of MoE layer `layer` (shared experts are the model's dense
  // MLP): the whole layer, or rank `rank`'s intermediate channels when `plan` is given.
  virtual ModulePtr load_moe(const MoeSpec& spec, int layer, const TpMoePlan* plan, int rank) = 0;
  // The widest activation a slot holds (per token).
  virtual void reserve(Slot slot, int64_t width) = 0;
  // Linears the model will run together through linears() (q/k/v, gate/up): a backend that
  // fuses them sizes its scratch for the group.
  virtual void reserve_group(std::span<const Module* const> linears) = 0;

  // ---- run (over the current step) -----------------------------------------------------------
  // An activation buffer of the slot for the step's tokens.
  virtual Act act(Slot slot, int64_t width) = 0;
  // x = the step's token embeddings, times the model's embedding_scale.
  virtual void embed(const Module& embedding, Act x) = 0;
  // x += residual (when given), then out = rms_norm(x) * weight.
  virtual void add_rms_norm(Act x, const Act* residual, const Module& norm, Act out) = 0;
  // ys[i] = x @ linears[i]^T (+ bias): linears that read the same input (q/k/v, gate/up), so a
  // backend may fuse them and an observer sees the input once. A linear with no input
  // features (a rank without heads) writes its bias or zeros.
  virtual void linears(std::span<const Module* const> linears, Act x, std::span<const Act> ys) = 0;
  void linear(const Module& l, Act x, Act y) {
    const Module* ls[] = {&l};
    const Act ys[] = {y};
    linears(ls, x, ys);
  }
  // Per-head q/k norm (QkNorm::kPerHead) and RoPE at the step's positions, k/v written to the
  // cache, causal attention over everything the sequence holds: out [n, q_heads * head_dim].
  virtual void attention(const Module& attn, Act q, Act k, Act v, Act out) = 0;
  // MLA: q [n, heads * qk_head_dim] and kv_a [n, kv_lora_rank + qk_rope_head_dim] (the
  // kv_a_proj_with_mqa output) -> out [n, heads * v_head_dim]: RoPE on the rope parts, the latent
  // norm, the cache write, kv_b_proj's keys and values, causal attention. With a DSA indexer the
  // layer's input h and the normed q LoRA latent q_resid feed the indexer, and attention reads only
  // the positions it selects (a shared layer: the last selection of this step).
  virtual void mla_attention(const Module& attn, Act h, Act q_resid, Act q, Act kv_a, Act out) = 0;
  // Gated DeltaNet: the input projections' outputs (in_proj_qkvz, in_proj_ba; or Qwen3.5's
  // in_proj_qkv, _z, _b, _a) -> out [n, value_dim] (the gated norm's output, before out_proj),
  // advancing the step's sequence's recurrent state.
  virtual void gated_delta_net(const Module& mixer, std::span<const Act> in, Act out);
  // q and gate from q_proj's output with an output gate: qg [n, heads * 2 * head_dim], per head
  // [query, gate] -> q, gate [n, heads * head_dim].
  virtual void split_query_gate(Act qg, int64_t head_dim, Act q, Act gate);
  // y *= sigmoid(gate), elementwise (gate as wide as y) or per row (gate of width 1).
  virtual void sigmoid_gate(Act y, Act gate);
  // gate = act(gate) * up (SwiGLU, GeGLU).
  virtual void glu(Act gate, Act up, Activation act) = 0;
  // out = the routed experts' top-k weighted sum for x (router included).
  virtual void moe(const Module& moe, Act x, Act out) = 0;
  // y += x.
  virtual void add(Act y, Act x) = 0;
  // Sums y over the tensor-parallel ranks (in place); nothing at TP 1. `what` names it in errors.
  virtual void all_reduce(Act y, const char* what) = 0;
  // x += residual, then the head over rms_norm of the rows the step wants logits for, gathered
  // over the ranks' vocabulary slices into the backend's logits (soft-capped when the model's
  // final_logit_softcapping is set).
  virtual void logits(Act x, const Act* residual, const Module& norm, const Module& head) = 0;
};

}  // namespace exl3::model
