// Checkpoint summaries for `exl3 inspect`: the JSON document is the source, the text view is
// rendered from it so both always carry the same content.
#include "exl3/format/report.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace exl3 {

namespace {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string shape_str(const nlohmann::json& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i].get<int64_t>());
  return s + "]";
}

nlohmann::json model_summary(const ModelConfig& c) {
  nlohmann::json m = {{"architecture", c.architecture},
                      {"model_type", c.model_type},
                      {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"num_key_value_heads", c.num_key_value_heads},
                      {"head_dim", c.head_dim},
                      {"vocab_size", c.vocab_size},
                      {"num_experts", c.num_experts},
                      {"num_experts_per_tok", c.num_experts_per_tok},
                      {"moe_intermediate_size", c.moe_intermediate_size},
                      {"tie_word_embeddings", c.tie_word_embeddings}};
  m["quantization_config"] = c.quantization_config;
  return m;
}

}  // namespace

nlohmann::json checkpoint_report(const Checkpoint& ckpt) {
  nlohmann::json r;
  r["path"] = ckpt.path().string();
  r["model"] = ckpt.config() ? model_summary(*ckpt.config()) : nlohmann::json(nullptr);

  uint64_t exl3_bytes = 0;
  double weights = 0.0;
  std::map<int, int> bits_hist;
  std::map<std::string, int> cb_hist;
  nlohmann::json linears = nlohmann::json::array();
  for (const auto& l : ckpt.linears()) {
    nlohmann::json j = {{"name", l.prefix},
                        {"in_features", l.in_features},
                        {"out_features", l.out_features},
                        {"bits", l.bits},
                        {"codebook", trellis::codebook_name(l.codebook)},
                        {"rotation", std::string(rotation_name(l.rotation))},
                        {"bias", l.has_bias},
                        {"bytes", l.bytes},
                        {"bits_per_weight", l.bits_per_weight()}};
    if (l.expert) j["expert"] = {{"layer", l.expert->layer}, {"expert", l.expert->expert}, {"proj", l.expert->proj}};
    linears.push_back(std::move(j));
    exl3_bytes += l.bytes;
    weights += static_cast<double>(l.in_features) * static_cast<double>(l.out_features);
    ++bits_hist[l.bits];
    ++cb_hist[trellis::codebook_name(l.codebook)];
  }
  r["linears"] = std::move(linears);

  uint64_t plain_bytes = 0;
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : ckpt.plain_tensors()) {
    tensors.push_back({{"name", t.name},
                       {"dtype", std::string(dtype_name(t.dtype))},
                       {"shape", t.shape},
                       {"bytes", t.bytes},
                       {"role", t.role}});
    plain_bytes += t.bytes;
  }
  r["tensors"] = std::move(tensors);

  nlohmann::json moe = nlohmann::json::array();
  for (const auto& m : ckpt.moe_layers()) {
    nlohmann::json hist = nlohmann::json::object();
    for (const auto& [k, n] : m.bits_histogram) hist[std::to_string(k)] = n;
    moe.push_back({{"layer", m.layer}, {"num_experts", m.num_experts}, {"bits_histogram", hist}});
  }
  r["moe_layers"] = std::move(moe);

  nlohmann::json bh = nlohmann::json::object(), ch = nlohmann::json::object();
  for (const auto& [k, n] : bits_hist) bh[std::to_string(k)] = n;
  for (const auto& [k, n] : cb_hist) ch[k] = n;
  r["totals"] = {{"exl3_linears", ckpt.linears().size()},
                 {"exl3_bytes", exl3_bytes},
                 {"exl3_weights", weights},
                 {"exl3_bits_per_weight", weights > 0 ? 8.0 * static_cast<double>(exl3_bytes) / weights : 0.0},
                 {"plain_tensors", ckpt.plain_tensors().size()},
                 {"plain_bytes", plain_bytes},
                 {"total_bytes", exl3_bytes + plain_bytes},
                 {"bits_histogram", bh},
                 {"codebook_histogram", ch}};
  return r;
}

