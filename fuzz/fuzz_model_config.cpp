// libFuzzer target: config.json bytes -> parse_model_config -> describe_model (every family's
// reader) -> the tensor-parallel plan at TP 1..8 and the JSON summaries. Each step must succeed or
// throw exl3::Error; a description must have the layer count config.json asked for, and a plan's
// head and vocabulary extents must partition what they cut.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/model/tp_plan.hpp"

namespace {

void check_partition(const std::vector<exl3::model::Extent>& ranks, int64_t total) {
  int64_t next = 0;
  for (const auto& e : ranks) {
    if (e.count < 0 || (e.count > 0 && e.begin != next)) std::abort();
    if (e.count > 0) next = e.end();
  }
  if (next != total) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string label = "fuzz/config.json";
  exl3::model::ModelSpec spec;
  try {
    const exl3::ModelConfig cfg = exl3::parse_model_config(text, label);
    if (cfg.num_hidden_layers > 512) return 0;  // keep each input cheap
    spec = exl3::model::describe_model(cfg, label);
    if (spec.num_layers() != cfg.num_hidden_layers) std::abort();
  } catch (const exl3::Error&) {
    return 0;
  }
  (void)exl3::model::spec_summary(spec).dump();
  for (int tp = 1; tp <= 8; ++tp) {
    try {
      const auto plan = exl3::model::plan_tensor_parallel(spec, tp, {});
      check_partition(plan.vocab, spec.vocab_size);
      if (plan.layers.size() != spec.layers.size()) std::abort();
      for (size_t i = 0; i < plan.layers.size(); ++i) {
        const auto& attention = spec.layers[i].attention;
        if (const auto* m = std::get_if<exl3::model::MlaAttentionSpec>(&attention)) {
          if (!plan.layers[i].mla) std::abort();
          check_partition(plan.layers[i].mla->heads, m->num_heads);
        } else {
          check_partition(plan.layers[i].attention.q_heads,
                          std::get<exl3::model::GqaAttentionSpec>(attention).num_heads);
        }
      }
      (void)exl3::model::tp_plan_summary(plan).dump();
    } catch (const exl3::Error&) {
    }
  }
  return 0;
}
