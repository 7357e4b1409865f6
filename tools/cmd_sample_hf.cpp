// `exl3 sample-hf`: write a small synthetic Hugging Face model (the input `exl3 quantize` takes).
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "exl3/error.hpp"
#include "exl3/format/synthetic_hf.hpp"

namespace exl3::cli {

Runner add_sample_hf(CLI::App& app, Common&) {
  struct Opts {
    std::string dir, arch = "qwen3-moe", dtype = "bf16";
    SyntheticHfSpec spec;
  };
  auto o = std::make_shared<Opts>();
  auto& s = o->spec;
  app.add_option("OUT_DIR", o->dir, "Folder to write (config.json, model.safetensors, tokenizer files)")->required();
  app.add_option("--arch", o->arch, "Architecture")
      ->check(CLI::IsMember({"qwen3-moe", "qwen3", "qwen2", "llama", "glm4-moe"}))
      ->capture_default_str();
  app.add_option("--seed", s.seed, "Random seed (the model is a pure function of the options)")->capture_default_str();
  app.add_option("--hidden", s.hidden_size, "Hidden size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--layers", s.num_layers, "Decoder layers")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--heads", s.num_heads, "Attention heads")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--kv-heads", s.num_kv_heads, "Key/value heads")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--head-dim", s.head_dim, "Head dimension")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--intermediate", s.intermediate_size, "Dense MLP width")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--experts", s.num_experts, "Routed experts per MoE layer")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--experts-per-tok", s.experts_per_tok, "Experts per token")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--moe-intermediate", s.moe_intermediate_size, "Expert MLP width")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--shared-experts", s.n_shared_experts, "GLM-4.5 shared experts")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--dense-layers", s.first_k_dense_replace, "GLM-4.5 leading dense layers (first_k_dense_replace)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--vocab", s.vocab_size, "Vocabulary size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--init-std", s.init_std, "Weight scale (std of the Gaussian noise); larger gives peakier next-token distributions")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--tie-embeddings", s.tie_word_embeddings, "Tie lm_head to the embedding (no lm_head.weight)");
  app.add_option("--dtype", o->dtype, "Weight dtype")->check(CLI::IsMember({"bf16", "f16", "f32"}))->capture_default_str();
  app.footer("The weights are seeded Gaussian noise in the architecture's exact Hugging Face layout:\n"
             "input for `exl3 quantize` demos and tests, meaningless for quality.");
  return [o] {
    o->spec.arch = *parse_hf_arch(o->arch);
    o->spec.dtype = o->dtype == "f16" ? DType::kF16 : o->dtype == "f32" ? DType::kF32 : DType::kBF16;
    const auto r = write_synthetic_hf_model(o->dir, o->spec);
    fmt::print("wrote synthetic {} model {} ({} tensors, {} linears, {} bytes of weights)\n", o->arch,
               r.dir.string(), r.num_tensors, r.num_linears, r.bytes);
    return 0;
  };
}

}  // namespace exl3::cli
