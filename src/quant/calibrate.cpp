// Calibrated conversion, layer by layer (see calibrate.hpp). The hidden states of all
// calibration rows, [rows * length, hidden] fp32, stay in memory. For decoder layer L:
//   1. run L with its ORIGINAL weights over a copy of the states, capturing H = X^T X of every
//      linear's input (HessianCapture as the DecoderLayer's observer);
//   2. quantize (stage) every item of L, EXL3 linears with their H through LDLQ;
//   3. build L again from its staged output tensors only -- exactly what the finished
//      checkpoint will hold -- and run it over the states: the next layer's inputs carry this
//      layer's quantization error, as in exllamav3;
//   4. write the states to OUT/.exl3-partial/states_L.safetensors (atomic), drop states_{L-1}.
// A resumed run starts after the last layer whose items are all staged and whose states file
// exists; a layer cut short is captured again from the previous states, which gives the same
// Hessians (every step is deterministic), so the output bytes equal an uninterrupted run's.
// lm_head's H comes from the final-norm outputs.
#include "quant/calibrate.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/runtime/cpu_ops.hpp"
#include "exl3/runtime/linear.hpp"
#include "exl3/text/tokenizer.hpp"
#include "quant/convert_internal.hpp"

namespace exl3::quant::detail {

namespace {

// Decoder layer of a `model.layers.{L}.` name, else -1.
int layer_of(const std::string& name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return -1;
  const char* b = name.data() + kPrefix.size();
  const char* e = name.data() + name.size();
  int l = -1;
  const auto [p, ec] = std::from_chars(b, e, l);
  return (ec == std::errc() && p != b && p < e && *p == '.') ? l : -1;
}

fs::path states_file(const fs::path& work, int layer) {
  return work / fmt::format("states_{}.safetensors", layer);
}

// The states after a layer, and for DSA models each row's token selection as the layers hand
// it on ([rows, length, widest selection] int32, -1 past a position's own), so a resumed run
// gives shared-indexer layers what they would have had.
void save_states(const fs::path& file, const std::vector<float>& x, int64_t tokens, int64_t hidden,
                 const std::vector<runtime::DsaSelection>& dsa) {
  SafetensorsWriter w;
  w.add("states", DType::kF32, {tokens, hidden}, std::span<const float>(x));
  std::vector<int32_t> sel;
  if (!dsa.empty()) {
    size_t width = 1;
    for (const auto& row : dsa)
      for (const auto& pos : row) width = std::max(width, pos.size());
    const int64_t length = tokens / static_cast<int64_t>(dsa.size());
    sel.assign(static_cast<size_t>(tokens) * width, -1);
    for (size_t r = 0; r < dsa.size(); ++r) {
      for (size_t p = 0; p < dsa[r].size(); ++p) {
        std::copy(dsa[r][p].begin(), dsa[r][p].end(),
                  sel.begin() +
                      static_cast<std::ptrdiff_t>((r * static_cast<size_t>(length) + p) * width));
      }
    }
    w.add("dsa_selection", DType::kI32,
          {static_cast<int64_t>(dsa.size()), length, static_cast<int64_t>(width)},
          std::span<const int32_t>(sel));
  }
  w.write(file);
}

// The states after `layer` (and the DSA selections into `dsa` when it has rows), or empty when
// the file is missing or has another shape.
std::vector<float> load_states(const fs::path& file, int64_t tokens, int64_t hidden,
                               std::vector<runtime::DsaSelection>& dsa) {
  if (!fs::exists(file)) return {};
  const auto store = TensorStore::open(file);
  const auto* ref = store.find("states");
  if (ref == nullptr || ref->info->dtype != DType::kF32 ||
      ref->info->shape != std::vector<int64_t>{tokens, hidden}) {
    return {};
  }
  if (!dsa.empty()) {
    const auto rows = static_cast<int64_t>(dsa.size()), length = tokens / rows;
    const auto* sel = store.find("dsa_selection");
    if (sel == nullptr || sel->info->dtype != DType::kI32 || sel->info->rank() != 3 ||
        sel->info->shape[0] != rows || sel->info->shape[1] != length || sel->info->shape[2] < 1) {
      return {};
    }
    const auto width = static_cast<size_t>(sel->info->shape[2]);
    const auto v = copy_tensor<int32_t>(*sel);
    for (int64_t r = 0; r < rows; ++r) {
      auto& row = dsa[static_cast<size_t>(r)];
      row.assign(static_cast<size_t>(length), {});
      for (int64_t p = 0; p < length; ++p) {
        const auto* e = v.data() + (static_cast<size_t>(r * length + p)) * width;
        for (size_t i = 0; i < width && e[i] >= 0; ++i) row[static_cast<size_t>(p)].push_back(e[i]);
      }
    }
  }
  return copy_tensor<float>(*ref);
}

// `text` as token ids of in_dir/tokenizer.json (with its special tokens, e.g. a BOS); an empty
// text is refused, naming it.
std::vector<int32_t> encode_calibration_text(const fs::path& in_dir, std::string_view text,
                                             const std::string& label) {
  if (text.empty())
    fail("calibration text '{}' is empty; hint: give a text file with a few KB of text", label);
  return Tokenizer::load(in_dir).encode(text, true);
}

}  // namespace

int64_t calibration_rows_for(const fs::path& in_dir, std::string_view text,
                             const std::string& label, int64_t length) {
  if (length <= 0) fail("calibration: rows of {} tokens; must be positive", length);
  const auto tokens = static_cast<int64_t>(encode_calibration_text(in_dir, text, label).size());
  if (tokens < length) {
    fail(
        "calibration text '{}' gives {} tokens, less than one row of {}; hint: lower "
        "--calibration-length or give a longer text",
        label, tokens, length);
  }
  return std::min(tokens / length, kMaxAutoCalibrationRows);
}

std::vector<int32_t> calibration_tokens(const fs::path& in_dir, std::string_view text,
                                        const std::string& label, int64_t rows, int64_t length,
                                        int64_t vocab_size) {
  if (rows <= 0 || length <= 0) {
    fail("calibration: {} rows x {} tokens; both must be positive", rows, length);
  }
  std::vector<int32_t> ids = encode_calibration_text(in_dir, text, label);
  const int64_t need = rows * length;
  if (static_cast<int64_t>(ids.size()) < need) {
    fail(
        "calibration text '{}' gives {} tokens, but {} rows x {} tokens need {}; hint: lower "
        "--calibration-rows / --calibration-length or give a longer text",
        label, ids.size(), rows, length, need);
  }
  ids.resize(static_cast<size_t>(need));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      fail(
          "calibration text '{}': token {} has id {}, outside the model's vocabulary 0..{} "
          "(tokenizer.json and config.json disagree)",
          label, i, ids[i], vocab_size - 1);
    }
  }
  return ids;
}

