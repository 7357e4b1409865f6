// The op layer's optional ops (exl3/model/ops.hpp): a backend that lacks one fails naming it, so
// a model needing it is refused at load rather than run wrongly.
#include "exl3/model/ops.hpp"

#include "exl3/error.hpp"

namespace exl3::model {

ModulePtr Backend::load_gated_delta_net(const GatedDeltaNetSpec& spec, int) {
  fail(
      "{}: this backend does not run gated DeltaNet (linear attention) layers; hint: --device "
      "cpu",
      spec.prefix);
}

void Backend::gated_delta_net(const Module&, std::span<const Act>, Act) {
  fail("gated DeltaNet: this backend has no such op");
}

void Backend::split_query_gate(Act, int64_t, Act, Act) {
  fail("attention output gate: this backend has no such op; hint: --device cpu");
}

void Backend::sigmoid_gate(Act, Act) {
  fail("sigmoid gate: this backend has no such op; hint: --device cpu");
}

}  // namespace exl3::model
