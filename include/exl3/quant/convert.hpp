// Model conversion: a Hugging Face safetensors model -> an EXL3 checkpoint laid out exactly as
// exllamav3's `convert.py` + `compile.py` write it (docs/format.md, Checkpoint files and Bit
// allocation).
//
// The pipeline, one tensor at a time (the source is mmapped; at most one source tensor is held):
//   plan      config.json architecture -> which tensors are EXL3 linears (and their allocation
//             group), which are copied through (embeddings, norms, routers, ...)
//   allocate  integer K per linear so the decoder linears average at most --bits (docs/format.md)
//   convert   quantize / copy each tensor into OUT_DIR/.exl3-partial/units/, journaled, so an
//             interrupted run resumes where it stopped
//   assemble  stream the staged tensors into shards (+ index), write quantization_config.json,
//             copy the tokenizer files, write config.json LAST, remove the partial folder.
// A folder without config.json is never a finished conversion.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/format/checkpoint.hpp"
#include "exl3/format/dtype.hpp"
#include "exl3/format/fused_experts.hpp"
#include "exl3/quant/quantize.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::quant {

// The `version` recorded in quantization_config.
inline constexpr const char* kConverterVersion = "exl3-0.1.0";
// exllamav3's default K for multi-token-prediction layers (`mtp_bits`); they are outside the
// budget.
inline constexpr int kMtpBits = 4;
// head_bits value that keeps lm_head unquantized.
inline constexpr int kHeadBitsUnquantized = 16;

// ---- plan -----------------------------------------------------------------------------------

// How the dense linears -- attention, dense MLPs and shared experts, the ones the MXFP8 overlay
// governs (exl3/runtime/overlay.hpp) -- are written (`exl3 quantize --dense-format`):
//   kExl3  : trellis-quantized within the bit budget, like every decoder linear (the default,
//            exllamav3's layout);
//   kBf16  : kept unquantized, as in the source (F32/F64 sources rounded to BF16);
//   kMxfp8 : those the overlay policy linear=mxfp8,shared_experts=mxfp8 (minus
//            ConvertOptions::dense_ignore) would convert are stored as MXFP8 (`.weight` E4M3 +
//            `.weight_scale`, exl3/mxfp8/weight.hpp) with the runtime's codec, so the checkpoint
//            loads with no --overlay to what `--overlay` computes on the kBf16 checkpoint; the
//            others (ignored, input width not a multiple of 32) stay unquantized as with kBf16.
// Non-EXL3 dense linears leave the bit budget (--bits covers the routed experts, or nothing).
enum class DenseFormat : uint8_t { kExl3, kBf16, kMxfp8 };
std::string_view dense_format_name(DenseFormat f);  // "exl3" | "bf16" | "mxfp8"
std::optional<DenseFormat> parse_dense_format(std::string_view s);

enum class LinearRole : uint8_t {
  kDecoder,  // a linear of model.layers.N (N < num_hidden_layers): in the bit budget
  kHead,     // lm_head: head_bits, outside the budget
  kMtp,      // a linear of a layer >= num_hidden_layers (GLM-4.5 next-token layers): kMtpBits
};

// One output module: an EXL3 linear, a dense linear in its DenseFormat (bf16 / mxfp8), or one
// tensor copied through unquantized.
struct PlanItem {
  enum class Kind : uint8_t { kExl3Linear, kPlain, kDenseLinear };
  Kind kind = Kind::kPlain;
  std::string
      name;  // linear: output prefix ("model.layers.3.self_attn.q_proj"); plain: tensor name
  std::string source;  // source tensor: HF weight [out, in] for a linear
  std::string bias;    // linear: source bias tensor, or empty
  // A linear cut from transformers' fused experts (gpt-oss): `source` is [E, in, columns] and
  // `bias` [E, columns]; this linear is expert `fused_expert`'s columns `fused_columns`.
  int64_t fused_expert = -1;  // -1: `source` is a plain [out, in] weight
  FusedColumns fused_columns;

  // EXL3 linears
  LinearRole role = LinearRole::kDecoder;
  int layer = -1;           // decoder layer index, -1 outside model.layers
  std::string group;        // allocation group id, e.g. "model.layers.3.self_attn.qkv"
  int64_t in_features = 0;  // unpadded
  int64_t out_features = 0;
  int bits = 0;  // K, set by the allocation

  // dense linears (weight + optional bias as `source` / `bias`): kBf16 or kMxfp8
  DenseFormat dense_format = DenseFormat::kBf16;

