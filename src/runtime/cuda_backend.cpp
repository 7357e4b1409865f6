// CudaBackend (see cuda_backend.hpp): the op layer on one GPU.
#include "cuda_backend.hpp"

#if defined(EXL3_HAVE_CUDA)

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/moe.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/model/rope.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/runtime/linear.hpp"
#include "exl3/runtime/nccl_communicator.hpp"
#include "exl3/runtime/tp_linear.hpp"

namespace exl3::runtime {

using cuda::DType;
using model::Act;
using model::Extent;
using model::Module;
using model::ModulePtr;

namespace {

struct CudaEmbedding final : Module {
  DeviceBuffer table;
  DType dtype = DType::kBF16;
  float scale = 1.0f;  // model::embedding_scale
};

struct CudaNorm final : Module {
  DeviceBuffer weight;
  float eps = 0.0f;
};

struct CudaLinear final : Module {
  GpuLinear linear;
};

struct CudaMoe final : Module {
  GpuLinear router;            // without its bias: router_bias goes in through params
  DeviceBuffer route_counter;  // route_decode's arrivals (one int32, zero at rest)
  DeviceBuffer bias, router_bias;
  cuda::RouterParams params;
  std::unique_ptr<cuda::MoeLayerCuda> layer;
  // The experts' stored hidden width when their linears are padded (gpt-oss's 2880 -> 2944):
  // the layer then runs on zero-padded rows and its output is cut back. 0 = not padded.
  int64_t padded_hidden = 0;
};

// gpt-oss's experts as the fused layer runs them: per-expert biases from `{E}.{proj}.bias`
// (a padded linear stores its padded width; the real channels come first), the clamped SwiGLU,
// and the padded intermediate channels masked.
cuda::MoeExpertExtras expert_extras(const TensorStore& store, const MoeSpec& s, int64_t hidden,
                                    int64_t stored_inter) {
  cuda::MoeExpertExtras x;
  if (s.activation == model::Activation::kClampedSwiglu) {
    x.swiglu_alpha = static_cast<float>(s.swiglu_alpha);
    x.swiglu_limit = static_cast<float>(s.swiglu_limit);
  } else if (s.activation != model::Activation::kSilu) {
    fail("{}: the CUDA MoE runs SiLU and clamped SwiGLU experts only (hint: --device cpu)",
         s.prefix);
  }
  if (stored_inter != s.intermediate) x.valid_intermediate = s.intermediate;
  if (!s.expert_bias) return x;
  x.gate_up_width = s.intermediate;
  x.down_width = hidden;
  std::vector<float>* dst[3] = {&x.gate_bias, &x.up_bias, &x.down_bias};
  for (int64_t e = 0; e < s.num_experts; ++e) {
    for (int p = 0; p < 3; ++p) {
      const std::string name = fmt::format("{}.experts.{}.{}.bias", s.prefix, e, s.expert_proj[p]);
      const TensorRef* t = store.find(name);
      if (t == nullptr)
        fail("{}: tensor '{}' is missing (the experts have biases)", s.prefix, name);
      const int64_t width = p < 2 ? s.intermediate : hidden;
      const std::vector<float> v = read_as_float(*t);
      if (t->info->rank() != 1 || static_cast<int64_t>(v.size()) < width) {
        fail("{}: tensor '{}' has {} values, expected at least {}", t->path().string(), name,
             v.size(), width);
      }
      dst[p]->insert(dst[p]->end(), v.begin(), v.begin() + width);
    }
  }
  return x;
}

}  // namespace

struct CudaBackend::Gqa final : Module {
  GqaAttentionSpec spec;  // this rank's heads
  DeviceBuffer q_norm, k_norm;
  DeviceBuffer sinks;  // fp32 [heads of this rank] (gpt-oss), or empty
  int rope = 0;        // index into the backend's RoPE tables
  // fp16 [pages * page_size, kv_heads * head_dim], or a quantized format's codes
  // [pages * page_size, kv_heads, code bytes of head_dim] and fp16 scales
  // [pages * page_size, kv_heads * head_dim / 32] (exl3/cpu/kv_codec.hpp).
  DeviceBuffer kcache, vcache;
  DeviceBuffer kscales, vscales;
};

namespace {

// Kernel nodes of a captured graph (memsets, copies and empty nodes are not launches).
int64_t count_kernel_nodes(cudaGraph_t graph) {
  size_t n = 0;
  EXL3_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n), "counting the decode graph's nodes");
  std::vector<cudaGraphNode_t> nodes(n);
  EXL3_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n), "listing the decode graph's nodes");
  int64_t kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    EXL3_CUDA_CHECK(cudaGraphNodeGetType(node, &type), "reading a decode graph node's type");
    kernels += type == cudaGraphNodeTypeKernel;
  }
  return kernels;
}

