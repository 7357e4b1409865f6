// Final assembly of a conversion: staged items -> shards (+ index) -> quantization_config.json ->
// tokenizer files -> config.json. config.json is written last, so a folder that has it is
// complete; everything before it is written atomically and may be redone after a crash.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "exl3/error.hpp"
#include "exl3/format/file_io.hpp"
#include "exl3/trellis/codebook.hpp"
#include "quant/convert_internal.hpp"
#include "quant/stream_writer.hpp"

namespace exl3::quant::detail {

namespace {

// The dtype spelling exllamav3's quant_config.py records (str(torch.dtype)).
const char* torch_dtype(DType t) {
  switch (t) {
    case DType::kBool:
      return "torch.bool";
    case DType::kU8:
      return "torch.uint8";
    case DType::kI8:
      return "torch.int8";
    case DType::kI16:
      return "torch.int16";
    case DType::kI32:
      return "torch.int32";
    case DType::kI64:
      return "torch.int64";
    case DType::kF16:
      return "torch.float16";
    case DType::kBF16:
      return "torch.bfloat16";
    case DType::kF32:
      return "torch.float32";
    case DType::kF64:
      return "torch.float64";
    case DType::kF8E4M3:
      return "torch.float8_e4m3fn";
    case DType::kF8E5M2:
      return "torch.float8_e5m2";
  }
  return "unknown";
}

// Module of a plain tensor: its name without the last component (model.norm.weight -> model.norm).
std::string module_of(const PlanItem& it) {
  if (it.kind != PlanItem::Kind::kPlain) return it.name;  // a linear's prefix
  const auto dot = it.name.rfind('.');
  return dot == std::string::npos ? it.name : it.name.substr(0, dot);
}

bool is_tokenizer_file(const std::string& n) {
  static const std::set<std::string> exact = {"tokenizer.model",
                                              "special_tokens_map.json",
                                              "generation_config.json",
                                              "added_tokens.json",
                                              "vocab.json",
                                              "merges.txt"};
  return exact.contains(n) || (n.starts_with("tokenizer") && n.ends_with(".json")) ||
         n.starts_with("chat_template");
}

// Output files of an earlier, different conversion that would otherwise linger beside ours.
void remove_stale_shards(const fs::path& out) {
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string n = e.path().filename().string();
    if (n == "model.safetensors" || n == "model.safetensors.index.json" ||
        (n.starts_with("model-") && n.ends_with(".safetensors") &&
         n.find("-of-") != std::string::npos)) {
      stale.push_back(e.path());
    }
  }
  for (const auto& p : stale) remove_output_path(p);
}

}  // namespace

nlohmann::ordered_json quantization_config(const ConversionPlan& plan, const ConvertOptions& o) {
  nlohmann::ordered_json q;
  q["quant_method"] = "exl3";
  q["version"] = kConverterVersion;
  q["bits"] = std::round(plan.bits_achieved * 100.0) / 100.0;
  q["head_bits"] = o.head_bits;
  // exllamav3 records its calibration set as rows x cols tokens; 0 x 0 = --calibration none.
  const bool cal = o.calibration == Calibration::kText;
  q["calibration"] = {{"rows", cal ? o.calibration_rows : 0},
                      {"cols", cal ? o.calibration_length : 0}};
  q["out_scales"] = std::string(out_scales_name(o.out_scales));
  q["codebook"] = trellis::codebook_name(o.codebook);
  // The serialized-MXFP8 variant records its dense format (docs/mxfp8.md, Checkpoint form).
  if (o.dense_format != DenseFormat::kExl3)
    q["dense_format"] = std::string(dense_format_name(o.dense_format));
  return q;
}

