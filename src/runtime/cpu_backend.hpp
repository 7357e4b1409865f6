// The CPU backend of the op layer (exl3/model/ops.hpp): the fp32 reference. One instance is one
// tensor-parallel rank (or the whole model at TP 1); the engine sets each step before the model
// runs. Linears are runtime Linears (EXL3 through cpu::linear_forward, unquantized, MXFP8) or
// RankLinear slices; routed experts run through the exl3::moe reference (EXL3 layouts, whole,
// rank-sliced or cut here) or as runtime Linears (unquantized experts); attention reads the
// paged KV cache with fp32 storage. A LinearObserver sees every linear's input (calibration).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "exl3/format/checkpoint.hpp"
#include "exl3/model/ops.hpp"
#include "exl3/runtime/communicator.hpp"
#include "exl3/runtime/decoder_layer.hpp"
#include "exl3/runtime/kv_cache.hpp"
#include "exl3/runtime/linear.hpp"

namespace exl3::moe {
struct MoeLayout;
}

namespace exl3::runtime {

class CpuBackend final : public model::Backend {
 public:
  struct Options {
    // How whole linears load (the engine's MXFP8 overlay); empty = Linear::load.
    LinearLoadFn load;
    // The checkpoint's EXL3 expert layout; nullptr (or a layer it lacks) loads routed experts as
    // runtime Linears, which only a single rank runs.
    const moe::MoeLayout* moe_layout = nullptr;
    // The embedding, shared by every rank of an engine (loaded here when null).
    std::shared_ptr<const DenseMatrix> embedding;
    // This rank's attention layers are cache layers first_cache_layer + i of the engine's cache.
    int first_cache_layer = 0;
    // Tensor parallelism: every rank's vocabulary rows (the plan's), which the logits gather
    // puts in place; empty at TP 1.
    std::vector<model::Extent> vocab;
  };

  // `ckpt` and `spec` must outlive the backend.
  CpuBackend(const Checkpoint& ckpt, const ModelSpec& spec, Options opts);
  ~CpuBackend() override;

  // What each attention layer loaded so far keeps per token, in load order.
  const std::vector<KvLayerShape>& kv_shapes() const { return kv_; }

  // The step the next ops run over: `n` tokens of `seq` at positions start .. start + n - 1
  // (cache entries reserved by the caller), their ids (embedding) and the last `logit_rows`
  // rows' logits written to `logits` [logit_rows, vocab] (null: this rank hands none out).
  struct Step {
    PagedKvCache* cache = nullptr;
    PagedKvCache::SeqId seq = -1;
    int64_t start = 0;
    int64_t n = 0;
    std::span<const int32_t> tokens;
    int64_t logit_rows = 0;
    float* logits = nullptr;
    // Non-null: logits() also writes the final-normed hidden state of every row here [n, hidden]
    // (what an MTP head reads).
    float* hidden = nullptr;
    Communicator* comm = nullptr;  // null at TP 1
    LinearObserver* observer = nullptr;
  };
  void begin(const Step& step) {
    step_ = step;
    dsa_selection_.clear();
  }
  // The step's DSA token selection (per new token, the positions it attends to): what the last
  // layer with a full indexer chose and shared-indexer layers reuse. Layer-by-layer runs
  // (calibration) hand it from one layer's backend to the next.
  const std::vector<std::vector<int32_t>>& dsa_selection() const { return dsa_selection_; }
  void set_dsa_selection(std::vector<std::vector<int32_t>> s) { dsa_selection_ = std::move(s); }
  // A sequence dropped from the cache: its gated DeltaNet states are freed.
  void forget_sequence(PagedKvCache::SeqId seq);
  // Prefix caching (exl3/runtime/recurrent_snapshots.hpp): copies every gated DeltaNet layer's
  // state of `seq` into snapshot `slot`, and gives `seq` the copy in `slot` as its state after
  // `length` tokens of cache generation `generation`.
  void save_recurrent(PagedKvCache::SeqId seq, int64_t slot);
  void restore_recurrent(PagedKvCache::SeqId seq, int64_t slot, uint64_t generation,
                         int64_t length);

  // ---- the op layer ----
  model::ModulePtr load_embedding() override;
  model::ModulePtr load_norm(const std::string& tensor, int64_t width,
                             std::optional<double> eps) override;
  model::ModulePtr load_linear(const model::LinearSource& src) override;
  model::ModulePtr load_tied_head(model::Extent vocab) override;
  model::ModulePtr load_gqa(const GqaAttentionSpec& spec, model::Extent q_heads,
                            model::Extent kv_heads, int cache_layer) override;
  model::ModulePtr load_mla(const MlaAttentionSpec& spec, int cache_layer,
                            const model::LinearSource& kv_b) override;
  model::ModulePtr load_gated_delta_net(const model::GatedDeltaNetSpec& spec,
                                        int cache_layer) override;
  model::ModulePtr load_moe(const MoeSpec& spec, int layer, const model::TpMoePlan* plan,
                            int rank) override;
  void reserve(model::Slot, int64_t) override {}
  void reserve_group(std::span<const model::Module* const>) override {}

  model::Act act(model::Slot slot, int64_t width) override;
  void embed(const model::Module& embedding, model::Act x) override;
  void add_rms_norm(model::Act x, const model::Act* residual, const model::Module& norm,
                    model::Act out) override;
  void linears(std::span<const model::Module* const> linears, model::Act x,
               std::span<const model::Act> ys) override;
  void attention(const model::Module& attn, model::Act q, model::Act k, model::Act v,
                 model::Act out) override;
  void mla_attention(const model::Module& attn, model::Act h, model::Act q_resid, model::Act q,
                     model::Act kv_a, model::Act out) override;
  void gated_delta_net(const model::Module& mixer, std::span<const model::Act> in,
                       model::Act out) override;
  void split_query_gate(model::Act qg, int64_t head_dim, model::Act q, model::Act gate) override;
  void sigmoid_gate(model::Act y, model::Act gate) override;
  void glu(model::Act gate, model::Act up, model::Activation act) override;
  void moe(const model::Module& moe, model::Act x, model::Act out) override;
  void add(model::Act y, model::Act x) override;
  void all_reduce(model::Act y, const char* what) override;
  void logits(model::Act x, const model::Act* residual, const model::Module& norm,
              const model::Module& head) override;

 private:
  // A norm weight as fp32, with the model's unit offset applied.
  std::vector<float> load_norm_weight(const std::string& tensor, int64_t width) const;

  const Checkpoint& ckpt_;
  const ModelSpec& spec_;
  Options opts_;
  std::vector<KvLayerShape> kv_;
  std::vector<const model::Module*> delta_nets_;  // the gated DeltaNet layers loaded
  Step step_;
  std::vector<float> slots_[static_cast<size_t>(model::Slot::kCount)];
  // DSA: the positions each token of the step attends to, from the last full indexer layer (a
  // shared layer reads it); set by mla_attention, valid within one step.
  std::vector<std::vector<int32_t>> dsa_selection_;
};

}  // namespace exl3::runtime