void accumulate_xtx(HessianCapture::Sum& s, const float* x, int64_t m) {
  const int64_t n = s.in;
  // Column-major fp64 copy so each (i, j) is one contiguous dot product.
  std::vector<double> xt(static_cast<size_t>(n * m));
  for (int64_t t = 0; t < m; ++t)
    for (int64_t i = 0; i < n; ++i) xt[static_cast<size_t>(i * m + t)] = x[t * n + i];
  tbb::parallel_for(int64_t{0}, n, [&](int64_t i) {
    const double* a = xt.data() + i * m;
    for (int64_t j = 0; j <= i; ++j) {
      const double* b = xt.data() + j * m;
      double acc = 0.0;
      for (int64_t t = 0; t < m; ++t) acc += a[t] * b[t];
      s.xtx[static_cast<size_t>(i * n + j)] += acc;
    }
  });
  s.count += m;
}

void HessianCapture::observe(std::span<const std::string> linears, const float* x, int64_t m,
                             int64_t in) {
  if (linears.empty() || m <= 0) return;
  auto& slot = sums_[linears[0]];
  if (!slot) {
    slot = std::make_shared<Sum>();
    slot->in = in;
    slot->xtx.assign(static_cast<size_t>(in * in), 0.0);
  }
  if (slot->in != in)
    fail("calibration: linear '{}' saw inputs of width {} and {}", linears[0], slot->in, in);
  for (const auto& l : linears) sums_[l] = slot;
  accumulate_xtx(*slot, x, m);
}

