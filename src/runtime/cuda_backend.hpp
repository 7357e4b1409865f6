// The CUDA backend of the op layer (exl3/model/ops.hpp), for one GPU (one tensor-parallel rank or
// the whole model). Linears are GpuLinears (EXL3, cuBLAS dense or MXFP8, the overlay planned as
// the CPU engine plans it), the routed experts a fused MoeLayerCuda behind the GPU router, and
// attention reads an fp16 paged KV cache whose page tables come with the step (MLA layers: the
// latent cache of exl3/cuda/mla.hpp, and a DSA indexer's fp32 key cache beside it).
//
// Every buffer is sized once: the model reserves each slot's widest width while it loads, and
// allocate() then sizes the slots for `capacity` tokens, the KV cache for the pool and the
// workspace for the hungriest linear or MoE layer. A step's geometry (ids, positions, page
// tables, attention tiles, the rows that want logits) lives in a device buffer the engine fills;
// ops read it there and only enqueue kernels on the context's stream, so a decode step can be
// captured as a graph and replayed. The backend owns everything of the device's: the context
// (stream, one cuBLAS handle and workspace), the slots and workspace, the KV cache and graphs.
#pragma once

#if defined(EXL3_HAVE_CUDA)

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda_buffers.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/model/ops.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/kv_cache.hpp"
#include "exl3/runtime/overlay.hpp"
#include "gpu_linear.hpp"

namespace exl3::moe {
struct MoeLayout;
}

namespace exl3::runtime {

class NcclCommunicator;

// Offsets (int32 elements) of one step's geometry in the meta buffer; a function of the counts
// only, so a graph captured for a count finds its data at the same addresses on replay.
struct MetaLayout {
  int64_t n = 0, decode = 0, tiles = 0, rows = 0, seqs = 0, max_pages = 0;
  int64_t ids() const { return 0; }
  int64_t pos() const { return n; }
  int64_t seq_row() const { return 2 * n; }
  int64_t decode_list() const { return 3 * n; }
  int64_t tile_first() const { return 3 * n + decode; }
  int64_t tile_len() const { return 3 * n + decode + tiles; }
  int64_t row_index() const { return 3 * n + decode + 2 * tiles; }
  int64_t page_tables() const { return 3 * n + decode + 2 * tiles + rows; }
  // Per run (sequence) of the step: its first token, token count and recurrent-state slot (the
  // gated DeltaNet layers' state pool; 0 for models without them).
  int64_t run_first() const { return page_tables() + seqs * max_pages; }
  int64_t run_len() const { return run_first() + seqs; }
  int64_t run_slot() const { return run_first() + 2 * seqs; }
  int64_t total() const { return run_first() + 3 * seqs; }
};

class CudaBackend final : public model::Backend {
 public:
  struct Options {
    int64_t capacity = 0;        // most tokens one step runs
    int64_t max_seq_tokens = 0;  // RoPE tables cover positions below this
    const moe::MoeLayout* moe_layout = nullptr;
    OverlayPolicy overlay;
    // Tunables of each MoE layer, MXFP8 linear and EXL3 linear (EngineOptions::moe / mxfp8 /
    // linear); their capacity fields are replaced by `capacity`.
    cuda::MoeOptions moe;
    cuda::Mxfp8Options mxfp8;
    cuda::LinearOptions linear;
    cpu::KvFormat kv_format = cpu::KvFormat::kNative;  // of the GQA layers' caches
    // Tensor parallelism: this rank of the plan, its communicator (must outlive the backend).
    const model::TpPlan* plan = nullptr;
    int rank = 0;
    NcclCommunicator* comm = nullptr;
    // Gated DeltaNet models: slots of the state pool (the sequences that hold a recurrent state
    // at once, then the prefix cache's snapshots).
    int64_t recurrent_slots = 0;
  };

