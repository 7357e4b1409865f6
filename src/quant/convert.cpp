// convert_model: option checks, the OUT_DIR state machine (fresh / resumable partial run /
// finished model), the per-tensor loop with its journal, and the final assembly.
#include "exl3/quant/convert.hpp"

#include <cmath>
#include <iterator>
#include <string>

#include <sys/resource.h>
#include <tbb/task_arena.h>

#include <fmt/format.h>

#include "exl3/error.hpp"
#include "exl3/format/file_io.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "quant/calibrate.hpp"
#include "quant/convert_internal.hpp"

namespace exl3::quant {

namespace fs = std::filesystem;
using detail::now_seconds;

namespace {

void validate_options(const ConvertOptions& o) {
  if (!std::isfinite(o.bits) || o.bits < trellis::kMinBits || o.bits > trellis::kMaxBits) {
    fail("quantize: --bits {} outside {}..{}", o.bits, trellis::kMinBits, trellis::kMaxBits);
  }
  if (!trellis::valid_bits(o.head_bits) && o.head_bits != kHeadBitsUnquantized) {
    fail("quantize: --head-bits {} must be in 1..8, or 16 to keep lm_head unquantized",
         o.head_bits);
  }
  if (o.shard_size_bytes == 0) fail("quantize: shard size must be positive");
  if (o.threads < 0) fail("quantize: threads {} must be >= 0", o.threads);
  if (!std::isfinite(o.g_scale) || o.g_scale < 0.0) {
    fail("quantize: g_scale {} must be finite and >= 0 (0 = search per tensor)", o.g_scale);
  }
  if (o.calibration == Calibration::kText &&
      (o.calibration_rows < 0 || o.calibration_length <= 0)) {
    fail(
        "quantize: --calibration-rows {} must be >= 0 (0 = as many as the text fills) and "
        "--calibration-length {} positive",
        o.calibration_rows, o.calibration_length);
  }
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Identifies the source cheaply: config.json bytes plus every tensor's name, dtype, shape and
// size (hashing the weights themselves would cost a full read of a possibly huge model).
std::string fingerprint(const std::string& config_text, const TensorStore& store) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::string_view s) {
    for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    h = (h ^ 0xFFu) * 1099511628211ull;  // separator
  };
  mix(config_text);
  for (const auto& name : store.names()) {
    const auto& t = *store.at(name).info;
    mix(name);
    mix(dtype_name(t.dtype));
    for (const auto d : t.shape) mix(std::to_string(d));
    mix(std::to_string(t.nbytes()));
  }
  return fmt::format("{:016x}", h);
}

nlohmann::json settings_json(const ConvertOptions& o) {
  return {{"version", kConverterVersion},
          {"bits", o.bits},
          {"head_bits", o.head_bits},
          {"codebook", trellis::codebook_name(o.codebook)},
          {"out_scales", std::string(out_scales_name(o.out_scales))},
          {"calibration",
           o.calibration == Calibration::kNone
               ? nlohmann::json("none")
               : nlohmann::json{{"text", o.calibration_label},
                                {"text_fnv1a", fmt::format("{:016x}", fnv1a(o.calibration_text))},
                                {"rows", o.calibration_rows},
                                {"length", o.calibration_length}}},
          {"seed", o.seed},
          {"g_scale", o.g_scale},
          {"shard_size_bytes", o.shard_size_bytes}};
}

// settings_json plus the dense format when it is not the default, so folders written before
// --dense-format existed are still recognised as finished.
nlohmann::json all_settings(const ConvertOptions& o) {
  nlohmann::json s = settings_json(o);
  if (o.dense_format != DenseFormat::kExl3) {
    s["dense_format"] = std::string(dense_format_name(o.dense_format));
    s["dense_ignore"] = o.dense_ignore;
  }
  return s;
}

// True when OUT_DIR's finished model was produced from this source with these settings.
bool finished_matches(const fs::path& out, const std::string& fp, const nlohmann::json& settings) {
  try {
    const auto cfg = nlohmann::json::parse(read_text_file(out / "config.json"));
    if (!cfg.contains("quantization_config") ||
        cfg["quantization_config"].value("quant_method", "") != "exl3") {
      return false;
    }
    const TensorStore store = TensorStore::open(out);
    const auto& meta = store.files().front()->metadata();
    const auto f = meta.find(detail::kMetaFingerprint);
    const auto s = meta.find(detail::kMetaSettings);
    return f != meta.end() && s != meta.end() && f->second == fp &&
           nlohmann::json::parse(s->second) == settings;
  } catch (const std::exception&) {
    return false;  // unreadable: certainly not ours
  }
}

ConvertResult finished_result(const fs::path& out, const ConversionPlan& plan) {
  ConvertResult r;
  r.out_dir = out;
  r.architecture = plan.architecture;
  r.already_complete = true;
  const TensorStore store = TensorStore::open(out);
  r.num_shards = static_cast<int>(store.files().size());
  r.total_bytes = store.total_bytes();
  r.tensors = static_cast<int64_t>(plan.items.size());
  for (const auto& it : plan.items) {
    r.quantized += it.kind == PlanItem::Kind::kExl3Linear ? 1 : 0;
    r.dense_linears += it.kind == PlanItem::Kind::kDenseLinear ? 1 : 0;
  }
  r.bits_target = plan.bits_target;
  r.bits_achieved = plan.bits_achieved;
  r.head_bits = plan.head_bits;
  r.peak_rss_bytes = peak_rss_bytes();
  return r;
}

// Makes OUT_DIR ready for this conversion. Returns true when it already holds exactly this
// finished conversion (nothing to do).
bool prepare_out_dir(const fs::path& in, const fs::path& out, const ConvertOptions& o,
                     const std::string& fp, const nlohmann::json& settings) {
  std::error_code ec;
  const bool exists = fs::exists(out, ec);
  if (exists && fs::equivalent(in, out, ec)) {
    fail("{}: OUT_DIR is the source folder; choose another output folder", out.string());
  }
  if (exists && !fs::is_directory(out, ec))
    fail("{}: exists and is not a folder; hint: pick another output folder", out.string());
  create_output_folder(out);  // errors name the path and the reason, e.g. Permission denied
  const fs::path cfg = out / "config.json";
  if (!fs::exists(cfg, ec)) return false;
  if (finished_matches(out, fp, settings) && !o.overwrite) {
    remove_output_path(out / kPartialDir);  // a crash between config.json and this cleanup
    return true;
  }
  if (!o.overwrite) {
    fail(
        "{}: already holds a different model (config.json is present and was not produced from "
        "this source with these settings); pass --overwrite to replace it, or choose another "
        "OUT_DIR",
        out.string());
  }
  remove_output_path(cfg);  // first, so the folder stops looking complete while it is rewritten
  return false;
}

}  // namespace