const HessianCapture::Sum* HessianCapture::find(const std::string& linear) const {
  const auto it = sums_.find(linear);
  return it == sums_.end() ? nullptr : it->second.get();
}

std::vector<double> HessianCapture::mean(const std::string& linear) const {
  const Sum* s = find(linear);
  if (s == nullptr || s->count == 0) return {};
  const int64_t n = s->in;
  std::vector<double> h(static_cast<size_t>(n * n));
  const double inv = 1.0 / static_cast<double>(s->count);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j)
      h[static_cast<size_t>(i * n + j)] = h[static_cast<size_t>(j * n + i)] =
          s->xtx[static_cast<size_t>(i * n + j)] * inv;
  return h;
}

void run_layer_rows(const runtime::DecoderLayer& layer, std::vector<float>& states, int64_t rows,
                    int64_t length, int64_t hidden, runtime::LinearObserver* observer,
                    std::vector<runtime::DsaSelection>* dsa) {
  for (int64_t r = 0; r < rows; ++r) {
    layer.forward_sequence(states.data() + r * length * hidden, length, observer,
                           dsa != nullptr ? &(*dsa)[static_cast<size_t>(r)] : nullptr);
  }
}

void run_calibrated(const CalibratedRun& r) {
  const ConversionPlan& plan = *r.plan;
  const ConvertOptions& o = *r.options;
  const Checkpoint src = Checkpoint::open(r.in_dir);
  const runtime::ModelSpec spec = runtime::describe_model(src);
  const int64_t hidden = spec.hidden_size, rows = o.calibration_rows, len = o.calibration_length;
  const int64_t tokens = rows * len;
  const auto n_items = static_cast<int64_t>(plan.items.size());

  // Items of each decoder layer (contiguous in plan order); everything else runs uncalibrated
  // except lm_head, whose H is taken after the last layer.
  std::vector<std::vector<int64_t>> layer_items(static_cast<size_t>(spec.num_layers()));
  std::vector<int64_t> before, after;
  for (int64_t i = 0; i < n_items; ++i) {
    const int l = layer_of(plan.items[static_cast<size_t>(i)].name);
    if (l >= 0 && l < spec.num_layers()) {
      layer_items[static_cast<size_t>(l)].push_back(i);
    } else if (l < 0 && plan.items[static_cast<size_t>(i)].name.starts_with("model.embed_tokens")) {
      before.push_back(i);
    } else {
      after.push_back(i);
    }
  }
  auto all_done = [&](const std::vector<int64_t>& items) {
    return std::all_of(items.begin(), items.end(), r.item_done);
  };

  for (const int64_t i : before) r.run_item(i, nullptr);

  // DSA models: each row's token selection, handed from a full-indexer layer to the shared ones
  // after it (both passes of a layer read it; the quantized pass leaves what the next layers see).
  const bool dsa_model = std::any_of(spec.layers.begin(), spec.layers.end(),
                                     [](const auto& ls) { return ls.dsa_indexer() != nullptr; });
  std::vector<runtime::DsaSelection> dsa(dsa_model ? static_cast<size_t>(rows) : 0);
  auto* carry = dsa_model ? &dsa : nullptr;

  // Resume point: the last layer whose items are staged and whose output states were saved.
  int start = 0;
  std::vector<float> x;
  for (int l = static_cast<int>(spec.num_layers()) - 1; l >= 0; --l) {
    bool done = true;
    for (int k = 0; k <= l && done; ++k) done = all_done(layer_items[static_cast<size_t>(k)]);
    if (!done) continue;
    x = load_states(states_file(r.work_dir, l), tokens, hidden, dsa);
    if (!x.empty()) {
      start = l + 1;
      break;
    }
  }
  if (start == 0) {
    const auto ids = calibration_tokens(r.in_dir, o.calibration_text, o.calibration_label, rows,
                                        len, spec.vocab_size);
    const auto embed = runtime::DenseMatrix::load(src.store(), spec.embed_tokens, 0, hidden);
    // As the runtime's embedding op: Gemma scales the looked-up rows.
    const float scale = model::embedding_scale(spec, src.store().at(spec.embed_tokens).info->dtype);
    x.resize(static_cast<size_t>(tokens * hidden));
    for (int64_t t = 0; t < tokens; ++t)
      embed.row(ids[static_cast<size_t>(t)], x.data() + t * hidden);
    for (auto& v : x) v *= scale;
  }

  // Layers finished by an earlier run: their items report as resumed.
  for (int l = 0; l < start; ++l)
    for (const int64_t i : layer_items[static_cast<size_t>(l)]) r.run_item(i, nullptr);

  HessianCapture capture;
  for (int l = start; l < spec.num_layers(); ++l) {
    const double t0 = now_seconds();
    const auto& ls = spec.layers[static_cast<size_t>(l)];
    const auto& items = layer_items[static_cast<size_t>(l)];
    {
      const runtime::DecoderLayer original(src, spec, ls, nullptr);
      std::vector<float> scratch = x;
      run_layer_rows(original, scratch, rows, len, hidden, &capture, carry);
    }
    for (const int64_t i : items) {
      const auto h = capture.mean(plan.items[static_cast<size_t>(i)].name);
      r.run_item(i, h.empty() ? nullptr : &h);
    }
    capture.clear();
    {
      std::vector<std::shared_ptr<const SafetensorsFile>> files;
      for (const int64_t i : items) files.push_back(SafetensorsFile::open(r.unit_file(i)));
      const Checkpoint quantized = Checkpoint::from_store(
          TensorStore::from_files(std::move(files), r.work_dir), std::nullopt, r.work_dir);
      const runtime::DecoderLayer q(quantized, spec, ls, nullptr);
      run_layer_rows(q, x, rows, len, hidden, nullptr, carry);
    }
    save_states(states_file(r.work_dir, l), x, tokens, hidden, dsa);
    if (l > 0) fs::remove(states_file(r.work_dir, l - 1));
    if (o.progress) {
      ProgressEvent ev;
      ev.stage = ProgressEvent::Stage::kLayer;
      ev.index = l + 1;
      ev.total = spec.num_layers();
      ev.name = ls.prefix;
      ev.seconds = now_seconds() - t0;
      ev.elapsed = now_seconds() - r.started;
      ev.tokens_per_s = 2.0 * static_cast<double>(tokens) / std::max(ev.seconds, 1e-9);
      o.progress(ev);
    }
  }

  // lm_head: H of the final-norm outputs (only needed while it is still to be staged).
  std::vector<double> head_h;
  for (const int64_t i : after) {
    const PlanItem& it = plan.items[static_cast<size_t>(i)];
    if (it.kind == PlanItem::Kind::kExl3Linear && it.role == LinearRole::kHead && !r.item_done(i)) {
      std::vector<float> h(x.size());
      runtime::cpu_ops::rms_norm(x.data(),
                                 runtime::load_vector(src.store(), spec.final_norm, hidden).data(),
                                 tokens, hidden, spec.rms_norm_eps, h.data());
      HessianCapture::Sum s;
      s.in = hidden;
      s.xtx.assign(static_cast<size_t>(hidden * hidden), 0.0);
      accumulate_xtx(s, h.data(), tokens);
      head_h.resize(s.xtx.size());
      for (int64_t a = 0; a < hidden; ++a)
        for (int64_t b = 0; b <= a; ++b)
          head_h[static_cast<size_t>(a * hidden + b)] =
              head_h[static_cast<size_t>(b * hidden + a)] =
                  s.xtx[static_cast<size_t>(a * hidden + b)] / static_cast<double>(tokens);
    }
    r.run_item(i, head_h.empty() || it.role != LinearRole::kHead ? nullptr : &head_h);
  }
}

}  // namespace exl3::quant::detail
