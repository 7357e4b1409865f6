#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "exl3/format/synthetic.hpp"

namespace exl3::cli {

Runner add_sample(CLI::App& app, Common&) {
  struct Opts {
    std::string dir;
    SyntheticSpec spec;
    std::string codebook = "mul1";
  };
  auto o = std::make_shared<Opts>();
  app.add_option("OUT_DIR", o->dir, "Folder to write (config.json, model.safetensors, sample_input.safetensors)")
      ->required();
  app.add_option("--hidden", o->spec.hidden_size, "Hidden size (multiple of 128)")->capture_default_str();
  app.add_option("--layers", o->spec.num_layers, "Decoder layers")->capture_default_str();
  app.add_option("--experts", o->spec.num_experts, "Routed experts per layer (0 = dense MLP)")->capture_default_str();
  app.add_option("--bits", o->spec.bits, "Trellis bits per weight K for decoder linears (1..8)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--head-bits", o->spec.head_bits, "K for lm_head (1..8)")->check(CLI::Range(1, 8))->capture_default_str();
  app.add_option("--codebook", o->codebook, "Codebook")->check(CLI::IsMember({"3inst", "mcg", "mul1"}))->capture_default_str();
  app.add_option("--seed", o->spec.seed, "Random seed")->capture_default_str();
  app.footer("The weights are random noise in a valid EXL3 layout: good for demos, tests and speed\n"
             "benchmarks, meaningless for quality.");
  return [o] {
    o->spec.codebook = o->codebook == "mcg" ? trellis::Codebook::kMcg
                       : o->codebook == "3inst" ? trellis::Codebook::k3Inst
                                                : trellis::Codebook::kMul1;
    const auto r = write_synthetic_checkpoint(o->dir, o->spec);
    fmt::print("wrote synthetic EXL3 checkpoint {} ({} EXL3 linears, {} bytes of tensors) and sample input {}\n",
               o->dir, r.num_exl3_linears, r.bytes, r.input_file.string());
    return 0;
  };
}

}  // namespace exl3::cli