ConvertResult convert_model(const fs::path& in_dir, const fs::path& out_dir,
                            const ConvertOptions& options) {
  const double t0 = now_seconds();
  validate_options(options);
  if (!fs::is_directory(in_dir))
    fail("{}: not a folder (expected a Hugging Face model folder)", in_dir.string());
  const fs::path cfg_path = in_dir / "config.json";
  if (!fs::exists(cfg_path)) {
    fail("{}: missing (IN_DIR must be a Hugging Face model folder with config.json)",
         cfg_path.string());
  }
  const std::string cfg_text = read_text_file(cfg_path);
  const ModelConfig cfg = parse_model_config(cfg_text, cfg_path.string());
  if (cfg.quantization_config.is_object() &&
      cfg.quantization_config.value("quant_method", "") == "exl3") {
    fail("{}: the source is already an EXL3 model (quantization_config.quant_method = exl3)",
         cfg_path.string());
  }
  // From here on the calibration rows are a number (resolved from the text when 0), so the
  // recorded settings and quantization_config say what ran.
  ConvertOptions o = options;
  if (o.calibration == Calibration::kText && o.calibration_rows == 0) {
    o.calibration_rows = detail::calibration_rows_for(in_dir, o.calibration_text,
                                                      o.calibration_label, o.calibration_length);
  }
  const TensorStore store = TensorStore::open(in_dir);
  const ConversionPlan plan = plan_conversion(
      cfg, store, o.bits, o.head_bits, plan_dense_formats(in_dir, o.dense_format, o.dense_ignore));

  const std::string fp = fingerprint(cfg_text, store);
  const nlohmann::json settings = all_settings(o);
  if (prepare_out_dir(in_dir, out_dir, o, fp, settings)) {
    ConvertResult r = finished_result(out_dir, plan);
    r.dense_format = o.dense_format;
    r.seconds = now_seconds() - t0;
    return r;
  }

  const auto n = static_cast<int64_t>(plan.items.size());
  const nlohmann::json header = {{"journal", "exl3-quantize"},
                                 {"source_fingerprint", fp},
                                 {"settings", settings},
                                 {"items", n}};
  std::vector<std::string> item_names;
  item_names.reserve(plan.items.size());
  for (const auto& it : plan.items) item_names.push_back(it.name);
  detail::Journal journal =
      detail::Journal::open(out_dir / kPartialDir, header, o.overwrite, item_names);

  ConvertResult res;
  res.out_dir = out_dir;
  res.architecture = plan.architecture;
  res.tensors = n;
  res.bits_target = plan.bits_target;
  res.bits_achieved = plan.bits_achieved;
  res.head_bits = plan.head_bits;
  res.dense_format = o.dense_format;
  res.reports.resize(static_cast<size_t>(n));

  // ETA from quantization work (padded weights) still to do; copies are cheap by comparison.
  auto work = [](const PlanItem& it) {
    return it.kind == PlanItem::Kind::kExl3Linear
               ? static_cast<double>((it.in_features + 127) / 128 * 128) *
                     ((it.out_features + 127) / 128 * 128)
               : 0.0;
  };
  double work_left = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& it = plan.items[static_cast<size_t>(i)];
    res.quantized += it.kind == PlanItem::Kind::kExl3Linear ? 1 : 0;
    res.dense_linears += it.kind == PlanItem::Kind::kDenseLinear ? 1 : 0;
    const auto d = journal.done().find(i);
    const bool done =
        d != journal.done().end() && d->second.name == it.name && fs::exists(journal.unit_file(i));
    if (!done) work_left += work(it);
  }

  const int64_t stop = o.stop_after;
  auto item_done = [&](int64_t i) {
    const auto d = journal.done().find(i);
    return d != journal.done().end() && d->second.name == plan.items[static_cast<size_t>(i)].name &&
           fs::exists(journal.unit_file(i));
  };
  double work_done = 0.0, work_seconds = 0.0;
  auto run_item = [&](int64_t i, const std::vector<double>* hessian) {
    const PlanItem& it = plan.items[static_cast<size_t>(i)];
    TensorReport rep;
    if (item_done(i)) {
      rep = journal.done().at(i);
      rep.resumed = true;
      ++res.resumed;
    } else {
      if (stop >= 0 && res.converted >= stop) {
        fail(
            "quantize: stopped after {} tensors (EXL3_QUANTIZE_STOP_AFTER test hook); re-run "
            "to resume",
            res.converted);
      }
      rep = detail::stage_item(store, it, o, journal.unit_file(i), hessian);
      journal.append(i, rep);
      ++res.converted;
      work_done += work(it);
      work_seconds += rep.seconds;
    }
    res.reports[static_cast<size_t>(i)] = rep;
    if (o.progress) {
      ProgressEvent ev;
      ev.index = i + 1;
      ev.total = n;
      ev.name = it.name;
      ev.quantized = rep.quantized;
      ev.mxfp8 = rep.mxfp8;
      ev.rel_l2 = rep.rel_l2;
      ev.resumed = rep.resumed;
      ev.bits = rep.bits;
      ev.proxy_err = rep.proxy_err;
      ev.seconds = rep.seconds;
      ev.elapsed = now_seconds() - t0;
      if (work_done > 0.0)
        ev.eta_seconds = work_seconds / work_done * std::max(0.0, work_left - work_done);
      o.progress(ev);
    }
  };
  auto loop = [&] {
    if (o.calibration == Calibration::kNone) {
      for (int64_t i = 0; i < n; ++i) run_item(i, nullptr);
      return;
    }
    detail::CalibratedRun cr;
    cr.plan = &plan;
    cr.in_dir = in_dir;
    cr.work_dir = journal.dir();
    cr.options = &o;
    cr.item_done = item_done;
    cr.unit_file = [&](int64_t i) { return journal.unit_file(i); };
    cr.run_item = run_item;
    cr.started = t0;
    detail::run_calibrated(cr);
  };
  if (o.threads > 0) {
    tbb::task_arena arena(o.threads);
    arena.execute(loop);
  } else {
    loop();
  }

  detail::AssembleInput ai;
  ai.plan = &plan;
  ai.in_dir = in_dir;
  ai.out_dir = out_dir;
  ai.journal = &journal;
  ai.options = &o;
  ai.source_fingerprint = fp;
  ai.settings = settings;
  ai.started = t0;
  const auto asm_res = detail::assemble_output(ai);
  remove_output_path(out_dir / kPartialDir);

  res.num_shards = asm_res.num_shards;
  res.total_bytes = asm_res.total_bytes;
  res.seconds = now_seconds() - t0;
  res.peak_rss_bytes = peak_rss_bytes();
  return res;
}

