// The CPU reference engine: the model (exl3/model/decoder.hpp) on CpuBackends, fp32 activations.
// At TP 1 one backend holds every weight; at TP N each of N ranks holds its slice (the TpPlan's)
// and runs on its own std::thread, the ranks joined by the in-process communicator (an
// all-reduce after every row-parallel block, an all-gather of the vocab-parallel logits). The
// residual stream is replicated: after each all-reduce every rank holds the same bits, so the
// replicated parts (norms, the MoE router) agree. Threads, not TBB tasks: a rank blocks in
// collectives, and a blocked TBB task could starve the others; each rank's kernels use TBB.
//
// All ranks share one paged KV cache: rank r's attention layers are cache layers
// r * layers .. (r + 1) * layers - 1, so sequences and pages are counted once.
#include "cpu_engine.hpp"

#include <algorithm>
#include <exception>
#include <map>
#include <optional>
#include <thread>

#include "cpu_backend.hpp"
#include "exl3/error.hpp"
#include "exl3/model/decoder.hpp"
#include "exl3/model/tp_plan.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/runtime/communicator.hpp"
#include "exl3/runtime/overlay.hpp"
#include "paged_engine.hpp"

namespace exl3::runtime {
namespace {

class CpuEngine final : public PagedEngine {
 public:
  CpuEngine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts)
      : ckpt_(ckpt), spec_(std::move(spec)) {
    const int tp = opts.tp;
    const bool sliced = tp > 1 || opts.force_tp_engine;
    if (sliced) plan_ = plan_tensor_parallel(spec_, tp, tp_weight_info(ckpt_));
    if (spec_.is_moe()) layout_ = moe::read_moe_layout(ckpt_);
    // Every whole linear loads with its MXFP8 overlay decision (none without a policy).
    overlay_ = OverlayPlan::build(opts.overlay, ckpt_, spec_);
    const bool overlay = opts.overlay.any();
    const LinearLoadFn load = [this, overlay](const std::string& prefix, int64_t in, int64_t out) {
      OverlayDecision d = overlay_.decision(prefix);
      if (!overlay) d.reason.clear();  // nothing to report as "kept" without a policy
      return Linear::load(ckpt_, prefix, in, out, d, &overlay_report_);
    };
    auto embedding = std::make_shared<const DenseMatrix>(
        DenseMatrix::load(ckpt_.store(), spec_.embed_tokens, 0, spec_.hidden_size));
    std::vector<KvLayerShape> kv;
    const int layers = static_cast<int>(spec_.layers.size());
    for (int r = 0; r < tp; ++r) {
      CpuBackend::Options bo;
      bo.load = load;
      bo.moe_layout = layout_ ? &*layout_ : nullptr;
      bo.embedding = embedding;
      bo.first_cache_layer = r * layers;
      if (plan_) bo.vocab = plan_->vocab;
      Rank rk;
      rk.backend = std::make_unique<CpuBackend>(ckpt_, spec_, std::move(bo));
      const model::RankOf of{plan_ ? &*plan_ : nullptr, r};
      const LoadProgressFn& report = r == 0 ? opts.load_progress : silent_;
      LoadProgressReporter progress(report, layers);
      rk.modules = model::load_decoder(*rk.backend, spec_, of, [&] { progress.layer_done(); });
      const auto& shapes = rk.backend->kv_shapes();
      kv.insert(kv.end(), shapes.begin(), shapes.end());
      ranks_.push_back(std::move(rk));
    }
    if (opts.page_size <= 0) fail("engine: page size {} must be positive", opts.page_size);
    if (opts.cache_tokens <= 0)
      fail("engine: cache size {} tokens must be positive", opts.cache_tokens);
    const int64_t pages = (opts.cache_tokens + opts.page_size - 1) / opts.page_size;
    cache_ =
        std::make_unique<PagedKvCache>(std::move(kv), opts.page_size, pages, true, opts.kv_format);
    kv_bytes_per_token_ = cache_->bytes_per_token();
    if (opts.prefix_cache) cache_->enable_prefix_cache();
    if (opts.prefix_cache && spec_.has_recurrent_layers())
      snapshots_.emplace(opts.recurrent_snapshots);
  }

  const ModelSpec& spec() const override { return spec_; }
  OverlayReport overlay_report() const override { return overlay_report_; }
  Device device() const override { return Device::kCpu; }

  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    const BatchEntry entry{seq, tokens, mode};
    validate_batch(*this, std::span<const BatchEntry>(&entry, 1));  // ids, KV room
    const auto n = static_cast<int64_t>(tokens.size());
    const int64_t start = cache_->length(seq);
    // A prefill that crosses a page boundary runs up to the last one first, where its recurrent
    // state is kept for prefix caching (no cut without snapshots).
    const int64_t first = run_before_snapshot(start, n);
    if (first == n) {
      auto logits = forward_run(seq, tokens, mode);
      snapshot_if_due(seq, start + n, n > 1);
      return logits;
    }
    auto logits = forward_run(seq, tokens.first(static_cast<size_t>(first)), mode);
    snapshot_if_due(seq, start + first, true);
    auto rest = forward_run(seq, tokens.subspan(static_cast<size_t>(first)), mode);
    if (mode != LogitsMode::kAll) return rest;
    logits.insert(logits.end(), rest.begin(), rest.end());
    return logits;
  }

  void drop_sequence(SeqId seq) override {
    PagedEngine::drop_sequence(seq);
    hidden_.erase(seq);
    for (Rank& rk : ranks_) rk.backend->forget_sequence(seq);
  }

