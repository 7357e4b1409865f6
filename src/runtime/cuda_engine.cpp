// The CUDA engine: the same ModelSpec as the CPU reference, every module on the GPU.
//
//   x = embed(tokens)                                   fp32 residual stream
//   per layer:  h = rms_norm(x);  x += o(attn(rope(norm(q(h)), norm(k(h))), v(h)))
//               h = rms_norm(x);  x += mlp(h)           dense SwiGLU or fused MoE (+ shared)
//   logits = lm_head(rms_norm(x[rows]))                 only the rows the caller wants
//
// Linears are Exl3LinearCuda (EXL3), DenseLinearCuda (cuBLAS) or Mxfp8LinearCuda (stored MXFP8 or
// the --overlay, planned as the CPU engine plans it); the MoE layer is MoeLayerCuda
// with its routes from the GPU router; attention reads an fp16 paged KV cache whose page tables
// live in a PagedKvCache without host storage. A forward step runs in chunks of at most
// max_batch_tokens tokens, so every buffer is sized once at load. Each step's geometry (ids,
// positions, page tables, attention tiles, head rows) goes to the device in one copy from pinned
// memory; kernels read it there, so a pure decode step (one token per sequence) depends on the
// host only through its token count and is captured as a CUDA graph per count, then replayed.
#include "cuda_engine.hpp"
#include "cuda_buffers.hpp"
#include "gpu_linear.hpp"
#include "paged_engine.hpp"

#if defined(EXL3_HAVE_CUDA)

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <variant>

#include <cuda_runtime_api.h>
#include <tbb/parallel_for.h>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/dense_linear.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/cuda/moe.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/runtime/linear.hpp"
#include "exl3/runtime/nccl_communicator.hpp"
#include "exl3/runtime/overlay.hpp"
#include "exl3/model/rope.hpp"
#include "exl3/runtime/tp_linear.hpp"

namespace exl3::runtime {
namespace {

using cuda::DType;
using SeqId = PagedKvCache::SeqId;

// Page-locked host memory (the step's geometry going up, the logits coming down).
struct PinnedFree {
  void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
};
template <typename T>
using Pinned = std::unique_ptr<T[], PinnedFree>;

template <typename T>
Pinned<T> pinned(size_t count, const char* what) {
  void* p = nullptr;
  EXL3_CUDA_CHECK(
      cudaMallocHost(&p, count * sizeof(T)),
      fmt::format("allocating {} in pinned memory ({} bytes)", what, count * sizeof(T)));
  return Pinned<T>(static_cast<T*>(p));
}

// Scratch of one forward chunk (cap tokens), shared by every layer.
struct Scratch {
  DeviceBuffer x, h, y;           // [cap, hidden]
  DeviceBuffer q, k, v, attn;     // [cap, widest q / kv / q]
  DeviceBuffer g, u;              // [cap, widest intermediate]
  DeviceBuffer router, ids, wts;  // [cap, E], [cap, k] x2
  DeviceBuffer shared_out;        // [cap, hidden]
  DeviceBuffer logits;        // [cap, stored vocab]; tensor parallel: [tp, cap, widest rank vocab]
  DeviceBuffer logits_local;  // tensor parallel: this rank's [cap, widest rank vocab]
  DeviceBuffer pad_in, pad_out;
  DeviceBuffer ws;    // linear workspace / MoE arena (never used at the same time)
  DeviceBuffer meta;  // int32 step geometry
};

struct DenseMlpGpu {
  GpuLinear gate, up, down;
  int64_t inter = 0;
};

struct MoeGpu {
  GpuLinear router;
  DeviceBuffer bias;
  cuda::RouterParams params;
  std::unique_ptr<cuda::MoeLayerCuda> layer;
  std::optional<DenseMlpGpu> shared;
};

struct AttnGpu {
  GqaAttentionSpec spec;
  GpuLinear q, k, v, o;
  DeviceBuffer q_norm, k_norm;
  int rope = 0;                 // index into the engine's RoPE tables
  DeviceBuffer kcache, vcache;  // fp16 [pages * page_size, kv_heads * head_dim]
};

struct LayerGpu {
  DeviceBuffer input_norm, post_norm;
  AttnGpu attn;
  std::variant<DenseMlpGpu, MoeGpu> mlp;
};

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
  int64_t total() const { return page_tables() + seqs * max_pages; }
};

// One chunk of a batch: runs of consecutive tokens, each from one entry.
struct Run {
  size_t entry = 0;
  SeqId seq = -1;
  size_t first = 0;  // index into the entry's tokens
  size_t len = 0;
  int64_t start = 0;  // position of the first token
  bool want_all = false, want_last = false;
};

class CudaEngine final : public PagedEngine {
 public:
  CudaEngine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts,
             const CudaRank* rank)
      : ckpt_(ckpt), spec_(std::move(spec)), opts_(opts) {
    if (rank != nullptr) {
#if defined(EXL3_HAVE_NCCL)
      tp_ = *rank;
#else
      fail("tensor parallel: this build has no NCCL");
#endif
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      fail("device cuda: no CUDA device is visible; hint: use --device cpu");
    }
    if (opts.page_size <= 0) fail("engine: page size {} must be positive", opts.page_size);
    if (opts.cache_tokens <= 0)
      fail("engine: cache size {} tokens must be positive", opts.cache_tokens);
    if (opts.max_batch_tokens <= 0)
      fail("engine: max batch tokens {} must be positive", opts.max_batch_tokens);
    cap_ = opts.max_batch_tokens;
    // The stream, the one cuBLAS handle bound to it and its workspace, shared by every linear.
    ctx_ = std::make_unique<cuda::CudaContext>();
    stream_ = ctx_->stream();
    const int64_t pages = (opts.cache_tokens + opts.page_size - 1) / opts.page_size;
    max_seq_tokens_ = pages * opts.page_size;
    if (spec_.max_position_embeddings > 0)
      max_seq_tokens_ = std::min(max_seq_tokens_, spec_.max_position_embeddings);
    max_pages_ = (max_seq_tokens_ + opts.page_size - 1) / opts.page_size;
    load_weights();
    std::vector<KvLayerShape> kv;
    for (const auto& l : layers_) {
      const int64_t w = l.attn.spec.num_kv_heads * l.attn.spec.head_dim;
      kv.push_back({w, w});
    }
    cache_ = std::make_unique<PagedKvCache>(std::move(kv), opts.page_size, pages,
                                            /*host_storage=*/false);
    for (auto& l : layers_) {
      const auto bytes = static_cast<size_t>(pages * opts.page_size * l.attn.spec.num_kv_heads *
                                             l.attn.spec.head_dim) *
                         2;
      l.attn.kcache = DeviceBuffer(bytes, "the KV cache");
      l.attn.vcache = DeviceBuffer(bytes, "the KV cache");
      kv_bytes_ += 2 * bytes;
    }
    allocate_scratch();
    meta_host_ = pinned<int32_t>(static_cast<size_t>(meta_capacity_), "the step metadata");
    if (!tp_ || tp_->rank == 0) {  // only rank 0 hands logits out
      logits_host_ = pinned<float>(s_.logits.count<float>(), "the logits");
    }
  }