cuda::AttnShape attn_shape(const GqaAttentionSpec& s) {
  return {static_cast<int>(s.num_heads), static_cast<int>(s.num_kv_heads),
          static_cast<int>(s.head_dim), static_cast<int>(s.rope.half()),
          static_cast<int>(std::clamp<int64_t>(s.sliding_window, 0, INT32_MAX))};
}

}  // namespace

struct CudaBackend::Rope {
  std::vector<float> inv_freq;
  double factor = 1.0;
  DeviceBuffer table;  // cos/sin [max_seq_tokens, 2, half]
};

CudaBackend::CudaBackend(const Checkpoint& ckpt, const ModelSpec& spec, Options opts)
    : ctx_(std::make_unique<cuda::CudaContext>()),
      stream_(ctx_->stream()),
      ckpt_(ckpt),
      spec_(spec),
      opts_(std::move(opts)) {
  if (opts_.plan == nullptr) overlay_plan_ = OverlayPlan::build(opts_.overlay, ckpt_, spec_);
}

CudaBackend::~CudaBackend() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g);
}

void CudaBackend::begin(const MetaLayout& ml) {
  ml_ = ml;
  if (!profiling_) return;
  marks_ = 0;
  mark(nullptr);  // the step's start
}

void CudaBackend::set_profiling(bool on) {
  profiling_ = on;
  marks_ = 0;
  mark_error_ = cudaSuccess;
}

void CudaBackend::mark(const char* op) noexcept {
  if (mark_error_ != cudaSuccess) return;
  if (marks_ == events_.size()) {
    cudaEvent_t e = nullptr;
    mark_error_ = cudaEventCreate(&e);
    if (mark_error_ != cudaSuccess) return;
    events_.push_back(e);
    mark_ops_.push_back(nullptr);
  }
  mark_ops_[marks_] = op;
  mark_error_ = cudaEventRecord(events_[marks_], stream_);
  ++marks_;
}

CudaBackend::OpScope::~OpScope() {
  if (b->profiling_) b->mark(op);
}

std::vector<Engine::OpTime> CudaBackend::take_profile() {
  EXL3_CUDA_CHECK(mark_error_, "recording the profiling events");
  std::vector<Engine::OpTime> out;
  if (marks_ < 2) return out;
  EXL3_CUDA_CHECK(cudaEventSynchronize(events_[marks_ - 1]), "waiting for the profiled step");
  for (size_t i = 1; i < marks_; ++i) {
    float ms = 0.0f;
    EXL3_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]), "timing an op");
    const std::string op = mark_ops_[i];
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& t) { return t.op == op; });
    if (it == out.end()) it = out.insert(out.end(), Engine::OpTime{op, 0, 0.0});
    ++it->calls;
    it->ms += ms;
  }
  marks_ = 0;
  return out;
}

std::optional<int64_t> CudaBackend::graph_key(const MetaLayout& ml) {
  // Five 12-bit counts: every field of a step of up to 4095 tokens.
  const int64_t fields[] = {ml.n, ml.decode, ml.tiles, ml.rows, ml.seqs};
  int64_t key = 0;
  for (const int64_t f : fields) {
    if (f < 0 || f >= 4096) return std::nullopt;
    key = (key << 12) | f;
  }
  return key;
}

std::optional<int64_t> CudaBackend::decode_graph_key(int64_t batch) {
  MetaLayout ml;
  ml.n = ml.decode = ml.rows = ml.seqs = batch;
  return graph_key(ml);
}

void CudaBackend::run_graph(int64_t key, const std::function<void()>& enqueue) {
  auto it = graphs_.find(key);
  if (it == graphs_.end() && graphs_.size() >= kMaxGraphs) {
    enqueue();
    return;
  }
  if (it == graphs_.end()) {
    cudaGraph_t graph = nullptr;
    EXL3_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                    "capturing a decode step");
    try {
      enqueue();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    EXL3_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph), "capturing a decode step");
    graph_kernels_[key] = count_kernel_nodes(graph);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    EXL3_CUDA_CHECK(instantiated, "instantiating a decode step's graph");
    it = graphs_.emplace(key, exec).first;
  }
  EXL3_CUDA_CHECK(cudaGraphLaunch(it->second, stream_), "replaying a decode step's graph");
}

std::optional<int64_t> CudaBackend::graph_kernels(int64_t key) const {
  const auto it = graph_kernels_.find(key);
  if (it == graph_kernels_.end()) return std::nullopt;
  return it->second;
}

int CudaBackend::tp_size() const {
  return opts_.plan != nullptr ? opts_.plan->tp : 1;
}

// ---- load --------------------------------------------------------------------------------------