  void keep_hidden_states(SeqId seq, int64_t from) override {
    (void)cache_->length(seq);  // throws for an unknown sequence
    Kept& k = hidden_[seq];
    k.from = from;
    const int64_t drop = std::clamp<int64_t>(from - k.first, 0, k.count(spec_.hidden_size));
    k.rows.erase(k.rows.begin(),
                 k.rows.begin() + static_cast<std::ptrdiff_t>(drop * spec_.hidden_size));
    k.first = k.rows.empty() ? from : k.first + drop;
  }

  std::span<const float> hidden_state(SeqId seq, int64_t pos) const override {
    const auto it = hidden_.find(seq);
    if (it == hidden_.end() || pos >= cache_->length(seq)) return {};
    const Kept& k = it->second;
    if (pos < k.first || pos >= k.first + k.count(spec_.hidden_size)) return {};
    const auto h = static_cast<size_t>(spec_.hidden_size);
    return std::span<const float>(k.rows).subspan(static_cast<size_t>(pos - k.first) * h, h);
  }

 protected:
  void save_recurrent(SeqId seq, int64_t slot) override {
    for (Rank& rk : ranks_) rk.backend->save_recurrent(seq, slot);
  }
  void restore_recurrent(SeqId seq, int64_t slot, int64_t length) override {
    const uint64_t generation = cache_->generation(seq);
    for (Rank& rk : ranks_) rk.backend->restore_recurrent(seq, slot, generation, length);
  }

 private:
  // forward() of one run (validated): the whole step through every rank.
  std::vector<float> forward_run(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) {
    const auto n = static_cast<int64_t>(tokens.size());
    const int64_t rows = mode == LogitsMode::kAll ? n : 1;
    std::vector<float> logits(static_cast<size_t>(rows * spec_.vocab_size));
    CpuBackend::Step step;
    step.cache = cache_.get();
    step.seq = seq;
    step.start = cache_->length(seq);
    step.n = n;
    step.tokens = tokens;
    step.logit_rows = rows;
    cache_->reserve(seq, n);  // throws (nothing taken) when full
    const auto kept = hidden_.find(seq);
    std::vector<float> hidden;
    if (kept != hidden_.end()) hidden.resize(static_cast<size_t>(n * spec_.hidden_size));
    run_ranks(step, logits.data(), hidden.empty() ? nullptr : hidden.data());
    cache_->advance(seq, tokens);
    if (kept != hidden_.end()) keep_rows(kept->second, step.start, n, hidden);
    return logits;
  }

  struct Rank {
    std::unique_ptr<CpuBackend> backend;
    model::DecoderModules modules;
  };
  // A sequence's kept hidden states: positions first .. first + count - 1, none below `from`.
  struct Kept {
    int64_t from = 0, first = 0;
    std::vector<float> rows;
    int64_t count(int64_t hidden) const { return static_cast<int64_t>(rows.size()) / hidden; }
  };

  // Adds a step's rows (positions start .. start + n - 1) to `k`. Rows at or past `start` are
  // stale: the sequence was cut back to `start` before the step.
  void keep_rows(Kept& k, int64_t start, int64_t n, const std::vector<float>& hidden) const {
    const int64_t h = spec_.hidden_size;
    k.rows.resize(static_cast<size_t>(std::clamp<int64_t>(start - k.first, 0, k.count(h)) * h));
    const int64_t begin = std::max(start, k.from);
    if (begin >= start + n) return;
    if (k.first + k.count(h) != begin) {  // nothing kept right before: the run restarts here
      k.rows.clear();
      k.first = begin;
    }
    k.rows.insert(k.rows.end(), hidden.begin() + (begin - start) * h, hidden.end());
  }

  void run_rank(size_t r, CpuBackend::Step step) {
    Rank& rk = ranks_[r];
    rk.backend->begin(step);
    model::decoder_forward(*rk.backend, rk.modules, spec_.hidden_size);
  }

  // Every rank's forward pass; rank 0 writes the logits (and the hidden states when asked).
  void run_ranks(CpuBackend::Step step, float* logits, float* hidden) {
    const size_t tp = ranks_.size();
    if (!plan_) {
      step.logits = logits;
      step.hidden = hidden;
      run_rank(0, step);
      return;
    }
    auto comms = make_in_process_group(static_cast<int>(tp));
    std::vector<std::exception_ptr> errors(tp);
    auto body = [&](size_t r) {
      try {
        CpuBackend::Step s = step;
        s.comm = comms[r].get();
        s.logits = r == 0 ? logits : nullptr;
        s.hidden = r == 0 ? hidden : nullptr;
        run_rank(r, s);
      } catch (...) {
        errors[r] = std::current_exception();
        comms[r]->abort();
      }
    };
    std::vector<std::thread> threads;
    for (size_t r = 1; r < tp; ++r) threads.emplace_back(body, r);
    body(0);
    for (auto& t : threads) t.join();
    // The first failure is the cause; the others are aborts it triggered.
    for (const auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const Error& err) {
        if (std::string_view(err.what()).find("was aborted") == std::string_view::npos) throw;
      }
    }
    for (const auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }

  Checkpoint ckpt_;  // keeps the mapped files alive
  ModelSpec spec_;
  std::optional<model::TpPlan> plan_;  // tensor parallelism (also at TP 1 when forced)
  std::optional<moe::MoeLayout> layout_;
  OverlayPlan overlay_;
  OverlayReport overlay_report_;
  std::vector<Rank> ranks_;
  std::map<SeqId, Kept> hidden_;  // sequences that keep hidden states (keep_hidden_states)
  static inline const LoadProgressFn silent_{};
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const Checkpoint& ckpt, ModelSpec spec,
                                        const EngineOptions& opts) {
  return std::make_unique<CpuEngine>(ckpt, std::move(spec), opts);
}

}  // namespace exl3::runtime
