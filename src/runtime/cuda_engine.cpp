// The CUDA engine: the model (exl3/model/decoder.hpp) on a CudaBackend, one GPU (or one
// tensor-parallel rank of a CudaTpEngine). The engine owns the step: it cuts a batch into chunks
// of at most max_batch_tokens tokens (every buffer is sized for that once at load), writes each
// chunk's geometry (ids, positions, page tables, attention tiles, head rows) into pinned memory
// and sends it to the device in one copy, runs the decoder, and hands out the logits. The page
// tables live in a PagedKvCache without host storage (the backend keeps K and V on the GPU). A
// step of short runs (decode, speculative verification) depends on the host only through its
// counts, so it is captured as a CUDA graph per shape, then replayed.
#include "cuda_engine.hpp"
#include "cuda_backend.hpp"
#include "paged_engine.hpp"

#if defined(EXL3_HAVE_CUDA)

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <tbb/parallel_for.h>

#include "exl3/cuda/argmax.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/launch.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/model/decoder.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/runtime/nccl_communicator.hpp"

namespace exl3::runtime {
namespace {

using SeqId = PagedKvCache::SeqId;

// Runs of up to this many tokens (a sequence's last token and up to 16 drafts) keep a step
// graphable; longer runs are prefill, whose shapes vary too much to capture.
constexpr int64_t kGraphRunTokens = 17;

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

// What a batch hands back per entry: its logits rows (forward_batch) or only each row's argmax
// id (forward_batch_argmax).
struct Outputs {
  explicit Outputs(size_t entries, bool want_ids) : ids_only(want_ids) {
    if (ids_only) {
      ids.resize(entries);
    } else {
      logits.resize(entries);
    }
  }
  bool ids_only;
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> ids;
};

// One chunk of a batch: runs of consecutive tokens, each from one entry.
struct Run {
  size_t entry = 0;
  SeqId seq = -1;
  size_t first = 0;  // index into the entry's tokens
  size_t len = 0;
  int64_t start = 0;  // position of the first token
  bool want_all = false, want_last = false;
  bool prefill = false;  // part of an entry of more than one token (prefix caching's snapshots)
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
    const int64_t pages = (opts.cache_tokens + opts.page_size - 1) / opts.page_size;
    max_seq_tokens_ = pages * opts.page_size;
    if (spec_.max_position_embeddings > 0)
      max_seq_tokens_ = std::min(max_seq_tokens_, spec_.max_position_embeddings);
    max_pages_ = (max_seq_tokens_ + opts.page_size - 1) / opts.page_size;
    if (spec_.is_moe()) {
      layout_ = moe::read_moe_layout(ckpt_);
      // Plain experts run at any TP (each rank cuts its channels); rank-sliced ones only at theirs.
      if (layout_ && layout_->tp != 1 && layout_->tp != tp_size()) {
        fail("{}: the experts are sliced for TP {}, but the engine runs TP {}; hint: --tp {}",
             ckpt_.path().string(), layout_->tp, tp_size(), layout_->tp);
      }
    }
    CudaBackend::Options bo;
    bo.capacity = cap_;
    bo.max_seq_tokens = max_seq_tokens_;
    bo.moe_layout = layout_ ? &*layout_ : nullptr;
    bo.overlay = opts.overlay;
    bo.moe = opts.moe;
    bo.mxfp8 = opts.mxfp8;
    bo.linear = opts.linear;
    bo.kv_format = opts.kv_format;
    if (spec_.has_recurrent_layers()) {
      if (opts.recurrent_slots <= 0)
        fail("engine: {} recurrent-state slots; at least 1 is needed", opts.recurrent_slots);
      bo.recurrent_slots = opts.recurrent_slots;
      for (int64_t s = opts.recurrent_slots - 1; s >= 0; --s) free_slots_.push_back(s);
      // Prefix caching keeps its snapshots in the same pool, after the sequences' slots (a
      // tensor-parallel rank adopts no prefix, so it keeps none).
      if (opts.prefix_cache && rank == nullptr) {
        snapshots_.emplace(opts.recurrent_snapshots);
        bo.recurrent_slots += opts.recurrent_snapshots;
      }
    }
    if (tp_) {
      bo.plan = tp_->plan;
      bo.rank = tp_->rank;
      bo.comm = tp_->comm;
    }
    backend_ = std::make_unique<CudaBackend>(ckpt_, spec_, std::move(bo));
    stream_ = backend_->stream();
    static const LoadProgressFn kSilent;
    LoadProgressReporter progress(!tp_ || tp_->rank == 0 ? opts_.load_progress : kSilent,
                                  static_cast<int64_t>(spec_.layers.size()));
    const model::RankOf of{tp_ ? tp_->plan : nullptr, tp_ ? tp_->rank : 0};
    modules_ = model::load_decoder(*backend_, spec_, of, [&] { progress.layer_done(); });
    cache_ = std::make_unique<PagedKvCache>(backend_->kv_shapes(), opts.page_size, pages,
                                            /*host_storage=*/false, opts.kv_format);
    if (opts.prefix_cache) cache_->enable_prefix_cache();
    backend_->allocate(pages, opts.page_size, max_pages_, *modules_.head);
    kv_bytes_per_token_ = backend_->kv_bytes() / static_cast<uint64_t>(pages * opts.page_size);
    meta_host_ =
        pinned<int32_t>(static_cast<size_t>(backend_->meta_capacity()), "the step metadata");
    if (!tp_ || tp_->rank == 0) {  // only rank 0 hands logits out
      logits_host_ =
          pinned<float>(static_cast<size_t>(cap_ * backend_->logits_width()), "the logits");
      keys_ = cuda::DeviceBuffer::of<uint64_t>(static_cast<size_t>(cap_), "the greedy ids");
      keys_host_ = pinned<uint64_t>(static_cast<size_t>(cap_), "the greedy ids");
      argmax_layout_ = make_argmax_layout();
    }
  }