  ~CudaEngine() override {
    for (auto& [n, g] : graphs_) cudaGraphExecDestroy(g);
  }

  const ModelSpec& spec() const override {
    return spec_;
  }
  Device device() const override {
    return Device::kCuda;
  }
  OverlayReport overlay_report() const override {
    return overlay_report_;
  }
  std::optional<size_t> device_weight_bytes() const override {
    return weight_bytes_;
  }

  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    const BatchEntry e{seq, tokens, mode};
    return std::move(forward_batch(std::span<const BatchEntry>(&e, 1)).front());
  }

  std::vector<std::vector<float>> forward_batch(std::span<const BatchEntry> batch) override {
    validate_batch(*this, batch);
    for (const auto& e : batch) {
      const int64_t end = cache_->length(e.seq) + static_cast<int64_t>(e.tokens.size());
      if (end > max_seq_tokens_) {
        fail(
            "forward: sequence {} would hold {} tokens; this engine runs sequences of up to {} "
            "(the KV pool or the "
            "model's max_position_embeddings); hint: raise --cache-tokens",
            e.seq, end, max_seq_tokens_);
      }
    }
    std::vector<std::vector<float>> out(batch.size());
    // Cut the batch's tokens into chunks of at most cap_ tokens, entry by entry.
    std::vector<Run> chunk;
    int64_t in_chunk = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      const auto& e = batch[b];
      size_t done = 0;
      while (done < e.tokens.size()) {
        const size_t len =
            std::min<size_t>(e.tokens.size() - done, static_cast<size_t>(cap_ - in_chunk));
        Run r;
        r.entry = b;
        r.seq = e.seq;
        r.first = done;
        r.len = len;
        r.want_all = e.mode == LogitsMode::kAll;
        r.want_last = e.mode == LogitsMode::kLast && done + len == e.tokens.size();
        chunk.push_back(r);
        in_chunk += static_cast<int64_t>(len);
        done += len;
        if (in_chunk == cap_) {
          run_chunk(batch, chunk, out);
          chunk.clear();
          in_chunk = 0;
        }
      }
    }
    if (!chunk.empty()) run_chunk(batch, chunk, out);
    return out;
  }

 private:
  // ---- loading ----------------------------------------------------------------------------

  void load_weights() {
    overlay_plan_ = OverlayPlan::build(opts_.overlay, ckpt_, spec_);  // the CPU engine's plan
    const auto& store = ckpt_.store();
    const int64_t hidden = spec_.hidden_size;
    const TensorRef* emb = store.find(spec_.embed_tokens);
    if (emb == nullptr)
      fail("{}: tensor '{}' is missing", ckpt_.path().string(), spec_.embed_tokens);
    if (emb->info->rank() != 2 || emb->info->shape[1] != hidden ||
        emb->info->shape[0] < spec_.vocab_size) {
      fail("{}: tensor '{}' is not [>= vocab_size {}, hidden_size {}]", ckpt_.path().string(),
           spec_.embed_tokens, spec_.vocab_size, hidden);
    }
    embed_type_ = cuda_dtype(emb->info->dtype, spec_.embed_tokens);
    {
      const auto bytes = emb->bytes();
      embed_ = DeviceBuffer(bytes.data(), bytes.size(), spec_.embed_tokens);
      weight_bytes_ += bytes.size();
    }
    final_norm_ =
        DeviceBuffer::upload(load_vector(store, spec_.final_norm, hidden), spec_.final_norm);
    if (tp_) {  // this rank's vocabulary rows
      const Extent v = tp_->plan->vocab[static_cast<size_t>(tp_->rank)];
      for (const Extent& e : tp_->plan->vocab) rank_vocab_ = std::max(rank_vocab_, e.count);
      if (spec_.lm_head_tied) {
        head_ = GpuLinear::dense(*ctx_, store, spec_.embed_tokens, {}, cap_, false, v);
      } else {
        head_ = rank_linear(tp_->plan->lm_head, 0,
                            tp_->plan->lm_head.ranks[static_cast<size_t>(tp_->rank)].count);
      }
    } else if (spec_.lm_head_tied) {
      head_ = GpuLinear::dense(*ctx_, store, spec_.embed_tokens, {}, cap_, false);
    } else {
      head_ =
          load_linear(spec_.lm_head, hidden, spec_.vocab_size);  // never overlaid; reported as kept
    }
    track(head_);  // weights, and its workspace / pads (an MXFP8 engine's linears need less than a
                   // BF16 head)
    std::optional<moe::MoeLayout> layout;
    if (spec_.is_moe()) {
      layout = moe::read_moe_layout(ckpt_);
      if (!layout) {
        fail(
            "{}: config.json describes a MoE model but the checkpoint has no EXL3 experts; the "
            "CUDA engine runs "
            "quantized experts only (hint: quantize the model with `exl3 quantize`, or use "
            "--device cpu)",
            ckpt_.path().string());
      }
      // Plain experts run at any TP (each rank cuts its channels); rank-sliced ones only at theirs.
      if (layout->tp != 1 && layout->tp != tp_size()) {
        fail("{}: the experts are sliced for TP {}, but the engine runs TP {}; hint: --tp {}",
             ckpt_.path().string(), layout->tp, tp_size(), layout->tp);
      }
    }
    static const LoadProgressFn kSilent;
    LoadProgressReporter progress(!tp_ || tp_->rank == 0 ? opts_.load_progress : kSilent,
                                  static_cast<int64_t>(spec_.layers.size()));
    for (size_t li = 0; li < spec_.layers.size(); ++li) {
      const LayerSpec& ls = spec_.layers[li];
      const TpLayerPlan* lp = tp_ ? &tp_->plan->layers[li] : nullptr;
      LayerGpu l;
      l.input_norm = DeviceBuffer::upload(load_vector(store, ls.input_norm, hidden), ls.input_norm);
      l.post_norm = DeviceBuffer::upload(load_vector(store, ls.post_attention_norm, hidden),
                                         ls.post_attention_norm);
      load_attention(l.attn, std::get<GqaAttentionSpec>(ls.attention),
                     lp ? &lp->attention : nullptr);
      if (const auto* d = std::get_if<DenseMlpSpec>(&ls.mlp)) {
        l.mlp = lp ? load_dense_mlp(std::get<TpMlpPlan>(lp->mlp))
                   : load_dense_mlp(d->prefix, d->intermediate);
      } else {
        const auto& m = std::get<MoeSpec>(ls.mlp);
        if (!layout->has_layer(ls.index)) {
          fail(
              "{}: config.json makes layer {} a MoE layer, but the checkpoint has no experts for "
              "it",
              ckpt_.path().string(), ls.index);
        }
        l.mlp = load_moe(m, *layout, ls.index, lp ? &std::get<TpMoePlan>(lp->mlp) : nullptr);
      }
      layers_.push_back(std::move(l));
      progress.layer_done();
    }
  }

  void load_attention(AttnGpu& a, const GqaAttentionSpec& s, const TpAttentionPlan* ap) {
    const int64_t hidden = spec_.hidden_size;
    if (!cuda::attention_supports_head_dim(static_cast<int>(s.head_dim))) {
      fail(
          "{}: {} has head_dim {}; the CUDA attention kernels are built for 64 and 128 (hint: "
          "--device cpu)",
          spec_.label, s.prefix, s.head_dim);
    }
    a.spec = s;
    if (ap != nullptr) {
      load_rank_attention(a, s, *ap);
    } else {
      const int64_t qw = s.num_heads * s.head_dim, kvw = s.num_kv_heads * s.head_dim;
      a.q = load_linear(s.prefix + ".q_proj", hidden, qw);
      a.k = load_linear(s.prefix + ".k_proj", hidden, kvw);
      a.v = load_linear(s.prefix + ".v_proj", hidden, kvw);
      a.o = load_linear(s.prefix + ".o_proj", qw, hidden);
    }
    const int64_t qw = a.spec.num_heads * s.head_dim, kvw = a.spec.num_kv_heads * s.head_dim;
    for (const GpuLinear* l : {&a.q, &a.k, &a.v, &a.o}) track(*l);
    if (s.qk_norm) {
      a.q_norm = DeviceBuffer::upload(
          load_vector(ckpt_.store(), s.prefix + ".q_norm.weight", s.head_dim), "q_norm");
      a.k_norm = DeviceBuffer::upload(
          load_vector(ckpt_.store(), s.prefix + ".k_norm.weight", s.head_dim), "k_norm");
    }
    a.rope = rope_table(s.rope);
    widest_q_ = std::max(widest_q_, qw);
    widest_kv_ = std::max(widest_kv_, kvw);
  }

  // This rank's heads: local q heads [b, b + nh) read local kv heads [kb, kb + nkv). The attention
  // kernels map local q head i to kv head i / (nh / nkv), which must be the head GQA assigns.
  void load_rank_attention(AttnGpu& a, const GqaAttentionSpec& s, const TpAttentionPlan& ap) {
    const auto r = static_cast<size_t>(tp_->rank);
    const Extent hq = ap.q_heads[r], hk = ap.kv_heads[r];
    const int64_t hd = s.head_dim, qpk = s.num_heads / s.num_kv_heads;
    bool maps = hq.count > 0 && hk.count > 0 && hq.count % hk.count == 0;
    for (int64_t i = 0; maps && i < hq.count; ++i)
      maps = (hq.begin + i) / qpk - hk.begin == i / (hq.count / hk.count);
    if (!maps) {
      fail(
          "{}: at TP {} rank {} holds q heads [{}, {}) and kv heads [{}, {}), a grouping the CUDA "
          "attention kernels "
          "cannot run (each rank needs whole GQA groups, or a part of one); hint: a TP that "
          "divides the {} kv heads, "
          "or a multiple of them that divides the {} q heads, or --device cpu",
          s.prefix, tp_size(), r, hq.begin, hq.end(), hk.begin, hk.end(), s.num_kv_heads,
          s.num_heads);
    }
    a.spec.num_heads = hq.count;
    a.spec.num_kv_heads = hk.count;
    a.q = rank_linear(ap.q, 0, hq.count * hd);
    a.k = rank_linear(ap.k, hk.begin * hd - ap.k.ranks[r].begin, hk.count * hd);
    a.v = rank_linear(ap.v, hk.begin * hd - ap.v.ranks[r].begin, hk.count * hd);
    a.o = rank_linear(ap.o, 0, spec_.hidden_size);
  }

  // This rank's slice of `p` on the GPU (`out` columns from `out_offset`); an unquantized slice
  // goes up in its checkpoint tensor's dtype.
  GpuLinear rank_linear(const TpLinearPlan& p, int64_t out_offset, int64_t out) const {
    const TensorRef* ref = ckpt_.store().find(p.prefix + ".weight");
    return GpuLinear::from_rank(*ctx_, RankLinear::slice(ckpt_, p, tp_->rank), p.prefix, out_offset,
                                out, cap_, ref != nullptr ? ref->info->dtype : exl3::DType::kF32);
  }

  DenseMlpGpu load_dense_mlp(const TpMlpPlan& p) {
    const auto r = static_cast<size_t>(tp_->rank);
    const auto [gate, up, down] = mlp_linear_plans(ckpt_, p, spec_.hidden_size);
    const int64_t inter = p.ranks[r].count;
    DenseMlpGpu m{rank_linear(gate, 0, inter), rank_linear(up, 0, inter),
                  rank_linear(down, 0, spec_.hidden_size), inter};
    for (const GpuLinear* l : {&m.gate, &m.up, &m.down}) track(*l);
    widest_inter_ = std::max(widest_inter_, inter);
    return m;
  }

  DenseMlpGpu load_dense_mlp(const std::string& prefix, int64_t inter) {
    const int64_t hidden = spec_.hidden_size;
    DenseMlpGpu m{load_linear(prefix + ".gate_proj", hidden, inter),
                  load_linear(prefix + ".up_proj", hidden, inter),
                  load_linear(prefix + ".down_proj", inter, hidden), inter};
    for (const GpuLinear* l : {&m.gate, &m.up, &m.down}) track(*l);
    widest_inter_ = std::max(widest_inter_, inter);
    return m;
  }

  MoeGpu load_moe(const MoeSpec& s, const moe::MoeLayout& layout, int layer, const TpMoePlan* p) {
    MoeGpu m;
    const auto& store = ckpt_.store();
    m.router =
        GpuLinear::load(*ctx_, ckpt_, s.prefix + ".gate", spec_.hidden_size, s.num_experts, cap_,
                        /*fp32=*/true);
    track(m.router);
    m.params.num_experts = static_cast<int>(s.num_experts);
    m.params.top_k = s.top_k;
    m.params.renormalize = s.renormalize;
    m.params.sigmoid_grouped = s.router == RouterKind::kSigmoidGrouped;
    m.params.n_group = s.n_group;
    m.params.topk_group = s.topk_group;
    m.params.routed_scaling_factor = static_cast<float>(s.routed_scaling_factor);
    if (s.num_experts > 1024 || s.top_k > 32 || s.n_group > 32) {
      fail(
          "{}: {}: the GPU router handles up to 1024 experts, top-k 32 and 32 groups (this layer: "
          "{}, {}, {})",
          spec_.label, s.prefix, s.num_experts, s.top_k, s.n_group);
    }
    if (s.correction_bias) {
      m.bias = DeviceBuffer::upload(
          load_vector(store, s.prefix + ".gate.e_score_correction_bias", s.num_experts),
          "e_score_correction_bias");
      m.params.correction_bias = m.bias.as<float>();
    }
    const int experts = static_cast<int>(s.num_experts);
    moe::MoeLayerWeights w;
    int64_t inter = s.intermediate;
    if (p == nullptr) {
      w = moe::load_moe_layer(store, layout, layer, 0, 1, experts);
    } else {
      // Rank-sliced checkpoints: only this rank's `.rank{r}` tensors; plain ones: cut here.
      const Extent ext = p->ranks[static_cast<size_t>(tp_->rank)];
      if (ext.empty()) {
        fail(
            "{}: MoE layer {} has no intermediate channels for rank {} at TP {}; hint: use a "
            "smaller --tp",
            ckpt_.path().string(), layer, tp_->rank, tp_size());
      }
      inter = ext.count;
      w = p->rank_sliced ? moe::load_moe_layer(store, layout, layer, tp_->rank, tp_size(), experts)
                         : slice_moe_layer(moe::load_moe_layer(store, layout, layer, 0, 1, experts),
                                           ext, tp_->rank, tp_size());
    }
    if (w.hidden != spec_.hidden_size || w.intermediate != inter) {
      fail(
          "{}: MoE layer {} experts are {} -> {}, expected {} -> {} (config.json's hidden_size and "
          "moe_intermediate_size{})",
          ckpt_.path().string(), layer, w.hidden, w.intermediate, spec_.hidden_size, inter,
          p ? fmt::format(", rank {} of TP {}", tp_->rank, tp_size()) : "");
    }
    cuda::MoeOptions mo;
    mo.capacity = cap_;
    m.layer = std::make_unique<cuda::MoeLayerCuda>(w, s.top_k, cuda::moe_options_from_env(mo));
    weight_bytes_ += m.layer->device_bytes();
    ws_bytes_ = std::max(ws_bytes_, m.layer->arena_bytes());
    widest_experts_ = std::max<int64_t>(widest_experts_, s.num_experts);
    widest_topk_ = std::max<int64_t>(widest_topk_, s.top_k);
    if (s.shared)
      m.shared =
          p ? load_dense_mlp(*p->shared) : load_dense_mlp(s.shared->prefix, s.shared->intermediate);
    return m;
  }

  // A linear with its MXFP8 overlay decision from the plan the CPU engine builds, so both engines
  // overlay the same linears (dense and shared-expert MLPs, attention; lm_head is always kept).
  GpuLinear load_linear(const std::string& prefix, int64_t in, int64_t out) {
    OverlayDecision d = overlay_plan_.decision(prefix);
    if (!opts_.overlay.any()) d.reason.clear();  // nothing to report as "kept" without a policy
    return GpuLinear::load(*ctx_, ckpt_, prefix, in, out, cap_, false, d, &overlay_report_);
  }

  void track(const GpuLinear& l) {
    weight_bytes_ += l.device_bytes();
    ws_bytes_ = std::max(ws_bytes_, l.workspace_bytes());
    if (l.stored_in() != l.in()) widest_pad_in_ = std::max(widest_pad_in_, l.stored_in());
    if (l.stored_out() != l.out()) widest_pad_out_ = std::max(widest_pad_out_, l.stored_out());
  }

  // cos/sin tables [max_seq_tokens, 2, half] per distinct RoPE (every layer shares one in the
  // supported architectures).
  int rope_table(const RopeSpec& r) {
    const RopeTable table(r);
    for (size_t i = 0; i < ropes_.size(); ++i) {
      if (ropes_[i].inv_freq == table.inv_freq() && ropes_[i].factor == r.attention_factor)
        return static_cast<int>(i);
    }
    const int64_t half = table.half();
    std::vector<float> cs(static_cast<size_t>(max_seq_tokens_ * 2 * half));
    for (int64_t p = 0; p < max_seq_tokens_; ++p) {
      table.at(p, cs.data() + p * 2 * half, cs.data() + p * 2 * half + half);
    }
    ropes_.push_back(
        {table.inv_freq(), r.attention_factor, DeviceBuffer::upload(cs, "the RoPE table")});
    return static_cast<int>(ropes_.size() - 1);
  }

  void allocate_scratch() {
    const auto f = [&](int64_t width, const char* what) {
      return DeviceBuffer(static_cast<size_t>(cap_ * width) * 4, what);
    };
    const int64_t hidden = spec_.hidden_size;
    s_.x = f(hidden, "activations");
    s_.h = f(hidden, "activations");
    s_.y = f(hidden, "activations");
    s_.q = f(widest_q_, "activations");
    s_.attn = f(widest_q_, "activations");
    s_.k = f(widest_kv_, "activations");
    s_.v = f(widest_kv_, "activations");
    s_.g = f(std::max<int64_t>(widest_inter_, 1), "activations");
    s_.u = f(std::max<int64_t>(widest_inter_, 1), "activations");
    s_.router = f(std::max<int64_t>(widest_experts_, 1), "router logits");
    s_.ids = f(std::max<int64_t>(widest_topk_, 1), "routes");
    s_.wts = f(std::max<int64_t>(widest_topk_, 1), "routes");
    s_.shared_out = f(hidden, "activations");
    if (tp_) {
      s_.logits_local = f(rank_vocab_, "logits");
      s_.logits = DeviceBuffer(static_cast<size_t>(tp_size() * cap_ * rank_vocab_) * 4, "logits");
    } else {
      s_.logits = f(head_.out(), "logits");
    }
    if (widest_pad_in_ > 0) s_.pad_in = f(widest_pad_in_, "padding");
    if (widest_pad_out_ > 0) s_.pad_out = f(widest_pad_out_, "padding");
    s_.ws = DeviceBuffer(ws_bytes_, "the workspace");
    meta_capacity_ = 7 * cap_ + cap_ * max_pages_;  // the largest MetaLayout::total()
    s_.meta = DeviceBuffer(static_cast<size_t>(meta_capacity_) * 4, "step metadata");
    pads_ = {s_.pad_in.as<float>(), s_.pad_out.as<float>()};
  }

  // ---- one chunk --------------------------------------------------------------------------

  void run_chunk(std::span<const BatchEntry> batch, std::vector<Run>& runs,
                 std::vector<std::vector<float>>& out) {
    MetaLayout ml;
    ml.max_pages = max_pages_;
    ml.seqs = static_cast<int64_t>(runs.size());
    bool pure_decode = true;
    for (auto& r : runs) {
      r.start = cache_->length(r.seq);
      ml.n += static_cast<int64_t>(r.len);
      if (r.len == 1) {
        ++ml.decode;
      } else {
        ml.tiles += static_cast<int64_t>((r.len + 31) / 32);
        pure_decode = false;
      }
      ml.rows += r.want_all ? static_cast<int64_t>(r.len) : (r.want_last ? 1 : 0);
      if (!r.want_last || r.want_all) pure_decode = false;
    }
    for (const auto& r : runs) cache_->reserve(r.seq, static_cast<int64_t>(r.len));
    int32_t* h = meta_host_.get();
    int64_t t = 0, d = 0, ti = 0, row = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      const auto& tokens = batch[r.entry].tokens;
      if (r.len > 1) {
        for (size_t f = 0; f < r.len; f += 32) {
          h[ml.tile_first() + ti] = static_cast<int32_t>(t + static_cast<int64_t>(f));
          h[ml.tile_len() + ti] = static_cast<int32_t>(std::min<size_t>(32, r.len - f));
          ++ti;
        }
      } else {
        h[ml.decode_list() + d++] = static_cast<int32_t>(t);
      }
      for (size_t j = 0; j < r.len; ++j, ++t) {
        h[ml.ids() + t] = tokens[r.first + j];
        h[ml.pos() + t] = static_cast<int32_t>(r.start + static_cast<int64_t>(j));
        h[ml.seq_row() + t] = static_cast<int32_t>(i);
        if (r.want_all || (r.want_last && j + 1 == r.len))
          h[ml.row_index() + row++] = static_cast<int32_t>(t);
      }
      const auto pages = cache_->page_table(r.seq);
      int32_t* pt = h + ml.page_tables() + static_cast<int64_t>(i) * max_pages_;
      std::fill_n(pt, max_pages_, 0);
      std::copy(pages.begin(), pages.end(), pt);
    }
    EXL3_CUDA_CHECK(
        cudaMemcpyAsync(s_.meta.get(), meta_host_.get(), static_cast<size_t>(ml.total()) * 4,
                        cudaMemcpyHostToDevice, stream_),
        "uploading the step");
    if (pure_decode && opts_.cuda_graphs) {
      launch_graph(ml);
    } else {
      forward_kernels(ml);
    }
    const bool returns_logits =
        !tp_ || tp_->rank == 0;  // every rank has them; rank 0 hands them out
    if (ml.rows > 0 && returns_logits) {
      const int64_t vs = tp_ ? tp_size() * rank_vocab_ : head_.out();
      EXL3_CUDA_CHECK(
          cudaMemcpyAsync(logits_host_.get(), s_.logits.get(),
                          static_cast<size_t>(ml.rows * vs) * 4, cudaMemcpyDeviceToHost, stream_),
          "reading the logits");
    }
