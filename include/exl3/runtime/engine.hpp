// The backend interface: an Engine runs one model description on one device and owns its KV
// cache. The CPU engine is the reference (fp32 activations, EXL3 linears through
// cpu::linear_forward, MoE through exl3::moe); a CUDA engine will implement the same interface.
//
//   auto engine = runtime::load_engine(Checkpoint::open(dir));
//   auto seq = engine->new_sequence();
//   auto logits = engine->forward(seq, prompt_ids);                 // [n, vocab], prefill
//   auto next = engine->forward(seq, {&tok, 1}, LogitsMode::kLast); // [1, vocab], decode
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "exl3/cuda/plan.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/runtime/kv_cache.hpp"
#include "exl3/runtime/load_progress.hpp"
#include "exl3/runtime/overlay.hpp"

namespace exl3 {
class Checkpoint;
}

namespace exl3::runtime {
// The runtime runs the model layer's descriptions and plans: their names are its vocabulary.
using namespace exl3::model;  // NOLINT(google-build-using-namespace)

enum class Device : uint8_t { kCpu, kCuda };
std::string_view device_name(Device d);  // "cpu" | "cuda"
// Parses "cpu" / "cuda"; throws exl3::Error listing the choices.
Device parse_device(std::string_view name);

struct EngineOptions {
  Device device = Device::kCpu;
  int64_t page_size = 32;       // tokens per KV page
  int64_t cache_tokens = 4096;  // KV pool capacity over all sequences (rounded up to pages)
  // CUDA: the most tokens one kernel pass runs (longer batches run in chunks); every device
  // buffer is sized for it at load.
  int64_t max_batch_tokens = 2048;
  // CUDA: capture each step of short runs (decode: one token per sequence; speculative verify:
  // up to 17) as a graph per shape, replayed afterwards.
  bool cuda_graphs = true;
  // Automatic prefix caching: full KV pages are kept under a hash of the tokens up to their end,
  // and adopt_prefix() gives a new sequence the cached pages its prompt starts with (single-rank
  // CPU and CUDA engines, and the CPU engine's tensor-parallel ranks). Models with gated
  // DeltaNet layers also keep their recurrent state where prefill runs end on a page boundary
  // (exl3/runtime/recurrent_snapshots.hpp) and adopt cached pages only up to such a state.
  bool prefix_cache = false;
  // Prefix caching on a model with gated DeltaNet layers: recurrent states kept for adoption,
  // each the size of a recurrent slot below (78 MB for Qwen3-Next-80B), the least recently used
  // replaced first. CUDA allocates them at load beside the recurrent slots.
  int64_t recurrent_snapshots = 16;
  // KV cache format (exl3/cpu/kv_codec.hpp): kNative keeps the engine's precision (fp32 on the
  // CPU, fp16 on CUDA); fp8 / q8 / q4 store 8.5 / 8.5 / 4.5 bits per channel. Quantized formats
  // need GQA layers with a power-of-two head_dim >= 32 (load_engine refuses others).
  KvFormat kv_format = KvFormat::kNative;
  // Tensor-parallel ranks. 1: the single-rank engine; N > 1: N ranks in this process, each on
  // its own thread with its slice of every weight (runtime/tp_plan.hpp); on the CPU they reduce
  // in memory, on CUDA each rank drives GPU r and they reduce through NCCL.
  int tp = 1;
  // Run the tensor-parallel engine even at tp 1 (one rank through the same slicing and
  // collectives: checks that path on one device).
  bool force_tp_engine = false;
  // CUDA, models with gated DeltaNet layers: sequences that hold a recurrent state at once (one
  // slot of the device's state pool each, every DeltaNet layer's S and convolution window: 78 MB
  // for Qwen3-Next-80B; a slot is freed when its sequence is dropped). `exl3 serve` sets it to
  // --max-seqs, `exl3 bench model` to its biggest batch.
  int64_t recurrent_slots = 16;
  OverlayPolicy overlay;  // MXFP8 overlay of unquantized linears (exl3/runtime/overlay.hpp)
  // CUDA tuning of every fused MoE layer, MXFP8 linear and EXL3 linear (exl3/cuda/plan.hpp). The
  // engine reads no environment variable: the exl3 CLI fills these from EXL3_MOE_*,
  // EXL3_MXFP8_GEMV_MAX_M and EXL3_GEMV_* (docs/environment.md). The capacities (moe.capacity,
  // mxfp8.max_m, linear.max_m) are ignored: the engine sets them to max_batch_tokens.
  cuda::MoeOptions moe;
  cuda::Mxfp8Options mxfp8;
  cuda::LinearOptions linear;
  LoadProgressFn load_progress;  // called after each decoder layer is loaded (rank 0 of a TP group)
};

enum class LogitsMode : uint8_t {
  kAll,   // logits of every new token
  kLast,  // only the last token's (what decoding needs; skips the head for the others)
};

class Engine {
 public:
  using SeqId = PagedKvCache::SeqId;

