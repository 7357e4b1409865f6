// Internal pieces of convert_model, split by stage: staging one plan item (convert_units.cpp),
// the resume journal (convert_journal.cpp) and the final assembly (convert_output.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/format/safetensors.hpp"
#include "exl3/quant/convert.hpp"

namespace exl3::quant::detail {

namespace fs = std::filesystem;

// ---- staging (one item -> one small safetensors file) ----------------------------------------

// The per-tensor quantizer seed: the run's seed mixed with the module name, so every tensor's
// result is independent of the order (and the run) it is converted in -- which is what makes a
// resumed conversion bit-identical to a one-shot one.
uint64_t tensor_seed(uint64_t seed, std::string_view name);

// Quantizes (EXL3 linear) or converts (plain tensor) one plan item and writes its output tensors
// to `file` atomically. Returns the report (seconds, K, proxy error). `hessian` (EXL3 linears,
// calibrated runs): H = X^T X / n over the linear's inputs, [in, in] fp64; nullptr = identity.
TensorReport stage_item(const TensorStore& store, const PlanItem& item, const ConvertOptions& o,
                        const fs::path& file, const std::vector<double>* hessian = nullptr);

// A dense linear (--dense-format): MXFP8 planes with the runtime's codec (the report carries the
// error against the source), or the weight unquantized (BF16 / F16 as stored, wider types rounded
// to BF16); the bias as stored (F64 as F32). Called by stage_item (dense_format.cpp).
TensorReport stage_dense_linear(const TensorStore& store, const PlanItem& item,
                                const fs::path& file);

// ---- journal --------------------------------------------------------------------------------

// OUT/.exl3-partial/journal.jsonl: the first line identifies the run (source fingerprint +
// settings + item count); every later line records one finished item:
//   {"unit": 3, "name": "<plan item name>", "file": "units/000003.safetensors", "bytes": 5376,
//    "quantized": true, "bits": 2, "proxy_err": ..., "seconds": ..., [dense-linear fields]}
// Lines are appended and fsynced after the item's staged file is in place, so a line always means
// "done"; a torn last line (no newline: a crash while appending) is dropped and its item redone.
// Journals written before "file" and "bytes" existed are still resumed (their staged files are
// checked for a readable header only).
class Journal {
 public:
  // Opens or creates the journal. An existing one with a different header is an error naming the
  // differences, unless `discard` (--overwrite), which starts over. Every entry of an existing one
  // is validated before anything is trusted: it must parse, name the item `item_names` has at its
  // unit index, and its staged file must exist with the recorded size and a readable header;
  // otherwise the error names the journal file, the line and how to recover (--overwrite).
  static Journal open(const fs::path& partial_dir, const nlohmann::json& header, bool discard,
                      const std::vector<std::string>& item_names);

  const std::map<int64_t, TensorReport>& done() const { return done_; }
  void append(int64_t index, const TensorReport& r);
  const fs::path& dir() const { return dir_; }
  fs::path unit_file(int64_t index) const;

 private:
  fs::path dir_;
  std::map<int64_t, TensorReport> done_;
};

// ---- assembly -------------------------------------------------------------------------------

struct AssembleInput {
  const ConversionPlan* plan = nullptr;
  fs::path in_dir;
  fs::path out_dir;
  const Journal* journal = nullptr;
  const ConvertOptions* options = nullptr;
  std::string source_fingerprint;
  nlohmann::json settings;
  double started = 0.0;  // seconds on the steady clock, for progress events
};

struct AssembleResult {
  int num_shards = 0;
  uint64_t total_bytes = 0;
};

// Streams the staged items into shards, writes the index, quantization_config.json, the
// tokenizer files and config.json (last).
AssembleResult assemble_output(const AssembleInput& in);

// The quantization_config object recorded in config.json and quantization_config.json.
nlohmann::ordered_json quantization_config(const ConversionPlan& plan, const ConvertOptions& o);

// Shard metadata keys identifying which conversion produced a folder.
inline constexpr const char* kMetaFingerprint = "exl3.source_fingerprint";
inline constexpr const char* kMetaSettings = "exl3.settings";

double now_seconds();

}  // namespace exl3::quant::detail
