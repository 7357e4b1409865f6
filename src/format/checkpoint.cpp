// Checkpoint::open (config files + tensor discovery) and prefix lookup.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"

namespace exl3 {
namespace fs = std::filesystem;
namespace {

// Edit distance, for "did you mean" suggestions; inputs are capped so a long name stays cheap.
size_t edit_distance(std::string_view a, std::string_view b) {
  a = a.substr(0, 160);
  b = b.substr(0, 160);
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string_view rotation_name(Rotation r) {
  return r == Rotation::kSuSv ? "su_sv" : "suh_svh";
}

double Exl3LinearInfo::bits_per_weight() const {
  const double weights = static_cast<double>(in_features) * static_cast<double>(out_features);
  return weights > 0 ? 8.0 * static_cast<double>(bytes) / weights : 0.0;
}

Checkpoint Checkpoint::open(const fs::path& path) {
  Checkpoint c;
  c.path_ = path;
  c.store_ = TensorStore::open(path);
  if (fs::is_directory(path)) {
    if (const auto cfg = path / "config.json"; fs::exists(cfg)) {
      c.config_ = parse_model_config(read_text_file(cfg), cfg.string());
    }
    if (const auto qc = path / "quantization_config.json"; fs::exists(qc)) {
      try {
        c.qconfig_file_ = nlohmann::json::parse(read_text_file(qc));
      } catch (const nlohmann::json::exception& e) {
        fail("{}: invalid JSON ({})", qc.string(), e.what());
      }
    }
  }
  DiscoveryResult d = discover_tensors(c.store_);
  c.linears_ = std::move(d.linears);
  c.plain_ = std::move(d.plain);
  c.moe_layers_ = std::move(d.moe_layers);
  return c;
}

Checkpoint Checkpoint::from_store(TensorStore store, std::optional<ModelConfig> config,
                                  const fs::path& path) {
  Checkpoint c;
  c.path_ = path;
  c.store_ = std::move(store);
  c.config_ = std::move(config);
  DiscoveryResult d = discover_tensors(c.store_);
  c.linears_ = std::move(d.linears);
  c.plain_ = std::move(d.plain);
  c.moe_layers_ = std::move(d.moe_layers);
  return c;
}

const Exl3LinearInfo* Checkpoint::find_linear(std::string_view prefix) const {
  const auto it =
      std::lower_bound(linears_.begin(), linears_.end(), prefix,
                       [](const Exl3LinearInfo& l, std::string_view p) { return l.prefix < p; });
  return (it != linears_.end() && it->prefix == prefix) ? &*it : nullptr;
}

const Exl3LinearInfo& Checkpoint::linear(std::string_view prefix) const {
  if (const Exl3LinearInfo* l = find_linear(prefix)) return *l;
  std::vector<std::pair<size_t, const std::string*>> ranked;
  ranked.reserve(linears_.size());
  for (const auto& l : linears_) ranked.emplace_back(edit_distance(prefix, l.prefix), &l.prefix);
  const size_t n = std::min<size_t>(5, ranked.size());
  std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(n), ranked.end());
  std::vector<std::string> close;
  for (size_t i = 0; i < n; ++i) close.push_back("'" + *ranked[i].second + "'");
  if (close.empty())
    fail("{}: no EXL3 linear '{}' (the checkpoint has no EXL3 linears)", path_.string(), prefix);
  fail("{}: no EXL3 linear '{}'; closest known: {}", path_.string(), prefix,
       fmt::join(close, ", "));
}

}  // namespace exl3