std::string render_report_text(const nlohmann::json& r) {
  std::string out = fmt::format("checkpoint: {}\n", r["path"].get<std::string>());
  if (!r["model"].is_null()) {
    const auto& m = r["model"];
    out += fmt::format("model: {} ({}), hidden {}, layers {}, heads {}/{} kv, vocab {}\n",
                       m["architecture"].get<std::string>(), m["model_type"].get<std::string>(),
                       m["hidden_size"].get<int64_t>(), m["num_hidden_layers"].get<int64_t>(),
                       m["num_attention_heads"].get<int64_t>(), m["num_key_value_heads"].get<int64_t>(),
                       m["vocab_size"].get<int64_t>());
    if (m["num_experts"].get<int64_t>() > 0) {
      out += fmt::format("moe: {} experts, top-{}, expert intermediate {}\n", m["num_experts"].get<int64_t>(),
                         m["num_experts_per_tok"].get<int64_t>(), m["moe_intermediate_size"].get<int64_t>());
    }
    const auto& q = m["quantization_config"];
    if (q.is_object()) out += fmt::format("quantization_config: {}\n", q.dump());
  }

  const auto& linears = r["linears"];
  size_t w = 4;
  for (const auto& l : linears) w = std::max(w, l["name"].get<std::string>().size());
  out += fmt::format("\nEXL3 linears ({}):\n", linears.size());
  if (!linears.empty()) {
    out += fmt::format("  {:<{}}  {:>7} {:>7} {:>2} {:<5} {:<8} {:>4} {:>12} {:>7}\n", "name", w, "in", "out", "K",
                       "cb", "rotation", "bias", "bytes", "bpw");
  }
  for (const auto& l : linears) {
    out += fmt::format("  {:<{}}  {:>7} {:>7} {:>2} {:<5} {:<8} {:>4} {:>12} {:>7.3f}\n",
                       l["name"].get<std::string>(), w, l["in_features"].get<int64_t>(),
                       l["out_features"].get<int64_t>(), l["bits"].get<int>(), l["codebook"].get<std::string>(),
                       l["rotation"].get<std::string>(), l["bias"].get<bool>() ? "yes" : "no",
                       l["bytes"].get<uint64_t>(), l["bits_per_weight"].get<double>());
  }

  const auto& tensors = r["tensors"];
  w = 4;
  for (const auto& t : tensors) w = std::max(w, t["name"].get<std::string>().size());
  out += fmt::format("\nunquantized tensors ({}):\n", tensors.size());
  for (const auto& t : tensors) {
    out += fmt::format("  {:<{}}  {:<7} {:<16} {:>12}  {}\n", t["name"].get<std::string>(), w,
                       t["dtype"].get<std::string>(), shape_str(t["shape"]), t["bytes"].get<uint64_t>(),
                       t["role"].get<std::string>());
  }

  if (!r["moe_layers"].empty()) {
    out += "\nMoE layers:\n";
    // The expert layout, when the MoE layer (exl3::moe::annotate_report) has described it.
    if (const auto it = r.find("moe"); it != r.end() && it->is_object()) {
      const auto& moe = *it;
      std::string ks;
      for (const auto& k : moe["k_values"]) ks += fmt::format("{}K{}", ks.empty() ? "" : ",", k.get<int>());
      out += fmt::format("  layout {}, TP {}, {} experts/layer, {} MoE layer(s), {} {} (from {})\n",
                         moe["layout"].get<std::string>(), moe["tp"].get<int>(),
                         moe["experts_per_layer"].get<int>(), moe["layers"].get<size_t>(),
                         moe["mixed"].get<bool>() ? "mixed" : "uniform", ks,
                         moe["bits_source"].get<std::string>());
    }
    for (const auto& m : r["moe_layers"]) {
      std::string hist;
      for (const auto& [k, n] : m["bits_histogram"].items()) hist += fmt::format(" K{}x{}", k, n.get<int>());
      std::string layout;
      if (m.contains("layout")) {
        layout = fmt::format("; {}, TP {} ({} ranks present), tiers {}", m["layout"].get<std::string>(),
                             m["tp"].get<int>(), m["ranks_present"].get<size_t>(),
                             m["tier_signature_text"].get<std::string>());
      }
      out += fmt::format("  layer {:>3}: {} experts,{}{}\n", m["layer"].get<int>(), m["num_experts"].get<int>(),
                         hist, layout);
    }
  }

  const auto& t = r["totals"];
  out += fmt::format("\ntotals: {} EXL3 linears, {} ({:.3f} bits/weight over {:.0f} weights); {} unquantized tensors, {}; "
                     "all {}\n",
                     t["exl3_linears"].get<size_t>(), human_bytes(t["exl3_bytes"].get<uint64_t>()),
                     t["exl3_bits_per_weight"].get<double>(), t["exl3_weights"].get<double>(),
                     t["plain_tensors"].get<size_t>(), human_bytes(t["plain_bytes"].get<uint64_t>()),
                     human_bytes(t["total_bytes"].get<uint64_t>()));
  return out;
}

}  // namespace exl3
