// Synthetic checkpoints for the tensor-parallel tests: a small model of any architecture whose
// projections (attention, MLP, experts, shared experts, lm_head) are random EXL3 linears, with
// head_dim 128 and 128-multiple widths so TP 2/3/4 cut only whole Hadamard blocks; and the same
// model with its routed experts stored rank-sliced (`.rank{r}` tensors + hybrid_tr3_tail).
#pragma once

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/format/synthetic.hpp"
#include "exl3/format/synthetic_hf.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/trellis/codebook.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3::runtime::test {

inline bool is_projection(const std::string& name) {
  return name.ends_with("_proj.weight") || name == "lm_head.weight";
}

// The architectures every sliced-vs-unsliced test runs.
struct TpArch {
  const char* name;
  HfArch arch;
};
inline constexpr TpArch kTpArchs[] = {{"llama", HfArch::kLlama},
                                      {"qwen2", HfArch::kQwen2},
                                      {"qwen3", HfArch::kQwen3},
                                      {"qwen3moe", HfArch::kQwen3Moe},
                                      {"glm4moe", HfArch::kGlm4Moe}};

// The synthetic DeepSeek-V3 layer (`exl3 bench model --synthetic deepseek-v3`), shrunk (it cuts at
// TP 2): 4 MLA heads (q LoRA, nope 128 + rope 64, v 128), every projection EXL3 (two
// heads of q_b_proj are 384 outputs, whole 128-channel blocks), kv_b_proj BF16, one dense layer,
// then 4 experts 256 wide with grouped routing and a shared expert.
inline void write_small_deepseek(const std::filesystem::path& dir, uint64_t seed) {
  SyntheticSpec s;
  s.hidden_size = 256;
  s.num_layers = 2;
  s.num_heads = 4;
  s.num_kv_heads = 4;
  s.q_lora_rank = 128;
  s.kv_lora_rank = 128;
  s.qk_nope_head_dim = 128;
  s.qk_rope_head_dim = 64;
  s.v_head_dim = 128;
  s.first_k_dense_replace = 1;
  s.intermediate_size = 512;
  s.num_experts = 4;
  s.experts_per_tok = 2;
  s.moe_intermediate_size = 256;
  s.n_shared_experts = 1;
  s.n_group = 2;
  s.topk_group = 1;
  s.vocab_size = 512;
  s.seed = seed;
  write_synthetic_checkpoint(dir, s);
}

struct TpModelOptions {
  bool quantize = true;  // projections as EXL3 (else left unquantized as written)
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 128;
  int64_t vocab = 512;
};

// Writes the model; every quantized projection gets K = 4 MCG (experts) or MUL1 (the rest).
inline void write_tp_model(const std::filesystem::path& dir, HfArch arch, uint64_t seed,
                           const TpModelOptions& o = {},
                           const nlohmann::json& patch = nlohmann::json::object()) {
  SyntheticHfSpec s;
  s.arch = arch;
  s.seed = seed;
  s.init_std = 0.05;
  s.num_layers = arch == HfArch::kGlm4Moe ? 3 : 2;
  s.num_heads = o.num_heads;
  s.num_kv_heads = o.num_kv_heads;
  s.head_dim = o.head_dim;
  s.intermediate_size = 512;
  s.moe_intermediate_size = 512;
  s.vocab_size = o.vocab;
  write_synthetic_hf_model(dir, s);
  const auto store = TensorStore::open(dir);
  SafetensorsWriter w;
  std::mt19937_64 rng(seed + 1000);
  auto half_vec = [&](int64_t n, double mag) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    std::uniform_real_distribution<double> u(0.5, 1.5);
    for (auto& x : v)
      x = trellis::float_to_half(static_cast<float>((rng() & 1 ? 1 : -1) * mag * u(rng)));
    return v;
  };
  for (const auto& name : store.names()) {
    const TensorRef& ref = store.at(name);
    if (o.quantize && is_projection(name)) {
      const std::string prefix = name.substr(0, name.size() - 7);
      const int64_t out = ref.info->shape[0], in = ref.info->shape[1];
      const int k = 4;
      std::vector<uint16_t> tr(static_cast<size_t>(in / 16 * out / 16 * 16 * k));
      for (auto& x : tr) x = static_cast<uint16_t>(rng());
      w.add(prefix + ".trellis", DType::kI16, {in / 16, out / 16, 16 * k},
            std::span<const uint16_t>(tr));
      const auto suh = half_vec(in, 0.05), svh = half_vec(out, 1.0);
      w.add(prefix + ".suh", DType::kF16, {in}, std::span<const uint16_t>(suh));
      w.add(prefix + ".svh", DType::kF16, {out}, std::span<const uint16_t>(svh));
      const bool expert = name.find(".experts.") != std::string::npos;
      const int32_t marker = expert ? trellis::kMcgMarker : trellis::kMul1Marker;
      w.add(prefix + (expert ? ".mcg" : ".mul1"), DType::kI32, {},
            std::span<const int32_t>(&marker, 1));
      continue;
    }
    w.add(name, ref.info->dtype, ref.info->shape, ref.bytes());
  }
  const std::string blob = w.serialize();
  std::filesystem::remove(dir / "model.safetensors");
  write_file_atomic(dir / "model.safetensors", std::string_view(blob));
  auto cfg = nlohmann::json::parse(read_text_file(dir / "config.json"));
  cfg.merge_patch(patch);
  write_file_atomic(dir / "config.json", cfg.dump(2));
}