AssembleResult assemble_output(const AssembleInput& in) {
  const ConversionPlan& plan = *in.plan;
  const ConvertOptions& o = *in.options;
  const auto n_items = static_cast<int64_t>(plan.items.size());

  // Headers of all staged items (read with pread: nothing large is held).
  std::vector<StagedFile> staged;
  staged.reserve(plan.items.size());
  for (int64_t i = 0; i < n_items; ++i)
    staged.push_back(read_staged_header(in.journal->unit_file(i)));

  // Shards: items in order, a new shard when the next item would overflow a non-empty one. An
  // item (module) is never split.
  std::vector<std::vector<int64_t>> shards(1);
  uint64_t cur = 0, total = 0;
  for (int64_t i = 0; i < n_items; ++i) {
    uint64_t sz = 0;
    for (const auto& t : staged[static_cast<size_t>(i)].header.tensors) sz += t.nbytes();
    if (!shards.back().empty() && cur + sz > o.shard_size_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += sz;
    total += sz;
  }
  const auto n_shards = static_cast<int>(shards.size());
  auto shard_name = [&](int s) {
    return n_shards == 1 ? std::string("model.safetensors")
                         : fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, n_shards);
  };

  remove_stale_shards(in.out_dir);
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {kMetaFingerprint, in.source_fingerprint},
                                                   {kMetaSettings, in.settings.dump()}};
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::map<std::string, std::string> sorted_map;
  for (int s = 0; s < n_shards; ++s) {
    std::vector<StreamEntry> entries;
    for (const int64_t i : shards[static_cast<size_t>(s)]) {
      for (const auto& t : staged[static_cast<size_t>(i)].header.tensors) {
        entries.push_back(staged_entry(staged[static_cast<size_t>(i)], t));
        sorted_map[t.name] = shard_name(s);
      }
    }
    write_safetensors_streaming(in.out_dir / shard_name(s), std::move(entries), meta);
    if (o.progress) {
      ProgressEvent ev;
      ev.stage = ProgressEvent::Stage::kWrite;
      ev.index = s + 1;
      ev.total = n_shards;
      ev.name = shard_name(s);
      ev.elapsed = now_seconds() - in.started;
      o.progress(ev);
    }
  }
  if (n_shards > 1) {
    for (const auto& [k, v] : sorted_map) weight_map[k] = v;
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_file_atomic(in.out_dir / "model.safetensors.index.json", index.dump(2) + "\n");
  }

  for (const auto& e : fs::directory_iterator(in.in_dir)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && is_tokenizer_file(n))
      write_file_atomic(in.out_dir / n, read_text_file(e.path()));
  }

  // quantization_config.json: the config block plus every module's stored tensors.
  const nlohmann::ordered_json qcfg = quantization_config(plan, o);
  nlohmann::ordered_json storage = nlohmann::ordered_json::object();
  for (int64_t i = 0; i < n_items; ++i) {
    const PlanItem& it = plan.items[static_cast<size_t>(i)];
    auto& mod = storage[module_of(it)];
    std::map<std::string, nlohmann::ordered_json> tensors;
    if (mod.contains("stored_tensors")) {
      for (const auto& [k, v] : mod["stored_tensors"].items()) tensors[k] = v;
    }
    for (const auto& t : staged[static_cast<size_t>(i)].header.tensors) {
      nlohmann::ordered_json d;
      d["shape"] = t.shape;
      d["n_bytes"] = t.nbytes();
      d["dtype"] = torch_dtype(t.dtype);
      tensors[t.name] = d;
    }
    mod["stored_tensors"] = nlohmann::ordered_json::object();
    for (auto& [k, v] : tensors) mod["stored_tensors"][k] = v;
    if (it.kind == PlanItem::Kind::kExl3Linear) {
      mod["quant_format"] = "exl3";
      mod["bits_per_weight"] = it.bits;
      if (o.codebook == trellis::Codebook::kMcg) mod["mcg_multiplier"] = trellis::kMcgMult;
      if (o.codebook == trellis::Codebook::kMul1) mod["mul1_multiplier"] = trellis::kMul1Mult;
    } else if (it.kind == PlanItem::Kind::kDenseLinear && it.dense_format == DenseFormat::kMxfp8) {
      mod["quant_format"] = "mxfp8";  // E4M3 values, UE8M0 scale per 32 inputs (docs/mxfp8.md)
    }
  }
  nlohmann::ordered_json qfile = qcfg;
  qfile["tensor_storage"] = storage;
  write_file_atomic(in.out_dir / "quantization_config.json", qfile.dump(4) + "\n");

  // config.json last: the source config with the quantization block appended; a source
  // quantization_config of another method is kept under original_quantization_config.
  const fs::path src_cfg = in.in_dir / "config.json";
  nlohmann::ordered_json cfg;
  try {
    cfg = nlohmann::ordered_json::parse(read_text_file(src_cfg));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON ({})", src_cfg.string(), e.what());
  }
  if (cfg.contains("quantization_config")) {
    cfg["original_quantization_config"] = cfg["quantization_config"];
    cfg.erase("quantization_config");
  }
  cfg["quantization_config"] = qcfg;
  write_file_atomic(in.out_dir / "config.json", cfg.dump(4) + "\n");
  return {n_shards, total};
}

}  // namespace exl3::quant::detail
