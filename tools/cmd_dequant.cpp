#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "exl3/cpu/linear.hpp"
#include "exl3/format/checkpoint.hpp"

namespace exl3::cli {

Runner add_dequant(CLI::App& app, Common&) {
  struct Opts {
    std::string path, prefix, out;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("PATH", o->path, "Checkpoint folder or .safetensors file")->required();
  app.add_option("--prefix,-p", o->prefix, "Tensor prefix of the linear, e.g. model.layers.0.self_attn.q_proj")
      ->required();
  app.add_option("--out,-o", o->out, "Output .safetensors file")->required();
  app.footer(
      "Writes `weight` (F32 [in_features, out_features], original basis, computed in fp64) and\n"
      "`w_hat` (F16 [in_features, out_features], the decoded trellis in the rotated basis, bit-exact\n"
      "with exllamav3's reconstruct). Orientation is input-major: transpose for HF's [out, in].\n"
      "List prefixes with `exl3 inspect PATH`.");
  return [o] {
    const auto ckpt = Checkpoint::open(o->path);
    const auto data = Exl3LinearData::load(ckpt, o->prefix);
    const auto view = cpu::LinearView::of(data);
    const auto w_hat = cpu::reconstruct_w_hat(view);
    const auto weight = cpu::reconstruct_weight(view);
    SafetensorsWriter w;
    const std::vector<int64_t> shape = {view.in_features, view.out_features};
    w.add<float>("weight", DType::kF32, shape, weight);
    w.add<uint16_t>("w_hat", DType::kF16, shape, w_hat);
    w.set_metadata("source", o->path);
    w.set_metadata("prefix", o->prefix);
    w.write(o->out);
    fmt::print("dequantized {} ({}x{}, K={}, {}) -> {}\n", o->prefix, view.in_features, view.out_features,
               view.bits, trellis::codebook_name(view.codebook), o->out);
    return 0;
  };
}

}  // namespace exl3::cli
