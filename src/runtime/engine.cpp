// load_engine (the device switch), device names and forward_logits (see engine.hpp).
#include "exl3/runtime/engine.hpp"

#include <unordered_set>
#include <variant>

#include "cpu_engine.hpp"
#include "cuda_engine.hpp"
#include "cuda_tp_engine.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/generate.hpp"

namespace exl3::runtime {

std::string_view device_name(Device d) {
  return d == Device::kCuda ? "cuda" : "cpu";
}

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  fail("device '{}' is unknown; choose cpu or cuda", name);
}

void Engine::keep_hidden_states(SeqId seq, int64_t from) {
  (void)seq;
  (void)from;
  fail(
      "MTP drafting: the {} engine does not hand out hidden states (only the CPU engine does); "
      "hint: run with --device cpu, or draft with a separate model (--draft)",
      device_name(device()));
}

std::span<const float> Engine::hidden_state(SeqId seq, int64_t pos) const {
  (void)seq;
  (void)pos;
  return {};
}

void check_kv_format(const ModelSpec& spec, KvFormat format) {
  if (!cpu::kv_quantized(format)) return;
  for (const model::LayerSpec& l : spec.layers) {
    if (std::holds_alternative<model::GatedDeltaNetSpec>(l.attention)) continue;  // no KV
    if (std::holds_alternative<model::MlaAttentionSpec>(l.attention)) {
      fail(
          "{}: --kv-cache {}: layer {} uses multi-head latent attention, whose latent cache is "
          "kept "
          "at full precision (hint: use --kv-cache auto for this model)",
          spec.label, cpu::kv_format_name(format), l.index);
    }
    const auto& a = std::get<model::GqaAttentionSpec>(l.attention);
    if (!cpu::kv_format_supports_head_dim(a.head_dim)) {
      fail(
          "{}: --kv-cache {}: head_dim {} (layer {}) is not a power of two from 32 to 1024, which "
          "the "
          "quantized cache's groups of 32 and key rotation need (hint: use --kv-cache auto)",
          spec.label, cpu::kv_format_name(format), a.head_dim, l.index);
    }
  }
}

std::unique_ptr<Engine> load_engine(const Checkpoint& ckpt, const EngineOptions& opts) {
  ModelSpec spec = describe_model(ckpt);
  if (opts.tp < 1) fail("tensor parallel: --tp {} must be at least 1", opts.tp);
  check_kv_format(spec, opts.kv_format);
  const bool tp_engine = opts.tp > 1 || opts.force_tp_engine;
  if (opts.overlay.any() && tp_engine) {
    fail(
        "--overlay (MXFP8) runs on single-rank engines so far; tensor parallelism loads "
        "unquantized linears as "
        "BF16 (hint: drop --overlay, or use --tp 1)");
  }
  if (spec.has_recurrent_layers() && opts.prefix_cache && opts.recurrent_snapshots < 1) {
    // Cached pages hold keys and values, not the recurrent state of the layers between them.
    fail(
        "{}: prefix caching on a model with gated DeltaNet layers keeps their state at page "
        "boundaries, and {} snapshots leave no room for one; hint: allow at least 1 "
        "(--recurrent-snapshots), or drop --prefix-cache",
        spec.label, opts.recurrent_snapshots);
  }
  if (opts.device == Device::kCuda) {
#if defined(EXL3_HAVE_CUDA)
    if (tp_engine) {
#if defined(EXL3_HAVE_NCCL)
      return make_cuda_tp_engine(ckpt, std::move(spec), opts);
#else
      fail(
          "device cuda: --tp {} needs NCCL, which this build of exl3 was configured without; hint: "
          "install NCCL "
          "(it ships with the CUDA toolkit) and rebuild, or use --device cpu --tp {}",
          opts.tp, opts.tp);
#endif
    }
    return make_cuda_engine(ckpt, std::move(spec), opts);
#else
    fail(
        "device cuda: this build of exl3 has no CUDA support (configured with EXL3_CUDA=OFF or "
        "without nvcc); hint: rebuild with the CUDA toolkit installed, or use --device cpu");
#endif
  }
  return make_cpu_engine(ckpt, std::move(spec), opts);
}

std::unique_ptr<Engine> load_engine(const std::filesystem::path& path, const EngineOptions& opts) {
  return load_engine(Checkpoint::open(path), opts);
}

std::vector<std::vector<float>> Engine::forward_batch(std::span<const BatchEntry> batch) {
  validate_batch(*this, batch);
  std::vector<std::vector<float>> out;
  out.reserve(batch.size());
  for (const auto& e : batch) out.push_back(forward(e.seq, e.tokens, e.mode));
  return out;
}

std::vector<std::vector<int32_t>> Engine::forward_batch_argmax(std::span<const BatchEntry> batch) {
  const auto logits = forward_batch(batch);
  const auto vocab = static_cast<size_t>(spec().vocab_size);
  std::vector<std::vector<int32_t>> ids(logits.size());
  for (size_t b = 0; b < logits.size(); ++b) {
    const std::span<const float> rows(logits[b]);
    for (size_t at = 0; at < rows.size(); at += vocab)
      ids[b].push_back(argmax(rows.subspan(at, vocab)));
  }
  return ids;
}

void validate_batch(const Engine& engine, std::span<const Engine::BatchEntry> batch) {
  if (batch.empty()) fail("forward_batch: empty batch");
  const int64_t vocab = engine.spec().vocab_size;
  std::unordered_set<Engine::SeqId> seen;
  int64_t need = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const auto& e = batch[b];
    if (e.tokens.empty()) fail("forward_batch: entry {} (sequence {}) has no tokens", b, e.seq);
    if (!seen.insert(e.seq).second) {
      fail(
          "forward_batch: sequence {} appears twice in one batch; hint: concatenate its tokens "
          "into one entry",
          e.seq);
    }
    for (size_t i = 0; i < e.tokens.size(); ++i) {
      if (e.tokens[i] < 0 || e.tokens[i] >= vocab) {
        fail("forward_batch: entry {}: token id {} at index {} is outside the vocabulary 0..{}", b,
             e.tokens[i], i, vocab - 1);
      }
    }
    need += engine.cache_tokens_needed(e.seq, static_cast<int64_t>(e.tokens.size()));
  }
  if (need > engine.free_cache_tokens()) {
    fail(
        "KV cache is full: the batch needs {} more cache tokens, {} are free; hint: raise the "
        "cache size (e.g. --cache-tokens) or run fewer sequences at once",
        need, engine.free_cache_tokens());
  }
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
