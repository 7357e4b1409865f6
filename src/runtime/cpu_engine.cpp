// The CPU reference engine: every module of a ModelSpec on the host, fp32 activations.
//
//   x = embed(tokens)
//   per layer:  x += attention(rms_norm(x)),  x += mlp(rms_norm(x))
//   logits = lm_head(rms_norm(x))
//
// The layers are DecoderLayers (cpu_layer.cpp); MoE layers whose experts the checkpoint's
// exl3::moe layout holds run them as EXL3 views, others load the experts as runtime Linears
// (unquantized HF weights).
#include <algorithm>
#include <optional>
#include <variant>

#include "cpu_engine.hpp"
#include "paged_engine.hpp"
#include "exl3/error.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/runtime/decoder_layer.hpp"
#include "exl3/runtime/cpu_ops.hpp"
#include "exl3/runtime/linear.hpp"
#include "exl3/runtime/overlay.hpp"

namespace exl3::runtime {
namespace {

// ---- the engine ------------------------------------------------------------------------------

class CpuEngine final : public PagedEngine {
 public:
  CpuEngine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts)
      : ckpt_(ckpt),
        spec_(std::move(spec)),
        embed_(DenseMatrix::load(ckpt_.store(), spec_.embed_tokens, 0, spec_.hidden_size)) {
    const int64_t hidden = spec_.hidden_size;
    const auto& store = ckpt_.store();
    if (embed_.rows() < spec_.vocab_size) {
      fail("{}: tensor '{}' has {} rows, fewer than vocab_size {} (config.json)",
           ckpt_.path().string(), spec_.embed_tokens, embed_.rows(), spec_.vocab_size);
    }
    final_norm_ = load_vector(store, spec_.final_norm, hidden);
    // Every linear loads with its MXFP8 overlay decision (none without a policy).
    const OverlayPlan plan = OverlayPlan::build(opts.overlay, ckpt_, spec_);
    const bool overlay = opts.overlay.any();
    const LinearLoadFn load = [&](const std::string& prefix, int64_t in, int64_t out) {
      OverlayDecision d = plan.decision(prefix);
      if (!overlay) d.reason.clear();  // nothing to report as "kept" without a policy
      return Linear::load(ckpt_, prefix, in, out, d, &overlay_report_);
    };
    head_ = spec_.lm_head_tied ? Linear::dense(DenseMatrix::load(store, spec_.embed_tokens, 0, hidden))
                               : load(spec_.lm_head, hidden, spec_.vocab_size);

    // EXL3 experts go through the exl3::moe layout; layers it has no experts for load their
    // routed experts as per-projection Linears (unquantized HF weights).
    std::optional<moe::MoeLayout> layout;
    if (spec_.is_moe()) layout = moe::read_moe_layout(ckpt_);
    std::vector<KvLayerShape> kv;
    LoadProgressReporter progress(opts.load_progress, static_cast<int64_t>(spec_.layers.size()));
    for (const auto& ls : spec_.layers) {
      const bool exl3_experts = layout && layout->has_layer(ls.index);
      layers_.emplace_back(ckpt_, spec_, ls, exl3_experts ? &*layout : nullptr, load);
      kv.push_back(layers_.back().kv_shape());
      progress.layer_done();
    }
    if (opts.page_size <= 0) fail("engine: page size {} must be positive", opts.page_size);
    if (opts.cache_tokens <= 0) fail("engine: cache size {} tokens must be positive", opts.cache_tokens);
    const int64_t pages = (opts.cache_tokens + opts.page_size - 1) / opts.page_size;
    cache_ = std::make_unique<PagedKvCache>(std::move(kv), opts.page_size, pages);
  }

  const ModelSpec& spec() const override { return spec_; }
  OverlayReport overlay_report() const override { return overlay_report_; }
  Device device() const override { return Device::kCpu; }

  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    const BatchEntry entry{seq, tokens, mode};
    validate_batch(*this, std::span<const BatchEntry>(&entry, 1));  // ids, KV room (also for direct calls)
    const auto n = static_cast<int64_t>(tokens.size());
    const int64_t start = cache_->length(seq);
    cache_->reserve(seq, n);
    const int64_t hidden = spec_.hidden_size;
    const auto size = static_cast<size_t>(n * hidden);
    std::vector<float> x(size), h(size);
    for (int64_t t = 0; t < n; ++t) embed_.row(tokens[static_cast<size_t>(t)], x.data() + t * hidden);
    for (size_t l = 0; l < layers_.size(); ++l) {
      layers_[l].forward(x.data(), n, start, *cache_, static_cast<int>(l), seq);
    }
    const double eps = spec_.rms_norm_eps;
    const int64_t rows = mode == LogitsMode::kAll ? n : 1;
    cpu_ops::rms_norm(x.data() + (n - rows) * hidden, final_norm_.data(), rows, hidden, eps, h.data());
    const int64_t out = head_.out_features(), vocab = spec_.vocab_size;
    std::vector<float> logits(static_cast<size_t>(rows * out));
    head_.forward(h.data(), rows, logits.data());
    if (out != vocab) {  // a tied head over a padded embedding
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(logits.data() + r * out, vocab, logits.data() + r * vocab);
      logits.resize(static_cast<size_t>(rows * vocab));
    }
    cache_->advance(seq, n);
    return logits;
  }

 private:
  Checkpoint ckpt_;  // keeps the mapped files alive
  ModelSpec spec_;
  DenseMatrix embed_;
  std::vector<float> final_norm_;
  Linear head_;
  std::vector<DecoderLayer> layers_;
  OverlayReport overlay_report_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const Checkpoint& ckpt, ModelSpec spec,
                                        const EngineOptions& opts) {
  return std::make_unique<CpuEngine>(ckpt, std::move(spec), opts);
}

}  // namespace exl3::runtime