ModulePtr CudaBackend::load_embedding() {
  const TensorRef* emb = ckpt_.store().find(spec_.embed_tokens);
  if (emb == nullptr) fail("{}: tensor '{}' is missing", ckpt_.path().string(), spec_.embed_tokens);
  if (emb->info->rank() != 2 || emb->info->shape[1] != spec_.hidden_size ||
      emb->info->shape[0] < spec_.vocab_size) {
    fail("{}: tensor '{}' is not [>= vocab_size {}, hidden_size {}]", ckpt_.path().string(),
         spec_.embed_tokens, spec_.vocab_size, spec_.hidden_size);
  }
  auto e = std::make_unique<CudaEmbedding>();
  e->dtype = cuda_dtype(emb->info->dtype, spec_.embed_tokens);
  const auto bytes = emb->bytes();
  e->table = DeviceBuffer(bytes.data(), bytes.size(), spec_.embed_tokens);
  if (spec_.scale_embedding) e->scale = model::embedding_scale(spec_, emb->info->dtype);
  weight_bytes_ += bytes.size();
  return e;
}

ModulePtr CudaBackend::load_norm(const std::string& tensor, int64_t width,
                                 std::optional<double> eps) {
  auto n = std::make_unique<CudaNorm>();
  n->eps = static_cast<float>(eps.value_or(spec_.rms_norm_eps));
  n->weight = DeviceBuffer::upload(norm_weight(tensor, width), tensor);
  return n;
}

std::vector<float> CudaBackend::norm_weight(const std::string& tensor, int64_t width) const {
  return load_norm_vector(ckpt_.store(), tensor, width, spec_.norm_unit_offset);
}

// A whole linear with its MXFP8 overlay decision from the plan the CPU engine builds, so both
// engines overlay the same linears (dense and shared-expert MLPs, attention; lm_head is kept).
GpuLinear CudaBackend::whole_linear(const std::string& prefix, int64_t in, int64_t out) {
  OverlayDecision d = overlay_plan_.decision(prefix);
  if (!opts_.overlay.any()) d.reason.clear();  // nothing to report as "kept" without a policy
  return GpuLinear::load(*ctx_, ckpt_, prefix, in, out, opts_.capacity, false, d, &overlay_report_,
                         opts_.mxfp8, opts_.linear);
}

ModulePtr CudaBackend::load_linear(const model::LinearSource& src) {
  auto l = std::make_unique<CudaLinear>();
  if (src.slice == nullptr) {
    l->linear = whole_linear(src.prefix, src.in, src.out);
  } else {
    // This rank's slice (`out_count` columns from `out_offset`); an unquantized slice goes up in
    // its checkpoint tensor's dtype.
    const model::TpLinearPlan& p = *src.slice;
    const int64_t out = src.out_count >= 0 ? src.out_count
                        : p.split == model::TpSplit::kColumn
                            ? p.ranks[static_cast<size_t>(src.rank)].count
                            : p.out;
    const TensorRef* ref = ckpt_.store().find(p.prefix + ".weight");
    l->linear = GpuLinear::from_rank(
        *ctx_, RankLinear::slice(ckpt_, p, src.rank), p.prefix, src.out_offset, out, opts_.capacity,
        ref != nullptr ? ref->info->dtype : exl3::DType::kF32, opts_.linear);
  }
  track(l->linear);
  return l;
}

ModulePtr CudaBackend::load_tied_head(Extent vocab) {
  auto l = std::make_unique<CudaLinear>();
  const bool whole = vocab.begin == 0 && vocab.count == spec_.vocab_size && opts_.plan == nullptr;
  l->linear =
      whole ? GpuLinear::dense(*ctx_, ckpt_.store(), spec_.embed_tokens, {}, opts_.capacity, false)
            : GpuLinear::dense(*ctx_, ckpt_.store(), spec_.embed_tokens, {}, opts_.capacity, false,
                               vocab);
  track(l->linear);
  return l;
}