// Copies the model at `src` to `dst` with every routed expert projection stored rank-sliced for
// `tp` ranks (gate/up: output columns [I/tp * r, I/tp * (r + 1)), down: those input rows) under
// a hybrid_tr3_tail block, sliced here tile by tile (independently of the runtime's slicer).
inline void write_rank_sliced_copy(const std::filesystem::path& src,
                                   const std::filesystem::path& dst, int tp,
                                   const std::vector<int>& moe_layers, int64_t num_experts) {
  std::filesystem::create_directories(dst);
  for (const auto& f : std::filesystem::directory_iterator(src)) {
    if (f.path().filename() != "model.safetensors")
      std::filesystem::copy_file(f.path(), dst / f.path().filename());
  }
  const auto ckpt = Checkpoint::open(src);
  SafetensorsWriter w;
  for (const auto& name : ckpt.store().names()) {
    if (name.find(".mlp.experts.") == std::string::npos)
      w.add(name, ckpt.store().at(name).info->dtype, ckpt.store().at(name).info->shape,
            ckpt.store().at(name).bytes());
  }
  for (const auto& info : ckpt.linears()) {
    if (info.prefix.find(".mlp.experts.") == std::string::npos) continue;
    const auto data = Exl3LinearData::load(ckpt, info.prefix);
    const bool down = info.prefix.ends_with("down_proj");
    const int64_t in = info.in_features, out = info.out_features, words = 16 * info.bits;
    const int64_t inter = down ? in : out, loc = inter / tp;
    const auto tr = data.trellis();
    for (int r = 0; r < tp; ++r) {
      const std::string p = fmt::format("{}.rank{}", info.prefix, r);
      std::vector<uint16_t> t;
      for (int64_t i = 0; i < in / 16; ++i)
        for (int64_t j = 0; j < out / 16; ++j) {
          const int64_t c = down ? i * 16 : j * 16;
          if (c < loc * r || c >= loc * (r + 1)) continue;
          const auto at = tr.begin() + (i * (out / 16) + j) * words;
          t.insert(t.end(), at, at + words);
        }
      const int64_t lin = down ? loc : in, lout = down ? out : loc;
      w.add(p + ".trellis", DType::kI16, {lin / 16, lout / 16, words},
            std::span<const uint16_t>(t));
      std::vector<uint16_t> suh = data.suh(), svh = data.svh();
      auto& mid = down ? suh : svh;
      mid = std::vector<uint16_t>(mid.begin() + loc * r, mid.begin() + loc * (r + 1));
      w.add(p + ".suh", DType::kF16, {lin}, std::span<const uint16_t>(suh));
      w.add(p + ".svh", DType::kF16, {lout}, std::span<const uint16_t>(svh));
      const int32_t marker = trellis::kMcgMarker;
      w.add(p + ".mcg", DType::kI32, {}, std::span<const int32_t>(&marker, 1));
    }
  }
  std::filesystem::remove(dst / "model.safetensors");
  write_file_atomic(dst / "model.safetensors", std::string_view(w.serialize()));
  auto cfg = nlohmann::json::parse(read_text_file(src / "config.json"));
  cfg["hybrid_tr3_tail"] = {{"format", "exl3-trellis"},
                            {"bits", 4},
                            {"codebook", "mcg"},
                            {"experts_per_layer", num_experts},
                            {"moe_layers", {moe_layers.front(), moe_layers.back()}},
                            {"tp", tp},
                            {"tensor_schema", std::string(moe::kRankSlicedSchema)}};
  write_file_atomic(dst / "config.json", cfg.dump(2));
}

}  // namespace exl3::runtime::test
