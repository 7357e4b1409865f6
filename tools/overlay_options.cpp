// --overlay / --overlay-config / --overlay-ignore and the overlay summary (overlay_options.hpp).
#include "overlay_options.hpp"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace exl3::cli {

void add_overlay_options(CLI::App& app, OverlayArgs& a) {
  app.add_option("--overlay", a.spec,
                 "Convert unquantized linears to MXFP8 at load: linear=mxfp8 (attention, dense MLP), "
                 "shared_experts=mxfp8, or both comma-separated. EXL3 layers, routed experts and lm_head "
                 "keep their format");
  app.add_option("--overlay-config", a.config,
                 "JSON overlay config: {\"linear\": {\"weight\": \"mxfp8\"}, \"shared_experts\": {\"weight\": "
                 "\"mxfp8\"}, \"ignore\": [\"NAME\", \"re:REGEX\"]}");
  app.add_option("--overlay-ignore", a.ignore,
                 "Keep this linear unquantized: a checkpoint prefix, a last name component (k_proj) or "
                 "re:REGEX (repeatable)");
}

runtime::OverlayPolicy overlay_policy(const OverlayArgs& a) {
  runtime::OverlayPolicy p = a.config.empty() ? runtime::OverlayPolicy{} : runtime::load_overlay_config(a.config);
  if (!a.spec.empty()) {
    const auto s = runtime::parse_overlay_spec(a.spec);
    if (a.spec.find("linear=") != std::string::npos) p.linear = s.linear;
    if (a.spec.find("shared_experts=") != std::string::npos) p.shared_experts = s.shared_experts;
  }
  p.ignore.insert(p.ignore.end(), a.ignore.begin(), a.ignore.end());
  return p;
}

void print_overlay_summary(const runtime::OverlayReport& r) {
  if (r.layers.empty() && r.kept_unquantized.empty()) return;
  size_t src = 0, mx = 0;
  double worst = 0.0;
  std::string worst_name;
  for (const auto& l : r.layers) {
    src += l.source_bytes;
    mx += l.mxfp8_bytes;
    if (l.rel_l2 > worst) {
      worst = l.rel_l2;
      worst_name = l.name;
    }
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string line = fmt::format("overlay: {} linears as MXFP8, {:.2f} -> {:.2f} MiB (saved {:.2f} MiB)",
                                 r.layers.size(), src / kMiB, mx / kMiB, r.saved_bytes() / kMiB);
  if (!worst_name.empty()) line += fmt::format(", worst rel-L2 {:.3e} ({})", worst, worst_name);
  if (!r.kept_unquantized.empty()) {
    line += fmt::format("; kept unquantized: {}", r.kept_unquantized.size());
    const size_t show = std::min<size_t>(3, r.kept_unquantized.size());
    for (size_t i = 0; i < show; ++i) {
      line += fmt::format("{} {} ({})", i ? "," : "", r.kept_unquantized[i].first, r.kept_unquantized[i].second);
    }
    if (show < r.kept_unquantized.size()) line += ", ...";
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace exl3::cli