ModulePtr CudaBackend::load_gqa(const GqaAttentionSpec& s, Extent hq, Extent hk, int cache_layer) {
  (void)cache_layer;  // layers own their cache buffers, in load order
  if (!cuda::attention_supports_head_dim(static_cast<int>(s.head_dim))) {
    fail(
        "{}: {} has head_dim {}; the CUDA attention kernels are built for 64 and 128 (hint: "
        "--device cpu)",
        spec_.label, s.prefix, s.head_dim);
  }
  if (s.sliding_window < 0 || s.sliding_window > INT32_MAX) {
    fail("{}: {} has a sliding window of {} positions; expected 0 (none) up to {}", spec_.label,
         s.prefix, s.sliding_window, INT32_MAX);
  }
  auto a = std::make_unique<Gqa>();
  a->spec = s;
  if (hq.count != s.num_heads || hk.count != s.num_kv_heads) {
    // This rank's heads: local q heads [b, b + nh) read local kv heads [kb, kb + nkv). The
    // kernels map local q head i to kv head i / (nh / nkv), which must be the head GQA assigns.
    const int64_t qpk = s.num_heads / s.num_kv_heads;
    bool maps = hq.count > 0 && hk.count > 0 && hq.count % hk.count == 0;
    for (int64_t i = 0; maps && i < hq.count; ++i)
      maps = (hq.begin + i) / qpk - hk.begin == i / (hq.count / hk.count);
    if (!maps) {
      fail(
          "{}: at TP {} rank {} holds q heads [{}, {}) and kv heads [{}, {}), a grouping the "
          "CUDA attention kernels cannot run (each rank needs whole GQA groups, or a part of "
          "one); hint: a TP that divides the {} kv heads, or a multiple of them that divides "
          "the {} q heads, or --device cpu",
          s.prefix, tp_size(), opts_.rank, hq.begin, hq.end(), hk.begin, hk.end(), s.num_kv_heads,
          s.num_heads);
    }
    a->spec.num_heads = hq.count;
    a->spec.num_kv_heads = hk.count;
  }
  if (s.qk_norm == model::QkNorm::kPerHead) {
    a->q_norm =
        DeviceBuffer::upload(norm_weight(s.prefix + ".q_norm.weight", s.head_dim), "q_norm");
    a->k_norm =
        DeviceBuffer::upload(norm_weight(s.prefix + ".k_norm.weight", s.head_dim), "k_norm");
  }
  if (s.sinks) {  // this rank's heads' sink logits
    const std::vector<float> all = load_vector(ckpt_.store(), s.prefix + ".sinks", s.num_heads);
    a->sinks = DeviceBuffer::upload(
        std::vector<float>(all.begin() + hq.begin, all.begin() + hq.end()), "attention sinks");
  }
  a->rope = rope_table(s.rope);
  cache_layers_.push_back({a.get(), nullptr});
  return a;
}

