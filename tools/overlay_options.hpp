// The MXFP8 overlay options shared by the runtime commands (logits, generate):
// --overlay SPEC, --overlay-config FILE, --overlay-ignore NAME, and the load report.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "exl3/runtime/overlay.hpp"

namespace exl3::cli {

struct OverlayArgs {
  std::string spec, config;
  std::vector<std::string> ignore;
};

void add_overlay_options(CLI::App& app, OverlayArgs& args);
// The policy: the config file (when given), then --overlay's keys, plus --overlay-ignore entries.
runtime::OverlayPolicy overlay_policy(const OverlayArgs& args);
// One summary line on stderr (nothing without an overlay or stored MXFP8).
void print_overlay_summary(const runtime::OverlayReport& r);

}  // namespace exl3::cli