uint64_t peak_rss_bytes() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024u;  // Linux reports KiB
}

std::string_view out_scales_name(OutScales s) {
  switch (s) {
    case OutScales::kAlways:
      return "always";
    case OutScales::kNever:
      return "never";
    case OutScales::kAuto:
      return "auto";
  }
  return "always";
}

std::optional<OutScales> parse_out_scales(std::string_view s) {
  if (s == "always") return OutScales::kAlways;
  if (s == "never") return OutScales::kNever;
  if (s == "auto") return OutScales::kAuto;
  return std::nullopt;
}

std::optional<trellis::Codebook> parse_codebook(std::string_view s) {
  if (s == "3inst") return trellis::Codebook::k3Inst;
  if (s == "mcg") return trellis::Codebook::kMcg;
  if (s == "mul1") return trellis::Codebook::kMul1;
  return std::nullopt;
}

uint64_t ConvertResult::mxfp8_source_bytes() const {
  uint64_t b = 0;
  for (const auto& r : reports) b += r.mxfp8 ? r.source_bytes : 0;
  return b;
}

uint64_t ConvertResult::mxfp8_bytes() const {
  uint64_t b = 0;
  for (const auto& r : reports) b += r.mxfp8 ? r.stored_bytes : 0;
  return b;
}

nlohmann::json ConvertResult::to_json() const {
  nlohmann::json mx_layers = nlohmann::json::array();
  for (const auto& r : reports) {
    if (r.mxfp8) {
      mx_layers.push_back({{"name", r.name},
                           {"rel_l2", r.rel_l2},
                           {"max_abs", r.max_abs},
                           {"source_bytes", r.source_bytes},
                           {"mxfp8_bytes", r.stored_bytes}});
    }
  }
  nlohmann::json proxy = nlohmann::json::array();
  for (const auto& r : reports) {
    if (r.quantized) {
      proxy.push_back({{"name", r.name},
                       {"bits", r.bits},
                       {"proxy_err", r.proxy_err},
                       {"seconds", r.seconds},
                       {"resumed", r.resumed}});
    }
  }
  return {{"out_dir", out_dir.string()},
          {"architecture", architecture},
          {"already_complete", already_complete},
          {"tensors", tensors},
          {"quantized", quantized},
          {"converted", converted},
          {"resumed", resumed},
          {"bits_target", bits_target},
          {"bits", std::round(bits_achieved * 100.0) / 100.0},
          {"bits_exact", bits_achieved},
          {"head_bits", head_bits},
          {"shards", num_shards},
          {"total_bytes", total_bytes},
          {"seconds", seconds},
          {"peak_rss_bytes", peak_rss_bytes},
          {"proxy_err", proxy},
          {"dense_format", std::string(dense_format_name(dense_format))},
          {"dense_linears", dense_linears},
          {"mxfp8",
           {{"linears", mx_layers.size()},
            {"source_bytes", mxfp8_source_bytes()},
            {"mxfp8_bytes", mxfp8_bytes()},
            {"saved_bytes", mxfp8_source_bytes() - mxfp8_bytes()},
            {"layers", mx_layers}}}};
}

}  // namespace exl3::quant