  const ModelSpec& spec() const override {
    return spec_;
  }
  Device device() const override {
    return Device::kCuda;
  }
  OverlayReport overlay_report() const override {
    return backend_->overlay_report();
  }
  std::optional<size_t> device_weight_bytes() const override {
    return backend_->weight_bytes();
  }
  std::optional<int64_t> decode_step_kernels(int64_t batch) const override {
    const auto key = CudaBackend::decode_graph_key(batch);
    return key ? backend_->graph_kernels(*key) : std::nullopt;
  }

  void drop_sequence(SeqId seq) override {
    PagedEngine::drop_sequence(seq);
    const auto it = recurrent_.find(seq);
    if (it != recurrent_.end()) {
      free_slots_.push_back(it->second.slot);
      recurrent_.erase(it);
    }
  }

 protected:
  // Snapshot k is pool slot recurrent_slots + k; the copies run on the engine's stream, in
  // order with the steps that write or read either slot.
  void save_recurrent(SeqId seq, int64_t slot) override {
    const auto it = recurrent_.find(seq);
    if (it == recurrent_.end() || it->second.length < 0)
      fail("{}: sequence {} has no recurrent state to keep", spec_.label, seq);
    backend_->copy_recurrent_slot(it->second.slot, opts_.recurrent_slots + slot);
  }
  void restore_recurrent(SeqId seq, int64_t slot, int64_t length) override {
    RecurrentSeq& st = recurrent_state(seq, 0);  // the sequence's slot (taken now if new)
    backend_->copy_recurrent_slot(opts_.recurrent_slots + slot, st.slot);
    st.generation = cache_->generation(seq);
    st.length = length;
  }

 public:
  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    const BatchEntry e{seq, tokens, mode};
    return std::move(forward_batch(std::span<const BatchEntry>(&e, 1)).front());
  }

  std::vector<std::vector<float>> forward_batch(std::span<const BatchEntry> batch) override {
    Outputs out(batch.size(), /*want_ids=*/false);
    run_batch(batch, out);
    return std::move(out.logits);
  }

  std::vector<std::vector<int32_t>> forward_batch_argmax(
      std::span<const BatchEntry> batch) override {
    Outputs out(batch.size(), /*want_ids=*/true);
    run_batch(batch, out);
    return std::move(out.ids);
  }