  // plain tensors
  DType out_dtype = DType::kF16;  // stored dtype (bf16/fp16 kept, fp32/fp64 -> fp16, routers fp16)
  std::string role_name;          // "embedding" | "norm" | "router" | "bias" | "linear" | "other"
};

struct ConversionPlan {
  std::string architecture;
  int64_t num_layers = 0;
  bool tied_head = false;       // lm_head comes from model.embed_tokens.weight
  std::vector<PlanItem> items;  // output order: embeddings, layers 0..N-1, others, lm_head
  double bits_target = 0.0;
  double bits_achieved = 0.0;  // sum(K * padded numel) / sum(padded numel) over kDecoder linears
  int head_bits = 6;
};

// Maps every source tensor, validates the model's structure (every layer complete, no fused or
// oddly shaped linears, supported architecture) and allocates bits. Linears whose prefix `dense`
// lists become kDenseLinear items in that format (outside the bit budget). Throws exl3::Error
// naming the folder / tensor at fault.
ConversionPlan plan_conversion(const ModelConfig& config, const TensorStore& store, double bits,
                               int head_bits, const std::map<std::string, DenseFormat>& dense = {});

// The format of every dense linear of the Hugging Face model in `in_dir` under `format` (empty
// for kExl3): the MXFP8 overlay's plan (runtime::OverlayPlan, the decision function the engines
// use) with policy linear=mxfp8,shared_experts=mxfp8 and `ignore`, its converted linears kMxfp8,
// the rest kBf16. Throws exl3::Error for invalid ignore entries, fused groups that would disagree
// (an ignore entry hitting k_proj alone), or ignore entries without kMxfp8.
std::map<std::string, DenseFormat> plan_dense_formats(const std::filesystem::path& in_dir,
                                                      DenseFormat format,
                                                      const std::vector<std::string>& ignore);

// ---- bit allocation (docs/format.md, Bit allocation) -------------------------------------------

// A set of linears raised together. Groups used by plan_conversion:
//   attention: q/k/v of a layer = one group, o_proj = one group
//   dense MLP: gate/up of a layer = one group, down = one group
//   MoE: gate/up of all routed experts of a layer = one group, their down_proj = one group,
//        the shared experts' gate/up and down likewise (two more groups)
struct AllocGroup {
  std::string id;
  int layer = 0;        // decoder layer index
  int rank = 0;         // order inside the layer (attention first, then MLP, experts, shared)
  int64_t weights = 0;  // padded numel of all its linears
};

// K for each group (same order): all start at floor(target); then groups are raised by one bit in
// priority order -- layers nearest either end of the stack first (distance = min(L, N-1-L)), then
// lower layer, then rank -- whenever the raise keeps the weighted average <= target. A group that
// does not fit is skipped so smaller later groups can still use the remainder.
std::vector<int> allocate_bits(const std::vector<AllocGroup>& groups, int num_layers,
                               double target_bits);

// ---- conversion -----------------------------------------------------------------------------

// kNone: identity Hessian. kText: Hessians H = X^T X of every linear's inputs, captured layer by
// layer with the runtime's forward over calibration text (see calibrate.cpp): each layer runs with
// its original weights to capture, is quantized with LDLQ, then runs again with the quantized
// weights to give the next layer its inputs (errors propagate as in exllamav3).
enum class Calibration : uint8_t { kNone, kText };

struct ProgressEvent {
  // kLayer: calibration finished decoder layer `index` of `total` (tokens_per_s: forward
  // throughput of its capture + quantized passes).
  enum class Stage : uint8_t { kTensor, kWrite, kLayer };
  Stage stage = Stage::kTensor;
  int64_t index = 0;  // 1-based
  int64_t total = 0;
  std::string name;
  bool quantized = false;  // kTensor: an EXL3 linear (else copied through)
  bool mxfp8 = false;      // kTensor: a dense linear written as MXFP8 (rel_l2: its error)
  double rel_l2 = 0.0;
  bool resumed = false;  // kTensor: done by an earlier run
  int bits = 0;
  double proxy_err = 0.0;
  double seconds = 0.0;       // this tensor
  double elapsed = 0.0;       // since the run started
  double eta_seconds = -1.0;  // < 0: unknown
  double tokens_per_s = 0.0;  // kLayer
};
using ProgressFn = std::function<void(const ProgressEvent&)>;

// The most rows `calibration_rows = 0` takes from a long text (256 x 512 tokens).
inline constexpr int64_t kMaxAutoCalibrationRows = 256;

