// CudaBackend's gated DeltaNet layers (Qwen3-Next, Qwen3.5) and the gates of their hybrid
// stacks (the gated attention's query / gate split and sigmoid output gate, the shared expert's
// gate): loading a layer and running it through exl3/cuda/delta_net.hpp. The CPU backend's
// gated_delta_net (exl3/runtime/delta_net.hpp) is the reference.
//
// Every sequence's state lives in one slot of a pool sized at allocate(); the engine gives each
// run of a step its slot in the step metadata (MetaLayout::run_slot), zeroes a slot when its
// sequence starts, and checks that a step continues the state it holds.
#include "cuda_backend.hpp"

#if defined(EXL3_HAVE_CUDA)

#include <algorithm>
#include <vector>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/delta_net.hpp"
#include "exl3/error.hpp"
#include "exl3/runtime/delta_net.hpp"

namespace exl3::runtime {

using model::Act;
using model::Module;
using model::ModulePtr;

struct CudaBackend::DeltaNet final : Module {
  std::string prefix;
  cuda::DeltaNetShape shape;
  DeviceBuffer conv, a, dt_bias, norm;
  int64_t state_offset = 0;  // floats into a slot of the pool
};

ModulePtr CudaBackend::load_gated_delta_net(const model::GatedDeltaNetSpec& s, int cache_layer) {
  (void)cache_layer;  // in load order, as every cache layer
  if (s.kimi) {
    fail(
        "{}: {} is a Kimi delta attention layer, which the CUDA backend does not run yet (hint: "
        "--device cpu)",
        spec_.label, s.prefix);
  }
  auto d = std::make_unique<DeltaNet>();
  d->prefix = s.prefix;
  cuda::DeltaNetShape& sh = d->shape;
  sh.num_k_heads = static_cast<int>(s.num_k_heads);
  sh.num_v_heads = static_cast<int>(s.num_v_heads);
  sh.head_k_dim = static_cast<int>(s.head_k_dim);
  sh.head_v_dim = static_cast<int>(s.head_v_dim);
  sh.conv_kernel = static_cast<int>(s.conv_kernel);
  sh.norm_eps = static_cast<float>(s.norm_eps);
  sh.split_inputs = s.split_inputs;
  if (!cuda::delta_net_supports(sh)) {
    fail(
        "{}: {} has {} key / {} value heads of {} / {} channels and a {}-tap convolution; the CUDA "
        "DeltaNet kernels need value heads a multiple of key heads, head_v_dim dividing 256, "
        "head_k_dim up to 256 (64 rows per thread) and 1 to 8 taps (hint: --device cpu)",
        spec_.label, s.prefix, s.num_k_heads, s.num_v_heads, s.head_k_dim, s.head_v_dim,
        s.conv_kernel);
  }
  const DeltaNetWeights w = load_delta_net_weights(ckpt_.store(), s);
  d->conv = DeviceBuffer::upload(w.conv, "the DeltaNet convolution");
  d->a = DeviceBuffer::upload(w.a, "the DeltaNet decay");
  d->dt_bias = DeviceBuffer::upload(w.dt_bias, "the DeltaNet dt bias");
  d->norm = DeviceBuffer::upload(w.norm, "the DeltaNet norm");
  weight_bytes_ += (w.conv.size() + w.a.size() + w.dt_bias.size() + w.norm.size()) * 4;
  d->state_offset = dn_slot_floats_;
  dn_slot_floats_ += sh.state_floats();
  dn_widest_conv_ = std::max<int64_t>(dn_widest_conv_, sh.conv_dim());
  cache_layers_.push_back({nullptr, nullptr, d.get()});
  return d;
}

void CudaBackend::allocate_delta_net() {
  if (dn_slot_floats_ == 0) return;
  if (opts_.recurrent_slots <= 0) {
    fail("{}: the engine gave no recurrent-state slots for its gated DeltaNet layers", spec_.label);
  }
  dn_state_ = DeviceBuffer::of<float>(static_cast<size_t>(opts_.recurrent_slots * dn_slot_floats_),
                                      "the DeltaNet state pool");
  dn_conv_ = DeviceBuffer::of<float>(static_cast<size_t>(opts_.capacity * dn_widest_conv_),
                                     "the DeltaNet convolution outputs");
}

void CudaBackend::clear_recurrent_slot(int64_t slot) {
  if (slot < 0 || slot >= opts_.recurrent_slots) {
    fail("CUDA backend: recurrent-state slot {} of {}", slot, opts_.recurrent_slots);
  }
  const auto bytes = static_cast<size_t>(dn_slot_floats_) * 4;
  EXL3_CUDA_CHECK(
      cudaMemsetAsync(dn_state_.as<float>() + slot * dn_slot_floats_, 0, bytes, stream_),
      "clearing a sequence's DeltaNet state");
}

void CudaBackend::copy_recurrent_slot(int64_t from, int64_t to) {
  for (const int64_t slot : {from, to}) {
    if (slot < 0 || slot >= opts_.recurrent_slots) {
      fail("CUDA backend: recurrent-state slot {} of {}", slot, opts_.recurrent_slots);
    }
  }
  if (from == to) return;
  float* pool = dn_state_.as<float>();
  EXL3_CUDA_CHECK(
      cudaMemcpyAsync(pool + to * dn_slot_floats_, pool + from * dn_slot_floats_,
                      static_cast<size_t>(dn_slot_floats_) * 4, cudaMemcpyDeviceToDevice, stream_),
      "copying a sequence's DeltaNet state");
}

void CudaBackend::gated_delta_net(const Module& mixer, std::span<const Act> in, Act out) {
  const auto scope = op_scope("delta_net");
  const auto& d = static_cast<const DeltaNet&>(mixer);
  const size_t want = d.shape.split_inputs ? 4 : 2;
  if (in.size() != want) fail("{}: {} input projections, expected {}", d.prefix, in.size(), want);
  const float* x[4] = {};
  for (size_t i = 0; i < want; ++i) x[i] = in[i].data;
  const int32_t* m = meta();
  const cuda::DeltaNetRuns runs{m + ml_.seq_row(), m + ml_.run_first(), m + ml_.run_len(),
                                m + ml_.run_slot(), static_cast<int>(ml_.seqs)};
  const cuda::DeltaNetStatePool pool{dn_state_.as<float>(), dn_slot_floats_, d.state_offset};
  const cuda::DeltaNetWeightsDev w{d.conv.as<float>(), d.a.as<float>(), d.dt_bias.as<float>(),
                                   d.norm.as<float>()};
  EXL3_CUDA_CHECK(cuda::delta_net_forward(d.shape, w, x, ml_.n, runs, pool, dn_conv_.as<float>(),
                                          out.data, stream_),
                  "running a gated DeltaNet layer");
}

void CudaBackend::split_query_gate(Act qg, int64_t head_dim, Act q, Act gate) {
  const auto scope = op_scope("gate");
  EXL3_CUDA_CHECK(cuda::split_query_gate(qg.data, qg.rows, q.width / head_dim, head_dim, q.data,
                                         gate.data, stream_),
                  "splitting the gated queries");
}

void CudaBackend::sigmoid_gate(Act y, Act gate) {
  const auto scope = op_scope("gate");
  EXL3_CUDA_CHECK(cuda::sigmoid_gate(y.data, gate.data, y.rows, y.width, gate.width, stream_),
                  "applying a sigmoid gate");
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