ModulePtr CudaBackend::load_moe(const MoeSpec& s, int layer, const model::TpMoePlan* p, int rank) {
  const moe::MoeLayout* layout = opts_.moe_layout;
  if (layout == nullptr) {
    fail(
        "{}: config.json describes a MoE model but the checkpoint has no EXL3 experts; the CUDA "
        "engine runs quantized experts only (hint: quantize the model with `exl3 quantize`, or "
        "use --device cpu)",
        ckpt_.path().string());
  }
  moe::check_expert_naming(*layout, s.block, s.expert_proj, spec_.label);
  if (!layout->has_layer(layer)) {
    fail("{}: config.json makes layer {} a MoE layer, but the checkpoint has no experts for it",
         ckpt_.path().string(), layer);
  }
  auto m = std::make_unique<CudaMoe>();
  const auto& store = ckpt_.store();
  const std::string router = s.prefix + "." + s.router_name;
  if (s.router_bias) {  // the bias joins the logits in the routing kernels
    m->router = GpuLinear::dense(*ctx_, store, router + ".weight", {}, opts_.capacity, true);
    m->router_bias =
        DeviceBuffer::upload(load_vector(store, router + ".bias", s.num_experts), "router bias");
    m->params.logit_bias = m->router_bias.as<float>();
  } else {
    m->router =
        GpuLinear::load(*ctx_, ckpt_, router, spec_.hidden_size, s.num_experts, opts_.capacity,
                        /*fp32=*/true, {}, nullptr, opts_.mxfp8, opts_.linear);
  }
  track(m->router);
  m->route_counter = DeviceBuffer(4, "the router's decode counter");
  EXL3_CUDA_CHECK(cudaMemset(m->route_counter.get(), 0, 4), "zeroing the router's counter");
  m->params.num_experts = static_cast<int>(s.num_experts);
  m->params.top_k = s.top_k;
  m->params.renormalize = s.renormalize;
  m->params.sigmoid_grouped = s.router == RouterKind::kSigmoidGrouped;
  m->params.n_group = s.n_group;
  m->params.topk_group = s.topk_group;
  m->params.routed_scaling_factor = static_cast<float>(s.routed_scaling_factor);
  if (s.num_experts > 1024 || s.top_k > 32 || s.n_group > 32) {
    fail(
        "{}: {}: the GPU router handles up to 1024 experts, top-k 32 and 32 groups (this "
        "layer: {}, {}, {})",
        spec_.label, s.prefix, s.num_experts, s.top_k, s.n_group);
  }
  if (s.correction_bias) {
    m->bias = DeviceBuffer::upload(
        load_vector(store, s.prefix + "." + s.correction_bias_name, s.num_experts),
        "e_score_correction_bias");
    m->params.correction_bias = m->bias.as<float>();
  }
  const int experts = static_cast<int>(s.num_experts);
  moe::MoeLayerWeights w;
  cuda::MoeExpertExtras extras;
  int64_t inter = s.intermediate;
  const int64_t hidden = spec_.hidden_size;
  // Stored widths: the config's, or (experts converted as padded linears: gpt-oss) the next
  // multiple of 128.
  bool widths_ok = false;
  if (!s.plain_experts()) {  // gpt-oss: biased experts, stored as (maybe padded) EXL3 linears
    if (p != nullptr) {
      fail(
          "{}: {}: tensor parallelism of biased or clamped-SwiGLU experts is not built on the "
          "CUDA engine (hint: run without --tp, or --device cpu)",
          spec_.label, s.prefix);
    }
    w = moe::load_moe_layer(store, *layout, layer, 0, 1, experts, s.expert_bias);
    const auto fits = [](int64_t stored, int64_t real) {
      return stored == real || stored == (real + 127) / 128 * 128;
    };
    widths_ok = fits(w.hidden, hidden) && fits(w.intermediate, inter);
    if (widths_ok) extras = expert_extras(store, s, hidden, w.intermediate);
  } else if (p == nullptr) {
    w = moe::load_moe_layer(store, *layout, layer, 0, 1, experts);
  } else {
    // Rank-sliced checkpoints: only this rank's `.rank{r}` tensors; plain ones: cut here.
    const Extent ext = p->ranks[static_cast<size_t>(rank)];
    if (ext.empty()) {
      fail(
          "{}: MoE layer {} has no intermediate channels for rank {} at TP {}; hint: use a "
          "smaller --tp",
          ckpt_.path().string(), layer, rank, tp_size());
    }
    inter = ext.count;
    w = p->rank_sliced ? moe::load_moe_layer(store, *layout, layer, rank, tp_size(), experts)
                       : slice_moe_layer(moe::load_moe_layer(store, *layout, layer, 0, 1, experts),
                                         ext, rank, tp_size());
  }
  if (!widths_ok && (w.hidden != hidden || w.intermediate != inter)) {
    fail(
        "{}: MoE layer {} experts are {} -> {}, expected {} -> {} (config.json's hidden_size "
        "and moe_intermediate_size{}{})",
        ckpt_.path().string(), layer, w.hidden, w.intermediate, hidden, inter,
        p ? fmt::format(", rank {} of TP {}", rank, tp_size()) : "",
        s.plain_experts() ? "" : ", or those padded to a multiple of 128");
  }
  if (w.hidden != hidden) {  // padded rows in and out (CudaBackend::moe)
    m->padded_hidden = w.hidden;
    widest_pad_in_ = std::max(widest_pad_in_, w.hidden);
    widest_pad_out_ = std::max(widest_pad_out_, w.hidden);
  }
  cuda::MoeOptions mo = opts_.moe;
  mo.capacity = opts_.capacity;
  m->layer = std::make_unique<cuda::MoeLayerCuda>(w, s.top_k, mo, extras);
  weight_bytes_ += m->layer->device_bytes();
  ws_bytes_ = std::max(ws_bytes_, m->layer->arena_bytes());
  widest_experts_ = std::max<int64_t>(widest_experts_, s.num_experts);
  widest_topk_ = std::max<int64_t>(widest_topk_, s.top_k);
  return m;
}

void CudaBackend::reserve(model::Slot slot, int64_t width) {
  auto& w = widths_[static_cast<size_t>(slot)];
  w = std::max(w, width);
}

void CudaBackend::track(const GpuLinear& l) {
  weight_bytes_ += l.device_bytes();
  ws_bytes_ = std::max(ws_bytes_, l.workspace_bytes());
  if (l.stored_in() != l.in()) widest_pad_in_ = std::max(widest_pad_in_, l.stored_in());
  if (l.stored_out() != l.out()) widest_pad_out_ = std::max(widest_pad_out_, l.stored_out());
}

// cos/sin tables [max_seq_tokens, 2, half] per distinct RoPE (every layer shares one in the
// supported architectures).
int CudaBackend::rope_table(const RopeSpec& r) {
  const model::RopeTable table(r);
  for (size_t i = 0; i < ropes_.size(); ++i) {
    if (ropes_[i].inv_freq == table.inv_freq() && ropes_[i].factor == r.attention_factor)
      return static_cast<int>(i);
  }
  const int64_t half = table.half(), positions = opts_.max_seq_tokens;
  std::vector<float> cs(static_cast<size_t>(positions * 2 * half));
  for (int64_t p = 0; p < positions; ++p) {
    table.at(p, cs.data() + p * 2 * half, cs.data() + p * 2 * half + half);
  }
  ropes_.push_back(
      {table.inv_freq(), r.attention_factor, DeviceBuffer::upload(cs, "the RoPE table")});
  return static_cast<int>(ropes_.size() - 1);
}

