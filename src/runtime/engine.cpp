// load_engine (the device switch), device names and forward_logits (see engine.hpp).
#include "exl3/runtime/engine.hpp"

#include "cpu_engine.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"

namespace exl3::runtime {

std::string_view device_name(Device d) {
  return d == Device::kCuda ? "cuda" : "cpu";
}

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  fail("device '{}' is unknown; choose cpu or cuda", name);
}

std::unique_ptr<Engine> load_engine(const Checkpoint& ckpt, const EngineOptions& opts) {
  ModelSpec spec = describe_model(ckpt);
  if (opts.device == Device::kCuda) {
    fail("device cuda: the CUDA model runtime is not available yet (the EXL3 linear and MoE "
         "kernels are, the model runtime is not); use device cpu");
  }
  return make_cpu_engine(ckpt, std::move(spec), opts);
}

std::unique_ptr<Engine> load_engine(const std::filesystem::path& path, const EngineOptions& opts) {
  return load_engine(Checkpoint::open(path), opts);
}

std::vector<float> forward_logits(Engine& engine, std::span<const int32_t> tokens) {
  const auto seq = engine.new_sequence();
  try {
    auto logits = engine.forward(seq, tokens, LogitsMode::kAll);
    engine.drop_sequence(seq);
    return logits;
  } catch (...) {
    engine.drop_sequence(seq);
    throw;
  }
}

}  // namespace exl3::runtime