#if defined(EXL3_HAVE_NCCL)
    if (tp_) {
      tp_->comm->wait(stream_, "running the forward pass");
    } else {
      EXL3_CUDA_CHECK(cudaStreamSynchronize(stream_), "running the forward pass");
    }
#else
    EXL3_CUDA_CHECK(cudaStreamSynchronize(stream_), "running the forward pass");
#endif
    // Hand each run's rows to its entry (vocab columns only: the head may be padded). A decode
    // step of 64 sequences returns 64 vocab-wide rows (39 MB for a 152k vocabulary), so the
    // copies out of pinned memory run in parallel.
    const int64_t vs = head_.out(), vocab = spec_.vocab_size;
    std::vector<std::pair<float*, int64_t>> rows_out;  // destination, source row
    int64_t r_at = 0;
    for (const Run& r : runs) {
      cache_->advance(r.seq, static_cast<int64_t>(r.len));
      if (!returns_logits) continue;
      const int64_t rows = r.want_all ? static_cast<int64_t>(r.len) : (r.want_last ? 1 : 0);
      auto& dst = out[r.entry];
      const size_t at = dst.size();
      dst.resize(at + static_cast<size_t>(rows * vocab));
      for (int64_t i = 0; i < rows; ++i) rows_out.emplace_back(dst.data() + at + i * vocab, r_at++);
    }
    tbb::parallel_for(size_t{0}, rows_out.size(), [&](size_t i) {
      if (!tp_) {
        std::memcpy(rows_out[i].first, logits_host_.get() + rows_out[i].second * vs,
                    static_cast<size_t>(vocab) * 4);
        return;
      }
      // Rank q's block holds its vocabulary rows [begin, begin + count) of every row.
      for (int q = 0; q < tp_size(); ++q) {
        const Extent e = tp_->plan->vocab[static_cast<size_t>(q)];
        std::memcpy(rows_out[i].first + e.begin,
                    logits_host_.get() + (q * ml.rows + rows_out[i].second) * rank_vocab_,
                    static_cast<size_t>(e.count) * 4);
      }
    });
  }

  void launch_graph(const MetaLayout& ml) {
    auto it = graphs_.find(ml.n);
    if (it == graphs_.end()) {
      cudaGraph_t graph = nullptr;
      EXL3_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                      "capturing the decode step");
      try {
        forward_kernels(ml);
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      EXL3_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph), "capturing the decode step");
      cudaGraphExec_t exec = nullptr;
      const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      EXL3_CUDA_CHECK(instantiated, "instantiating the decode graph");
      it = graphs_.emplace(ml.n, exec).first;
    }
    EXL3_CUDA_CHECK(cudaGraphLaunch(it->second, stream_), "replaying the decode graph");
  }

  // Every kernel of one chunk, in stream order (no host sync, no allocation).
  void forward_kernels(const MetaLayout& ml) {
    const int64_t n = ml.n, hidden = spec_.hidden_size;
    const auto* meta = s_.meta.as<int32_t>();
    const cuda::TokenMeta tm{meta + ml.pos(), meta + ml.seq_row()};
    float* x = s_.x.as<float>();
    float* hbuf = s_.h.as<float>();
    float* y = s_.y.as<float>();
    void* ws = s_.ws.get();
    const size_t wsz = s_.ws.bytes();
    const float eps = static_cast<float>(spec_.rms_norm_eps);
    EXL3_CUDA_CHECK(
        cuda::embed_rows(embed_.get(), embed_type_, hidden, meta + ml.ids(), n, x, stream_),
        "embedding");
    const float* pending = nullptr;  // the last block's output, added to x by the next norm
    for (size_t li = 0; li < layers_.size(); ++li) {
      const LayerGpu& l = layers_[li];
      EXL3_CUDA_CHECK(cuda::add_rms_norm(x, pending, l.input_norm.as<float>(), nullptr, n, hidden,
                                         eps, hbuf, stream_),
                      "norm");
      attention(l.attn, ml, tm, hbuf, y, ws, wsz);
      all_reduce(y, n * hidden, "attention output");
      EXL3_CUDA_CHECK(
          cuda::add_rms_norm(x, y, l.post_norm.as<float>(), nullptr, n, hidden, eps, hbuf, stream_),
          "norm");
      if (const auto* d = std::get_if<DenseMlpGpu>(&l.mlp)) {
        dense_mlp(*d, hbuf, y, n, ws, wsz);
      } else {
        moe_mlp(std::get<MoeGpu>(l.mlp), hbuf, y, n, ws, wsz);
      }
      all_reduce(y, n * hidden, "MLP output");
      pending = y;
    }
    if (ml.rows == 0) return;
    EXL3_CUDA_CHECK(cuda::add_rms_norm(x, pending, final_norm_.as<float>(), meta + ml.row_index(),
                                       ml.rows, hidden, eps, hbuf, stream_),
                    "final norm");
    if (!tp_) {
      head_.run(hbuf, s_.logits.as<float>(), ml.rows, ws, wsz, pads_, stream_);
      return;
    }
#if defined(EXL3_HAVE_NCCL)
    // Each rank's [rows, its vocabulary] block, gathered as [tp, rows, widest rank vocabulary].
    head_.run(hbuf, s_.logits_local.as<float>(), ml.rows, ws, wsz, pads_, stream_);
    const std::string err =
        tp_->comm->all_gather_device(s_.logits_local.as<float>(), s_.logits.as<float>(),
                                     static_cast<size_t>(ml.rows * rank_vocab_), stream_);
    if (!err.empty()) fail("tensor parallel rank {}: logits: {}", tp_->rank, err);
#endif
  }

  // Sums the ranks' partial outputs (row-parallel linears) in place; nothing at TP 1.
  void all_reduce([[maybe_unused]] float* data, [[maybe_unused]] int64_t count,
                  [[maybe_unused]] const char* what) {
#if defined(EXL3_HAVE_NCCL)
    if (!tp_) return;
    const std::string err =
        tp_->comm->all_reduce_sum_device(data, static_cast<size_t>(count), stream_);
    if (!err.empty()) fail("tensor parallel rank {}: {}: {}", tp_->rank, what, err);
#endif
  }

  int tp_size() const {
    return tp_ ? tp_->plan->tp : 1;
  }

  void attention(const AttnGpu& a, const MetaLayout& ml, const cuda::TokenMeta& tm, const float* h,
                 float* out, void* ws, size_t wsz) {
    const int64_t n = ml.n;
    const auto& s = a.spec;
    float* q = s_.q.as<float>();
    float* k = s_.k.as<float>();
    float* v = s_.v.as<float>();
    a.q.run(h, q, n, ws, wsz, pads_, stream_);
    a.k.run(h, k, n, ws, wsz, pads_, stream_);
    a.v.run(h, v, n, ws, wsz, pads_, stream_);
    const auto* meta = s_.meta.as<int32_t>();
    cuda::PagedKv kv{a.kcache.as<uint16_t>(), a.vcache.as<uint16_t>(), meta + ml.page_tables(),
                     static_cast<int32_t>(max_pages_), static_cast<int32_t>(cache_->page_size())};
    const cuda::AttnShape shape{static_cast<int>(s.num_heads), static_cast<int>(s.num_kv_heads),
                                static_cast<int>(s.head_dim), static_cast<int>(s.rope.half())};
    EXL3_CUDA_CHECK(cuda::qk_norm_rope_store(q, k, v, a.q_norm.as<float>(), a.k_norm.as<float>(),
                                             static_cast<float>(spec_.rms_norm_eps),
                                             ropes_[static_cast<size_t>(a.rope)].table.as<float>(),
                                             tm, n, shape, kv, stream_),
                    "rope");
    float* attn = s_.attn.as<float>();
    const auto scale = static_cast<float>(s.scale);
    EXL3_CUDA_CHECK(cuda::attention_decode(q, meta + ml.decode_list(), ml.decode, tm, shape, scale,
                                           kv, attn, stream_),
                    "attention (decode)");
    EXL3_CUDA_CHECK(cuda::attention_prefill(q, meta + ml.tile_first(), meta + ml.tile_len(),
                                            ml.tiles, tm, shape, scale, kv, attn, stream_),
                    "attention (prefill)");
    a.o.run(attn, out, n, ws, wsz, pads_, stream_);
  }

  void dense_mlp(const DenseMlpGpu& m, const float* h, float* out, int64_t n, void* ws,
                 size_t wsz) {
    float* g = s_.g.as<float>();
    float* u = s_.u.as<float>();
    m.gate.run(h, g, n, ws, wsz, pads_, stream_);
    m.up.run(h, u, n, ws, wsz, pads_, stream_);
    EXL3_CUDA_CHECK(cuda::silu_mul(g, u, n * m.inter, stream_), "SiLU");
    m.down.run(g, out, n, ws, wsz, pads_, stream_);
  }

  void moe_mlp(const MoeGpu& m, const float* h, float* out, int64_t n, void* ws, size_t wsz) {
    float* logits = s_.router.as<float>();
    m.router.run(h, logits, n, ws, wsz, pads_, stream_);
    auto* ids = s_.ids.as<int32_t>();
    auto* wts = s_.wts.as<float>();
    EXL3_CUDA_CHECK(cuda::route_topk(logits, n, m.params, ids, wts, stream_), "routing");
    EXL3_CUDA_CHECK(m.layer->run(h, DType::kF32, ids, wts, out, n, ws, wsz, stream_), "MoE layer");
    if (m.shared) {
      float* so = s_.shared_out.as<float>();
      dense_mlp(*m.shared, h, so, n, ws, wsz);
      EXL3_CUDA_CHECK(cuda::add_inplace(out, so, n * spec_.hidden_size, stream_), "shared experts");
    }
  }

  struct Rope {
    std::vector<float> inv_freq;
    double factor = 1.0;
    DeviceBuffer table;
  };

  Checkpoint ckpt_;
  ModelSpec spec_;
  EngineOptions opts_;
  std::optional<CudaRank> tp_;  // set: one rank of a tensor-parallel group
  int64_t rank_vocab_ = 0;      // tensor parallel: the widest rank's vocabulary rows
  int64_t cap_ = 0, max_seq_tokens_ = 0, max_pages_ = 0, meta_capacity_ = 0;
  // Declared before every linear (they keep a pointer to it), so destroyed after them.
  std::unique_ptr<cuda::CudaContext> ctx_;
  cudaStream_t stream_ = nullptr;  // ctx_->stream()
  DeviceBuffer embed_, final_norm_;
  DType embed_type_ = DType::kBF16;
  GpuLinear head_;
  std::vector<LayerGpu> layers_;
  std::vector<Rope> ropes_;
  Scratch s_;
  GpuLinear::Pads pads_;
  int64_t widest_q_ = 0, widest_kv_ = 0, widest_inter_ = 0, widest_experts_ = 0, widest_topk_ = 0;
  int64_t widest_pad_in_ = 0, widest_pad_out_ = 0;
  size_t ws_bytes_ = 0, weight_bytes_ = 0, kv_bytes_ = 0;
  Pinned<int32_t> meta_host_;
  Pinned<float> logits_host_;
  std::map<int64_t, cudaGraphExec_t> graphs_;
  OverlayPlan overlay_plan_;
  OverlayReport overlay_report_;
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const Checkpoint& ckpt, ModelSpec spec,
                                         const EngineOptions& opts, const CudaRank* rank) {
  return std::make_unique<CudaEngine>(ckpt, std::move(spec), opts, rank);
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