const float* CudaBackend::rope_cs(int table) const {
  return ropes_[static_cast<size_t>(table)].table.as<float>();
}

std::vector<KvLayerShape> CudaBackend::kv_shapes() const {
  std::vector<KvLayerShape> kv;
  for (const CacheLayer& c : cache_layers_) {
    if (c.mla != nullptr) {
      kv.push_back(mla_kv_shape(*c.mla));
      continue;
    }
    if (c.delta != nullptr) {  // nothing per token
      kv.push_back({0, 0});
      continue;
    }
    const int64_t w = c.gqa->spec.num_kv_heads * c.gqa->spec.head_dim;
    kv.push_back({w, w});
  }
  return kv;
}

void CudaBackend::allocate(int64_t pages, int64_t page_size, int64_t max_pages,
                           const Module& head) {
  head_out_ = static_cast<const CudaLinear&>(head).linear.out();
  page_size_ = page_size;
  max_pages_ = max_pages;
  for (const CacheLayer& c : cache_layers_) {
    Gqa* a = c.gqa;
    if (a == nullptr) continue;
    const int64_t slots = pages * page_size, width = a->spec.num_kv_heads * a->spec.head_dim;
    const cpu::KvFormat f = opts_.kv_format;
    const auto bytes = static_cast<size_t>(
        slots * (cpu::kv_quantized(f) ? cpu::kv_code_bytes(f, width) : width * 2));
    a->kcache = DeviceBuffer(bytes, "the KV cache");
    a->vcache = DeviceBuffer(bytes, "the KV cache");
    kv_bytes_ += 2 * bytes;
    if (cpu::kv_quantized(f)) {
      const auto scale_bytes = static_cast<size_t>(slots * (width / cpu::kKvGroup) * 2);
      a->kscales = DeviceBuffer(scale_bytes, "the KV cache scales");
      a->vscales = DeviceBuffer(scale_bytes, "the KV cache scales");
      kv_bytes_ += 2 * scale_bytes;
    }
  }
  allocate_mla(pages * page_size, max_pages, page_size);
  const int64_t cap = opts_.capacity;
  const auto f = [&](int64_t width, const char* what) {
    return DeviceBuffer(static_cast<size_t>(cap * std::max<int64_t>(width, 1)) * 4, what);
  };
  for (size_t s = 0; s < static_cast<size_t>(model::Slot::kCount); ++s) {
    if (widths_[s] > 0) slots_[s] = f(widths_[s], "activations");
  }
  router_ = f(widest_experts_, "router logits");
  ids_ = f(widest_topk_, "routes");
  wts_ = f(widest_topk_, "routes");
  if (opts_.plan != nullptr) {
    for (const Extent& e : opts_.plan->vocab) rank_vocab_ = std::max(rank_vocab_, e.count);
    logits_local_ = f(rank_vocab_, "logits");
    logits_ = DeviceBuffer(static_cast<size_t>(tp_size() * cap * rank_vocab_) * 4, "logits");
    logits_width_ = tp_size() * rank_vocab_;
  } else {
    logits_ = f(head_out_, "logits");
    logits_width_ = head_out_;
  }
  if (widest_pad_in_ > 0) pad_in_ = f(widest_pad_in_, "padding");
  if (widest_pad_out_ > 0) pad_out_ = f(widest_pad_out_, "padding");
  ws_ = DeviceBuffer(ws_bytes_, "the workspace");
  size_t attn_bytes = 0;
  const cuda::PagedKv kv_shape{nullptr, nullptr, nullptr, static_cast<int32_t>(max_pages),
                               static_cast<int32_t>(page_size)};
  for (const CacheLayer& c : cache_layers_) {
    if (c.gqa == nullptr) continue;
    attn_bytes = std::max(attn_bytes, cuda::attention_decode_workspace_bytes(
                                          std::min(cap, cuda::kAttentionSplitMaxTokens),
                                          attn_shape(c.gqa->spec), kv_shape));
  }
  attn_ws_ = DeviceBuffer(attn_bytes, "the decode attention workspace");
  if (attn_bytes > 0) {
    EXL3_CUDA_CHECK(cudaMemset(attn_ws_.get(), 0, attn_bytes), "zeroing the attention workspace");
  }
  allocate_delta_net();
  meta_capacity_ = 10 * cap + cap * max_pages;  // the largest MetaLayout::total()
  meta_ = DeviceBuffer(static_cast<size_t>(meta_capacity_) * 4, "step metadata");
  pads_ = {pad_in_.as<float>(), pad_out_.as<float>()};
}

// ---- run ---------------------------------------------------------------------------------------

Act CudaBackend::act(model::Slot slot, int64_t width) {
  const auto s = static_cast<size_t>(slot);
  if (width > widths_[s]) {
    fail("CUDA backend: an activation of width {} in a slot sized for {}", width, widths_[s]);
  }
  return {slots_[s].as<float>(), ml_.n, width};
}