  // Makes the backend's context (stream, cuBLAS handle and workspace) on the current device.
  // `ckpt` and `spec` must outlive the backend.
  CudaBackend(const Checkpoint& ckpt, const ModelSpec& spec, Options opts);
  ~CudaBackend() override;

  cudaStream_t stream() const { return stream_; }
  // The graph key of a step whose launches depend on the host only through `ml`'s counts (every
  // kernel reads the rest from meta()), or nullopt for counts too large to key.
  static std::optional<int64_t> graph_key(const MetaLayout& ml);
  // The key of a decode step of `batch` sequences (one token each, last logits).
  static std::optional<int64_t> decode_graph_key(int64_t batch);
  // Runs `enqueue` (which only enqueues work on stream()) as a CUDA graph: captured the first
  // time `key` is seen, replayed afterwards; once kMaxGraphs are held, a new key runs eagerly.
  // The caller keeps every device address the work reads the same for a key (the step
  // geometry's layout is a function of the counts).
  void run_graph(int64_t key, const std::function<void()>& enqueue);
  // Step shapes held as graphs at most: decode batches and the small multi-token steps of
  // speculative verification (a few hundred kernel nodes each).
  static constexpr size_t kMaxGraphs = 192;
  // Kernel nodes of the graph captured under `key`, or nullopt before its capture.
  std::optional<int64_t> graph_kernels(int64_t key) const;

  // After loading: the KV cache (pages x page_size tokens per attention layer), every slot,
  // the workspace, the logits of `head` and the step metadata for max_pages pages per sequence.
  void allocate(int64_t pages, int64_t page_size, int64_t max_pages, const model::Module& head);
  // The KV widths of the attention layers, in load order.
  std::vector<KvLayerShape> kv_shapes() const;

  // The step's geometry (counts; its data is already in meta()).
  void begin(const MetaLayout& ml);
  // Profiling (Engine::profile_step): while on, each step records a CUDA event at its start and
  // after every op's launches (eager steps only: events cannot be recorded into a graph being
  // captured); take_profile() waits for the last one and sums the gaps per op class.
  void set_profiling(bool on);
  std::vector<Engine::OpTime> take_profile();
  int32_t* meta() const { return meta_.as<int32_t>(); }
  int64_t meta_capacity() const { return meta_capacity_; }
  // The logits of the last step: [rows, logits_width()] (TP: [tp, rows, widest rank vocab]).
  const float* logits_device() const { return logits_.as<float>(); }
  int64_t logits_width() const { return logits_width_; }
  int64_t rank_vocab() const { return rank_vocab_; }  // TP: the widest rank's vocabulary
  int64_t head_out() const { return head_out_; }      // TP 1: the head's outputs (>= vocab)

  // Gated DeltaNet layers: floats of one slot of the state pool (every such layer's state of one
  // sequence; 0 without such layers), and the slot zeroed on the stream (a sequence starting).
  int64_t recurrent_slot_floats() const { return dn_slot_floats_; }
  void clear_recurrent_slot(int64_t slot);
  // Copies slot `from`'s state over slot `to` (prefix caching's snapshots), on the stream.
  void copy_recurrent_slot(int64_t from, int64_t to);

  OverlayReport overlay_report() const { return overlay_report_; }
  size_t weight_bytes() const { return weight_bytes_; }
  size_t kv_bytes() const { return kv_bytes_; }

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
  void reserve(model::Slot slot, int64_t width) override;
  void reserve_group(std::span<const model::Module* const> linears) override;

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
  struct Rope;
  struct Gqa;
  struct Mla;
  struct DeltaNet;
  // The layers with a cache layer index, in load order (kv_shapes' order): one of the three is
  // set (a DeltaNet layer keeps nothing per token; its state lives in the state pool).
  struct CacheLayer {
    Gqa* gqa = nullptr;
    Mla* mla = nullptr;
    DeltaNet* delta = nullptr;
  };
  GpuLinear whole_linear(const std::string& prefix, int64_t in, int64_t out);
  // An RMSNorm weight as the kernels multiply by it (Gemma's 1 + w folded in).
  std::vector<float> norm_weight(const std::string& tensor, int64_t width) const;
  void track(const GpuLinear& l);
  int rope_table(const RopeSpec& r);
  const float* rope_cs(int table) const;  // the device cos/sin rows of a rope_table()
  // MLA layers (cuda_mla.cpp, where Mla is defined): a layer's cache widths, and the latent and
  // indexer caches of every MLA layer plus the MLA / DSA workspaces, at allocate().
  static KvLayerShape mla_kv_shape(const Mla& a);
  void allocate_mla(int64_t slots, int64_t max_pages, int64_t page_size);
  // Gated DeltaNet layers (cuda_delta_net.cpp): the state pool and convolution workspace.
  void allocate_delta_net();
  int tp_size() const;