  virtual ~Engine() = default;
  virtual const ModelSpec& spec() const = 0;
  virtual Device device() const = 0;
  // What the MXFP8 overlay converted (per layer: bytes before/after, error vs the source) and
  // which unquantized linears it kept, with why. Empty without an overlay.
  virtual OverlayReport overlay_report() const { return {}; }
  // Tensor-parallel engines on GPUs: the seconds one forward step's collectives take on their
  // own for `tokens` tokens and `logit_rows` logits rows (the all-reduce after every
  // row-parallel layer and the logits all-gather, on the same buffers, replayed as a captured
  // graph); benchmarks report their share of a step. 0 where a step has no collectives.
  virtual double collective_seconds(int64_t tokens, int64_t logit_rows) {
    (void)tokens;
    (void)logit_rows;
    return 0.0;
  }
  // Kernel launches in the captured decode step of `batch` sequences (CUDA graphs: the graph's
  // kernel nodes), so benchmarks can report the launches per step; nullopt where no such graph
  // has been captured.
  virtual std::optional<int64_t> decode_step_kernels(int64_t batch) const {
    (void)batch;
    return std::nullopt;
  }
  // Bytes of model weights resident on the accelerator (CUDA: every uploaded weight and bias,
  // experts included); nullopt for engines that compute from host memory.
  virtual std::optional<size_t> device_weight_bytes() const { return std::nullopt; }

  virtual SeqId new_sequence() = 0;
  virtual void drop_sequence(SeqId seq) = 0;
  virtual int64_t sequence_length(SeqId seq) const = 0;
  // Keeps the first `length` (<= sequence_length) tokens of `seq`: the next forward continues
  // from position `length`, and KV pages past it go back to the pool. Speculative decoding uses
  // it to drop rejected draft tokens. Throws exl3::Error for a length outside 0..length.
  virtual void truncate_sequence(SeqId seq, int64_t length) = 0;
  // With EngineOptions::prefix_cache, on a new (empty) sequence: takes the cached KV pages of
  // `prompt`'s leading full pages (at least one prompt token is left to compute) and returns the
  // tokens they hold; the caller then runs forward() on prompt[returned..]. 0 without caching.
  virtual int64_t adopt_prefix(SeqId seq, std::span<const int32_t> prompt) {
    (void)seq;
    (void)prompt;
    return 0;
  }
  // The KV cache's format and the bytes one token takes in it, over every layer (and every
  // rank of a tensor-parallel engine): K and V, codes and scales.
  struct KvCacheInfo {
    KvFormat format = KvFormat::kNative;
    uint64_t bytes_per_token = 0;
  };
  virtual KvCacheInfo kv_cache_info() const = 0;
  // Tokens that still fit in the KV pool (for all sequences together).
  virtual int64_t free_cache_tokens() const = 0;
  // KV pool tokens (whole pages) that appending `new_tokens` to `seq` would take from the pool.
  virtual int64_t cache_tokens_needed(SeqId seq, int64_t new_tokens) const = 0;

  // Appends `tokens` to `seq` (positions length .. length + n - 1, causal over everything the
  // sequence holds) and returns fp32 logits: [n, vocab] for kAll, [1, vocab] for kLast. Token
  // ids must be < vocab_size. Throws exl3::Error (bad ids, KV pool exhausted); the sequence is
  // unchanged then.
  virtual std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens,
                                     LogitsMode mode = LogitsMode::kAll) = 0;