void CudaBackend::embed(const Module& embedding, Act x) {
  const auto scope = op_scope("embed");
  const auto& e = static_cast<const CudaEmbedding&>(embedding);
  EXL3_CUDA_CHECK(cuda::embed_rows(e.table.get(), e.dtype, x.width, meta() + ml_.ids(), x.rows,
                                   x.data, stream_, e.scale),
                  "embedding");
}

void CudaBackend::add_rms_norm(Act x, const Act* residual, const Module& norm, Act out) {
  const auto scope = op_scope("norm");
  EXL3_CUDA_CHECK(
      cuda::add_rms_norm(x.data, residual ? residual->data : nullptr,
                         static_cast<const CudaNorm&>(norm).weight.as<float>(), nullptr, x.rows,
                         x.width, static_cast<const CudaNorm&>(norm).eps, out.data, stream_),
      "norm");
}

void CudaBackend::linears(std::span<const Module* const> linears, Act x, std::span<const Act> ys) {
  const auto scope = op_scope("linear");
  std::vector<const GpuLinear*> ls;
  std::vector<float*> outs;
  for (size_t i = 0; i < linears.size(); ++i) {
    ls.push_back(&static_cast<const CudaLinear*>(linears[i])->linear);
    outs.push_back(ys[i].data);
  }
  GpuLinear::run_group(ls, x.data, outs, x.rows, ws_.get(), ws_.bytes(), pads_, stream_);
}

void CudaBackend::reserve_group(std::span<const Module* const> linears) {
  std::vector<const GpuLinear*> ls;
  for (const Module* m : linears) ls.push_back(&static_cast<const CudaLinear*>(m)->linear);
  ws_bytes_ = std::max(ws_bytes_, GpuLinear::group_workspace_bytes(ls));
}

void CudaBackend::attention(const Module& attn, Act q, Act k, Act v, Act out) {
  const auto scope = op_scope("attention");
  const auto& a = static_cast<const Gqa&>(attn);
  const auto& s = a.spec;
  const cuda::TokenMeta tm{meta() + ml_.pos(), meta() + ml_.seq_row()};
  cuda::PagedKv kv{nullptr, nullptr, meta() + ml_.page_tables(), static_cast<int32_t>(max_pages_),
                   static_cast<int32_t>(page_size_)};
  kv.format = opts_.kv_format;
  if (cpu::kv_quantized(kv.format)) {
    kv.kq = a.kcache.as<uint8_t>();
    kv.vq = a.vcache.as<uint8_t>();
    kv.ks = a.kscales.as<uint16_t>();
    kv.vs = a.vscales.as<uint16_t>();
  } else {
    kv.k = a.kcache.as<uint16_t>();
    kv.v = a.vcache.as<uint16_t>();
  }
  cuda::AttnShape shape = attn_shape(s);
  shape.sinks = a.sinks.as<float>();
  EXL3_CUDA_CHECK(
      cuda::qk_norm_rope_store(q.data, k.data, v.data, a.q_norm.as<float>(), a.k_norm.as<float>(),
                               static_cast<float>(spec_.rms_norm_eps), rope_cs(a.rope), tm, q.rows,
                               shape, kv, stream_),
      "rope");
  const auto scale = static_cast<float>(s.scale);
  EXL3_CUDA_CHECK(
      cuda::attention_decode(q.data, meta() + ml_.decode_list(), ml_.decode, tm, shape, scale, kv,
                             attn_ws_.get(), attn_ws_.bytes(), out.data, stream_),
      "attention (decode)");
  EXL3_CUDA_CHECK(
      cuda::attention_prefill(q.data, meta() + ml_.tile_first(), meta() + ml_.tile_len(), ml_.tiles,
                              tm, shape, scale, kv, out.data, stream_),
      "attention (prefill)");
}

void CudaBackend::glu(Act gate, Act up, model::Activation act) {
  const auto scope = op_scope("glu");
  if (act == model::Activation::kGeluTanh) {
    EXL3_CUDA_CHECK(cuda::gelu_tanh_mul(gate.data, up.data, gate.rows * gate.width, stream_),
                    "GeGLU");
    return;
  }
  if (act != model::Activation::kSilu) fail("CUDA backend: only SwiGLU and GeGLU MLPs are built");
  EXL3_CUDA_CHECK(cuda::silu_mul(gate.data, up.data, gate.rows * gate.width, stream_), "SiLU");
}