  // Declared before everything that keeps a pointer to it (the linears), so destroyed after.
  std::unique_ptr<cuda::CudaContext> ctx_;
  cudaStream_t stream_ = nullptr;  // ctx_->stream()
  std::map<int64_t, cudaGraphExec_t> graphs_;
  std::map<int64_t, int64_t> graph_kernels_;  // kernel nodes per captured graph
  const Checkpoint& ckpt_;
  const ModelSpec& spec_;
  Options opts_;
  OverlayPlan overlay_plan_;
  OverlayReport overlay_report_;
  std::vector<Rope> ropes_;
  std::vector<CacheLayer> cache_layers_;  // every attention layer loaded, for the KV allocation
  bool dsa_selection_made_ = false;       // a full DSA indexer was loaded before (load order)
  int64_t widths_[static_cast<size_t>(model::Slot::kCount)] = {};
  int64_t widest_experts_ = 0, widest_topk_ = 0, widest_pad_in_ = 0, widest_pad_out_ = 0;
  int64_t rank_vocab_ = 0, head_out_ = 0, logits_width_ = 0, meta_capacity_ = 0;
  size_t ws_bytes_ = 0, weight_bytes_ = 0, kv_bytes_ = 0;
  int64_t page_size_ = 0, max_pages_ = 0;
  DeviceBuffer slots_[static_cast<size_t>(model::Slot::kCount)];
  DeviceBuffer router_, ids_, wts_, logits_, logits_local_, pad_in_, pad_out_, ws_, meta_;
  DeviceBuffer attn_ws_;  // split-KV decode attention: counters (zeroed here) and split states
  // MLA: the absorbed queries, latent outputs and split-KV partial states of kMlaChunkTokens
  // tokens; DSA: the indexer's
  // queries, head weights and keys of the step, a chunk's scores, and the step's selection
  // (kept from a full indexer layer for the shared layers after it).
  DeviceBuffer mla_q_lat_, mla_o_lat_, mla_split_, dsa_q_, dsa_w_, dsa_k_, dsa_scores_, dsa_sel_,
      dsa_count_;
  // Gated DeltaNet: the state pool [recurrent_slots, dn_slot_floats_] and the convolution
  // outputs of a step [capacity, widest conv_dim].
  DeviceBuffer dn_state_, dn_conv_;
  int64_t dn_slot_floats_ = 0, dn_widest_conv_ = 0;
  int64_t mla_lat_width_ = 0, dsa_q_width_ = 0, dsa_heads_ = 0, dsa_head_dim_ = 0, dsa_topk_ = 0;
  GpuLinear::Pads pads_;
  MetaLayout ml_;
  // Profiling state: events_[0] is the step's start, events_[i] (i < marks_) follows op
  // mark_ops_[i]; the pool grows to the longest step and is reused.
  struct OpScope {
    CudaBackend* b;
    const char* op;
    ~OpScope();
  };
  OpScope op_scope(const char* op) { return {this, op}; }
  void mark(const char* op) noexcept;
  bool profiling_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> mark_ops_;
  size_t marks_ = 0;
  cudaError_t mark_error_ = cudaSuccess;
};

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