  std::optional<std::vector<OpTime>> profile_step(std::span<const BatchEntry> batch) override {
    // Eager launches with an event after each op; PDL off so no kernel starts before the
    // event of the op before it (the same bits: only the gaps change).
    const bool pdl = cuda::programmatic_launch();
    cuda::set_programmatic_launch(false);
    profiling_ = true;
    backend_->set_profiling(true);
    const auto restore = [&] {
      backend_->set_profiling(false);
      profiling_ = false;
      cuda::set_programmatic_launch(pdl);
    };
    try {
      Outputs out(batch.size(), /*want_ids=*/true);
      run_batch(batch, out);
      auto times = backend_->take_profile();
      restore();
      return times;
    } catch (...) {
      restore();
      throw;
    }
  }

 private:
  void run_batch(std::span<const BatchEntry> batch, Outputs& out) {
    validate_batch(*this, batch);
    for (const auto& e : batch) {
      const int64_t end = cache_->length(e.seq) + static_cast<int64_t>(e.tokens.size());
      if (end > max_seq_tokens_) {
        fail(
            "forward: sequence {} would hold {} tokens; this engine runs sequences of up to {} "
            "(the KV pool or the model's max_position_embeddings); hint: raise --cache-tokens",
            e.seq, end, max_seq_tokens_);
      }
    }
    // Cut the batch's tokens into chunks of at most cap_ tokens, entry by entry. With prefix
    // caching's recurrent snapshots, a prefill entry crossing a page boundary also ends a chunk
    // at the last one it crosses, where its state is kept.
    std::vector<Run> chunk;
    int64_t in_chunk = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      const auto& e = batch[b];
      const auto n = static_cast<int64_t>(e.tokens.size());
      const auto cut = static_cast<size_t>(run_before_snapshot(cache_->length(e.seq), n));
      size_t done = 0;
      while (done < e.tokens.size()) {
        const size_t len = std::min<size_t>((done < cut ? cut : e.tokens.size()) - done,
                                            static_cast<size_t>(cap_ - in_chunk));
        Run r;
        r.entry = b;
        r.seq = e.seq;
        r.first = done;
        r.len = len;
        r.want_all = e.mode == LogitsMode::kAll;
        r.want_last = e.mode == LogitsMode::kLast && done + len == e.tokens.size();
        r.prefill = n > 1;
        chunk.push_back(r);
        in_chunk += static_cast<int64_t>(len);
        done += len;
        if (in_chunk == cap_ || (done == cut && cut < e.tokens.size())) {
          run_chunk(batch, chunk, out);
          chunk.clear();
          in_chunk = 0;
        }
      }
    }
    if (!chunk.empty()) run_chunk(batch, chunk, out);
  }

  // Where rank q's vocabulary sits in the logits block (exl3/cuda/argmax.hpp).
  cuda::ArgmaxLayout make_argmax_layout() const {
    cuda::ArgmaxLayout l;
    if (!tp_) {
      l.count[0] = static_cast<int32_t>(spec_.vocab_size);
      l.row_stride = backend_->logits_width();
      return l;
    }
    if (tp_size() > cuda::kArgmaxMaxParts)
      fail("tensor parallel: greedy ids on the GPU handle up to {} ranks, not {}",
           cuda::kArgmaxMaxParts, tp_size());
    l.parts = tp_size();
    l.row_stride = backend_->rank_vocab();
    for (int q = 0; q < l.parts; ++q) {
      const Extent e = tp_->plan->vocab[static_cast<size_t>(q)];
      l.begin[q] = static_cast<int32_t>(e.begin);
      l.count[q] = static_cast<int32_t>(e.count);
    }
    return l;
  }

  // ---- one chunk --------------------------------------------------------------------------

  void run_chunk(std::span<const BatchEntry> batch, std::vector<Run>& runs, Outputs& out) {
    MetaLayout ml;
    ml.max_pages = max_pages_;
    ml.seqs = static_cast<int64_t>(runs.size());
    bool small = true;  // every run a decode token or a verify-sized group
    for (auto& r : runs) {
      r.start = cache_->length(r.seq);
      if (r.len == 1 && r.want_all) {  // the same one row either way; one graph shape for both
        r.want_all = false;
        r.want_last = true;
      }
      ml.n += static_cast<int64_t>(r.len);
      if (r.len == 1) {
        ++ml.decode;
      } else {
        ml.tiles += static_cast<int64_t>((r.len + 31) / 32);
      }
      ml.rows += r.want_all ? static_cast<int64_t>(r.len) : (r.want_last ? 1 : 0);
      small = small && static_cast<int64_t>(r.len) <= kGraphRunTokens;
    }
    // Gated DeltaNet layers: each run continues its sequence's state slot (a new one, zeroed, at
    // position 0). Slots are checked before anything is reserved or enqueued.
    std::vector<RecurrentSeq*> states;
    if (backend_->recurrent_slot_floats() > 0) {
      for (const auto& r : runs) states.push_back(&recurrent_state(r.seq, r.start));
    }
    for (const auto& r : runs) cache_->reserve(r.seq, static_cast<int64_t>(r.len));
    for (RecurrentSeq* st : states) {
      if (st->length == 0) backend_->clear_recurrent_slot(st->slot);
      st->length = -1;  // until the step has run: a failed step leaves the state unusable
    }
    int32_t* h = meta_host_.get();
    int64_t t = 0, d = 0, ti = 0, row = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      const auto& tokens = batch[r.entry].tokens;
      h[ml.run_first() + static_cast<int64_t>(i)] = static_cast<int32_t>(t);
      h[ml.run_len() + static_cast<int64_t>(i)] = static_cast<int32_t>(r.len);
      h[ml.run_slot() + static_cast<int64_t>(i)] =
          states.empty() ? 0 : static_cast<int32_t>(states[i]->slot);
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
        cudaMemcpyAsync(backend_->meta(), meta_host_.get(), static_cast<size_t>(ml.total()) * 4,
                        cudaMemcpyHostToDevice, stream_),
        "uploading the step");
    backend_->begin(ml);
    // Decode steps and the small multi-token steps of speculative verification depend on the
    // host only through the counts in `ml`, so each shape is captured once and replayed: eager
    // launches of several hundred kernels cost more than the kernels themselves at these sizes.
    const auto key =
        small && opts_.cuda_graphs && !profiling_ ? CudaBackend::graph_key(ml) : std::nullopt;
    if (key) {
      backend_->run_graph(*key,
                          [&] { model::decoder_forward(*backend_, modules_, spec_.hidden_size); });
    } else {
      model::decoder_forward(*backend_, modules_, spec_.hidden_size);
    }
    const bool returns_logits =
        !tp_ || tp_->rank == 0;  // every rank has them; rank 0 hands them out
    const int64_t width = backend_->logits_width();
    if (ml.rows > 0 && returns_logits && out.ids_only) {
      cuda::ArgmaxLayout l = argmax_layout_;
      l.part_stride = ml.rows * l.row_stride;  // TP: rank q's block of every row comes first
      EXL3_CUDA_CHECK(
          cuda::argmax_rows(backend_->logits_device(), l, ml.rows, keys_.as<uint64_t>(), stream_),
          "picking the greedy ids");
      EXL3_CUDA_CHECK(cudaMemcpyAsync(keys_host_.get(), keys_.get(),
                                      static_cast<size_t>(ml.rows) * sizeof(uint64_t),
                                      cudaMemcpyDeviceToHost, stream_),
                      "reading the greedy ids");
    } else if (ml.rows > 0 && returns_logits) {
      EXL3_CUDA_CHECK(cudaMemcpyAsync(logits_host_.get(), backend_->logits_device(),
                                      static_cast<size_t>(ml.rows * width) * 4,
                                      cudaMemcpyDeviceToHost, stream_),
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
    const int64_t vocab = spec_.vocab_size, rank_vocab = backend_->rank_vocab();
    std::vector<std::pair<float*, int64_t>> rows_out;  // destination, source row
    int64_t r_at = 0;
    for (size_t i = 0; i < states.size(); ++i) {
      states[i]->length = runs[i].start + static_cast<int64_t>(runs[i].len);
    }
    for (const Run& r : runs) {
      cache_->advance(r.seq, batch[r.entry].tokens.subspan(r.first, r.len));
      snapshot_if_due(r.seq, r.start + static_cast<int64_t>(r.len), r.prefill);
      if (!returns_logits) continue;
      const int64_t rows = r.want_all ? static_cast<int64_t>(r.len) : (r.want_last ? 1 : 0);
      if (out.ids_only) {
        for (int64_t i = 0; i < rows; ++i)
          out.ids[r.entry].push_back(cuda::argmax_id(keys_host_.get()[r_at++]));
        continue;
      }
      auto& dst = out.logits[r.entry];
      const size_t at = dst.size();
      dst.resize(at + static_cast<size_t>(rows * vocab));
      for (int64_t i = 0; i < rows; ++i) rows_out.emplace_back(dst.data() + at + i * vocab, r_at++);
    }
    tbb::parallel_for(size_t{0}, rows_out.size(), [&](size_t i) {
      if (!tp_) {
        std::memcpy(rows_out[i].first, logits_host_.get() + rows_out[i].second * width,
                    static_cast<size_t>(vocab) * 4);
        return;
      }
      // Rank q's block holds its vocabulary rows [begin, begin + count) of every row.
      for (int q = 0; q < tp_size(); ++q) {
        const Extent e = tp_->plan->vocab[static_cast<size_t>(q)];
        std::memcpy(rows_out[i].first + e.begin,
                    logits_host_.get() + (q * ml.rows + rows_out[i].second) * rank_vocab,
                    static_cast<size_t>(e.count) * 4);
      }
    });
  }

  int tp_size() const {
    return tp_ ? tp_->plan->tp : 1;
  }

  // A sequence's slot of the DeltaNet state pool: the cache generation and token count its
  // state was computed for (-1 while a step runs on it).
  struct RecurrentSeq {
    int64_t slot = 0;
    uint64_t generation = 0;
    int64_t length = 0;
  };

  // The slot a run of `seq` from position `start` continues: at position 0 the sequence's own
  // slot or a free one, reset (length 0: zeroed before the step); later exactly the state of
  // the tokens before `start` in this cache generation, or an error.
  RecurrentSeq& recurrent_state(SeqId seq, int64_t start) {
    const uint64_t generation = cache_->generation(seq);
    auto it = recurrent_.find(seq);
    if (start == 0) {
      if (it == recurrent_.end()) {
        if (free_slots_.empty()) {
          fail(
              "{}: all {} recurrent-state slots are held by live sequences (each sequence of a "
              "model with gated DeltaNet layers keeps one); hint: drop finished sequences, or "
              "raise EngineOptions::recurrent_slots",
              spec_.label, opts_.recurrent_slots);
        }
        it = recurrent_.emplace(seq, RecurrentSeq{free_slots_.back(), 0, 0}).first;
        free_slots_.pop_back();
      }
      it->second.generation = generation;
      it->second.length = 0;
      return it->second;
    }
    if (it == recurrent_.end() || it->second.generation != generation ||
        it->second.length != start) {
      fail(
          "{}: sequence {} continues at position {}, but its gated DeltaNet state {}; these "
          "layers cannot rewind, and start from cached pages only where the engine kept their "
          "state (hint: speculative decoding is off for such models; restart the sequence from "
          "position 0)",
          spec_.label, seq, start,
          it == recurrent_.end() || it->second.generation != generation
              ? std::string("belongs to other tokens")
          : it->second.length < 0 ? std::string("was lost with a failed step")
                                  : fmt::format("holds {} tokens", it->second.length));
    }
    return it->second;
  }

  Checkpoint ckpt_;
  ModelSpec spec_;
  EngineOptions opts_;
  std::optional<CudaRank> tp_;  // set: one rank of a tensor-parallel group
  std::optional<moe::MoeLayout> layout_;
  int64_t cap_ = 0, max_seq_tokens_ = 0, max_pages_ = 0;
  bool profiling_ = false;  // profile_step: run the step eagerly
  // Declared before the modules (they are its), so destroyed after them.
  std::unique_ptr<CudaBackend> backend_;
  cudaStream_t stream_ = nullptr;  // backend_->stream()
  model::DecoderModules modules_;
  Pinned<int32_t> meta_host_;
  Pinned<float> logits_host_;
  cuda::DeviceBuffer keys_;  // argmax_rows' packed winners, one per logits row
  Pinned<uint64_t> keys_host_;
  cuda::ArgmaxLayout argmax_layout_;
  std::unordered_map<SeqId, RecurrentSeq> recurrent_;  // gated DeltaNet models only
  std::vector<int64_t> free_slots_;
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const Checkpoint& ckpt, ModelSpec spec,
                                         const EngineOptions& opts, const CudaRank* rank) {
  return std::make_unique<CudaEngine>(ckpt, std::move(spec), opts, rank);
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