struct ConvertOptions {
  double bits = 4.0;  // target average K over decoder linears, 1..8
  int head_bits = 6;  // 1..8, or 16 = keep lm_head unquantized
  trellis::Codebook codebook = trellis::Codebook::kMul1;
  OutScales out_scales = OutScales::kAlways;
  Calibration calibration = Calibration::kNone;
  // kText: the text (UTF-8), tokenized with IN_DIR/tokenizer.json and cut into
  // calibration_rows sequences of calibration_length tokens; the label names it in errors and
  // in the recorded settings ("builtin" or the file path).
  std::string calibration_text;
  std::string calibration_label;
  // 0 rows: as many as the text fills (at most kMaxAutoCalibrationRows). The bundled corpus whole
  // (about 12k tokens) lowered KL on a real model by a quarter against 8 x 128
  // (docs/calibration.md).
  int64_t calibration_rows = 0;
  int64_t calibration_length = 512;
  uint64_t seed = 0;  // per-tensor seeds derive from this and the tensor name
  int threads = 0;    // 0 = the caller's TBB arena
  Device device =
      Device::kCpu;  // tile encoder: CPU (reference) or CUDA (same states, ~300x faster)
  DenseFormat dense_format = DenseFormat::kExl3;  // attention / dense-MLP / shared-expert linears
  std::vector<std::string>
      dense_ignore;  // kMxfp8: overlay ignore entries (prefix, last name, re:REGEX)
  uint64_t shard_size_bytes = 8192ull << 20;
  bool overwrite = false;  // replace a different finished model / discard a foreign partial run
  double g_scale = 0.0;    // > 0: fixed global scale instead of the per-tensor search (faster)
  // Test hook: throw after this many tensors were converted in this run (< 0: off). `exl3
  // quantize` sets it from EXL3_QUANTIZE_STOP_AFTER (the library reads no environment).
  int64_t stop_after = -1;
  ProgressFn progress;  // called after every tensor and shard; may be empty
};

struct TensorReport {
  std::string name;
  bool quantized = false;
  bool resumed = false;
  int bits = 0;  // K (quantized) or 0
  double proxy_err = 0.0;
  double seconds = 0.0;
  // MXFP8 dense linears: the conversion's error against the source weight and the bytes.
  bool mxfp8 = false;
  double rel_l2 = 0.0;
  double max_abs = 0.0;
  uint64_t source_bytes = 0;
  uint64_t stored_bytes = 0;
};

struct ConvertResult {
  std::filesystem::path out_dir;
  std::string architecture;
  bool already_complete = false;  // OUT_DIR held this very conversion; nothing was done
  int64_t tensors = 0;            // output modules (linears + copied tensors)
  int64_t quantized = 0;          // EXL3 linears
  int64_t dense_linears = 0;      // linears written as bf16 / mxfp8 (--dense-format)
  DenseFormat dense_format = DenseFormat::kExl3;
  int64_t resumed = 0;    // modules finished by an earlier, interrupted run
  int64_t converted = 0;  // modules converted by this run
  double bits_target = 0.0;
  double bits_achieved = 0.0;
  int head_bits = 0;
  int num_shards = 0;
  uint64_t total_bytes = 0;  // tensor data in the shards
  double seconds = 0.0;
  uint64_t peak_rss_bytes = 0;
  std::vector<TensorReport> reports;  // output order

  // Over the MXFP8 linears: source and stored bytes, and what was saved.
  uint64_t mxfp8_source_bytes() const;
  uint64_t mxfp8_bytes() const;
  nlohmann::json to_json() const;
};

// Converts IN_DIR (config.json + *.safetensors) into OUT_DIR. Throws exl3::Error on bad input
// (naming the file and tensor), on an OUT_DIR holding a different model (unless overwrite), and on
// a partial run with different settings (unless overwrite).
ConvertResult convert_model(const std::filesystem::path& in_dir,
                            const std::filesystem::path& out_dir, const ConvertOptions& options);

// Name of the partial-work folder inside OUT_DIR and of the journal inside it.
inline constexpr const char* kPartialDir = ".exl3-partial";
inline constexpr const char* kJournalFile = "journal.jsonl";

// ---- helpers for front ends ------------------------------------------------------------------

// A progress printer: on a terminal a redrawn bar with ETA, otherwise one line per tensor.
ProgressFn make_progress_printer(std::FILE* out, bool terminal);
// Peak resident set size of this process (getrusage ru_maxrss), in bytes.
uint64_t peak_rss_bytes();

std::string_view out_scales_name(OutScales s);  // "always" | "never" | "auto"
std::optional<OutScales> parse_out_scales(std::string_view s);
std::optional<trellis::Codebook> parse_codebook(std::string_view s);  // "3inst" | "mcg" | "mul1"

}  // namespace exl3::quant