void CudaBackend::moe(const Module& moe, Act x, Act out) {
  const auto scope = op_scope("moe");
  const auto& m = static_cast<const CudaMoe&>(moe);
  float* logits = router_.as<float>();
  auto* ids = ids_.as<int32_t>();
  auto* wts = wts_.as<float>();
  const float* w = m.router.fp32_matrix();
  if (w != nullptr && x.rows <= cuda::kRouteDecodeMaxTokens && x.width % 4 == 0) {
    EXL3_CUDA_CHECK(cuda::route_decode(x.data, w, x.rows, x.width, m.params, logits,
                                       m.route_counter.as<int32_t>(), ids, wts, stream_),
                    "routing (decode)");
  } else {
    m.router.run(x.data, logits, x.rows, ws_.get(), ws_.bytes(), pads_, stream_);
    EXL3_CUDA_CHECK(cuda::route_topk(logits, x.rows, m.params, ids, wts, stream_), "routing");
  }
  if (m.padded_hidden == 0) {
    EXL3_CUDA_CHECK(m.layer->run(x.data, DType::kF32, ids, wts, out.data, x.rows, ws_.get(),
                                 ws_.bytes(), stream_),
                    "MoE layer");
    return;
  }
  // Padded experts: zero-padded rows in, the real columns out (as a padded GpuLinear does).
  const auto row = static_cast<size_t>(x.width) * 4,
             padded = static_cast<size_t>(m.padded_hidden) * 4;
  const auto rows = static_cast<size_t>(x.rows);
  EXL3_CUDA_CHECK(cudaMemsetAsync(pads_.in, 0, rows * padded, stream_), "MoE layer (pad)");
  EXL3_CUDA_CHECK(cudaMemcpy2DAsync(pads_.in, padded, x.data, row, row, rows,
                                    cudaMemcpyDeviceToDevice, stream_),
                  "MoE layer (pad)");
  EXL3_CUDA_CHECK(m.layer->run(pads_.in, DType::kF32, ids, wts, pads_.out, x.rows, ws_.get(),
                               ws_.bytes(), stream_),
                  "MoE layer");
  EXL3_CUDA_CHECK(cudaMemcpy2DAsync(out.data, row, pads_.out, padded, row, rows,
                                    cudaMemcpyDeviceToDevice, stream_),
                  "MoE layer (cut)");
}

void CudaBackend::add(Act y, Act x) {
  const auto scope = op_scope("add");
  EXL3_CUDA_CHECK(cuda::add_inplace(y.data, x.data, y.rows * y.width, stream_), "residual add");
}

void CudaBackend::all_reduce([[maybe_unused]] Act y, [[maybe_unused]] const char* what) {
  const auto scope = op_scope("all_reduce");
#if defined(EXL3_HAVE_NCCL)
  if (opts_.comm == nullptr) return;
  const std::string err =
      opts_.comm->all_reduce_sum_device(y.data, static_cast<size_t>(y.rows * y.width), stream_);
  if (!err.empty()) fail("tensor parallel rank {}: {}: {}", opts_.rank, what, err);
#endif
}

void CudaBackend::logits(Act x, const Act* residual, const Module& norm, const Module& head) {
  const auto scope = op_scope("head");
  if (ml_.rows == 0) return;
  const Act h = act(model::Slot::kH, x.width);
  EXL3_CUDA_CHECK(cuda::add_rms_norm(x.data, residual ? residual->data : nullptr,
                                     static_cast<const CudaNorm&>(norm).weight.as<float>(),
                                     meta() + ml_.row_index(), ml_.rows, x.width,
                                     static_cast<const CudaNorm&>(norm).eps, h.data, stream_),
                  "final norm");
  const GpuLinear& l = static_cast<const CudaLinear&>(head).linear;
  const auto cap = static_cast<float>(spec_.final_logit_softcapping);
  if (opts_.plan == nullptr) {
    l.run(h.data, logits_.as<float>(), ml_.rows, ws_.get(), ws_.bytes(), pads_, stream_);
    if (cap > 0.0f) {
      EXL3_CUDA_CHECK(cuda::softcap(logits_.as<float>(), ml_.rows * head_out_, cap, stream_),
                      "logit soft-capping");
    }
    return;
  }
#if defined(EXL3_HAVE_NCCL)
  // Each rank's [rows, its vocabulary] block, gathered as [tp, rows, widest rank vocabulary].
  l.run(h.data, logits_local_.as<float>(), ml_.rows, ws_.get(), ws_.bytes(), pads_, stream_);
  if (cap > 0.0f) {
    EXL3_CUDA_CHECK(cuda::softcap(logits_local_.as<float>(), ml_.rows * rank_vocab_, cap, stream_),
                    "logit soft-capping");
  }
  const std::string err =
      opts_.comm->all_gather_device(logits_local_.as<float>(), logits_.as<float>(),
                                    static_cast<size_t>(ml_.rows * rank_vocab_), stream_);
  if (!err.empty()) fail("tensor parallel rank {}: logits: {}", opts_.rank, err);
#endif
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