  // One step of continuous batching: appends each entry's tokens to its sequence (one entry per
  // sequence; prefill chunks and single decode tokens mix freely) and returns each entry's
  // logits as forward() would. Every entry is validated (ids, distinct live sequences, KV room
  // for all of them together) before any sequence changes; on a throw no sequence changed.
  // The base version runs the entries one after another; backends override it to run the
  // batch's tokens through each layer together.
  struct BatchEntry {
    SeqId seq = -1;
    std::span<const int32_t> tokens;
    LogitsMode mode = LogitsMode::kLast;
  };
  virtual std::vector<std::vector<float>> forward_batch(std::span<const BatchEntry> batch);
  // Greedy decoding: forward_batch's effect on the sequences, but per entry only the argmax id
  // (exl3::runtime::argmax: the lowest id among equal logits) of each logits row forward_batch
  // would return, in the same order. Engines whose logits live on an accelerator pick the ids
  // there and bring back only those (a decode step of 8 sequences then reads back 8 ids, not 8
  // vocabulary-wide rows); the base version runs forward_batch and scans its rows.
  virtual std::vector<std::vector<int32_t>> forward_batch_argmax(std::span<const BatchEntry> batch);

  // Hidden states for a draft head that reads them (MTP, exl3/runtime/mtp.hpp). After
  // keep_hidden_states(seq, from), each forward of `seq` also keeps the last hidden state (after
  // the final norm) of every position >= from that it computes; a later call moves `from` and
  // releases the positions before it. Nothing is kept (and nothing costs) for other sequences.
  // hidden_state() is position `pos`'s [hidden] floats, or an empty span where none is kept
  // (not computed, released, or past the sequence's length). The base versions throw
  // exl3::Error: only the CPU engine keeps them.
  virtual void keep_hidden_states(SeqId seq, int64_t from);
  virtual std::span<const float> hidden_state(SeqId seq, int64_t pos) const;
  // A sequence of this engine that drafts for `target_seq` of `target` (speculative decoding;
  // one draft sequence per target sequence). A draft model reads only tokens: new_sequence(). An
  // MTP head also reads the target sequence's hidden states, and releases those it is done with.
  virtual SeqId new_draft_sequence(Engine& target, SeqId target_seq) {
    (void)target;
    (void)target_seq;
    return new_sequence();
  }
  // One op class of a profiled step (profile_step): the op layer's op (embed, norm, linear,
  // attention, glu, moe, add, all_reduce, head), how often the step ran it, and its summed time.
  struct OpTime {
    std::string op;
    int64_t calls = 0;
    double ms = 0.0;
  };
  // forward_batch_argmax(batch) once more with every op timed, op classes in the order first
  // run. CUDA: the step runs eagerly (no graph) with programmatic dependent launch off and an
  // event after each op, so each op's time is its own kernels' span, but the whole step is
  // slower than a replayed graph (launch gaps included). nullopt, running nothing, on engines
  // that cannot time their ops.
  virtual std::optional<std::vector<OpTime>> profile_step(std::span<const BatchEntry> batch) {
    (void)batch;
    return std::nullopt;
  }
};

// Builds the description of `ckpt` and loads it on opts.device. The engine keeps its own copy
// of the checkpoint (the mapped files stay alive). Device kCuda needs a build with CUDA and a
// visible GPU (else exl3::Error says which is missing).
std::unique_ptr<Engine> load_engine(const Checkpoint& ckpt, const EngineOptions& opts = {});
std::unique_ptr<Engine> load_engine(const std::filesystem::path& path,
                                    const EngineOptions& opts = {});

// The checks forward_batch makes before changing anything (non-empty entries, ids in the
// vocabulary, distinct sequences, KV room for the whole batch); throws exl3::Error naming the
// entry. For backends that override forward_batch.
void validate_batch(const Engine& engine, std::span<const Engine::BatchEntry> batch);

// Throws exl3::Error naming the model and the reason when its layers cannot use a quantized KV
// cache of `format` (MLA layers keep their latent cache at full precision; head_dim must be a
// power of two >= 32). load_engine calls it.
void check_kv_format(const ModelSpec& spec, KvFormat format);

// One forward pass over `tokens` in a fresh sequence (dropped afterwards): logits [n, vocab].
std::vector<float> forward_logits(Engine& engine, std::span<const int32_t> tokens);

}  // namespace exl3::runtime
