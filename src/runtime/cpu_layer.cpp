// DecoderLayer (see decoder_layer.hpp): one layer of the model (exl3/model/decoder.hpp) on a
// CpuBackend of its own, for calibration to run layer by layer.
#include "exl3/runtime/decoder_layer.hpp"

#include "cpu_backend.hpp"
#include "exl3/error.hpp"
#include "exl3/model/decoder.hpp"

namespace exl3::runtime {

struct DecoderLayer::Impl {
  LayerSpec spec;
  int64_t hidden = 0;
  std::unique_ptr<CpuBackend> backend;
  model::LayerModules modules;
};

DecoderLayer::DecoderLayer(const Checkpoint& ckpt, const ModelSpec& model, const LayerSpec& ls,
                           const moe::MoeLayout* moe_layout, const LinearLoadFn& load)
    : impl_(std::make_unique<Impl>()) {
  auto& l = *impl_;
  l.spec = ls;
  l.hidden = model.hidden_size;
  CpuBackend::Options bo;
  bo.load = load;
  bo.moe_layout = moe_layout;
  l.backend = std::make_unique<CpuBackend>(ckpt, model, std::move(bo));
  l.modules = model::load_layer(*l.backend, model, ls, 0);
}

DecoderLayer::~DecoderLayer() = default;
DecoderLayer::DecoderLayer(DecoderLayer&&) noexcept = default;
DecoderLayer& DecoderLayer::operator=(DecoderLayer&&) noexcept = default;

const LayerSpec& DecoderLayer::spec() const {
  return impl_->spec;
}
KvLayerShape DecoderLayer::kv_shape() const {
  return impl_->backend->kv_shapes().front();
}

void DecoderLayer::forward_sequence(float* x, int64_t n, LinearObserver* observer,
                                    DsaSelection* dsa) const {
  if (n <= 0) fail("{}: forward over {} tokens", impl_->spec.prefix, n);
  constexpr int64_t kPage = 64;
  PagedKvCache cache({kv_shape()}, kPage, (n + kPage - 1) / kPage);
  const auto seq = cache.add_sequence();
  cache.reserve(seq, n);
  CpuBackend& b = *impl_->backend;
  CpuBackend::Step step;
  step.cache = &cache;
  step.seq = seq;
  step.n = n;
  step.observer = observer;
  b.begin(step);
  const DsaIndexerSpec* indexer = dsa != nullptr ? impl_->spec.dsa_indexer() : nullptr;
  if (indexer != nullptr && indexer->shared) b.set_dsa_selection(*dsa);
  const model::Act xs{x, n, impl_->hidden};
  const model::Act y = model::layer_forward(b, impl_->modules, impl_->hidden, xs, nullptr);
  b.add(xs, y);
  if (indexer != nullptr && !indexer->shared) *dsa = b.dsa_selection();
}

}  // namespace exl3::runtime
