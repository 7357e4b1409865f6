#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/report.hpp"
#include "exl3/moe/report.hpp"

namespace exl3::cli {

Runner add_inspect(CLI::App& app, Common&) {
  struct Opts {
    std::string path;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("PATH", o->path, "Checkpoint folder (config.json + *.safetensors) or one .safetensors file")
      ->required();
  app.add_flag("--json", o->json, "Print one JSON document (keys: model, linears, tensors, moe_layers, moe, totals)");
  app.footer(
      "Every EXL3 linear is found from its stored tensors (trellis + suh/svh or legacy su/sv) and fully\n"
      "validated; a malformed checkpoint is reported with the file and tensor at fault. MoE experts\n"
      "are shown with their layout (plain, or rank-sliced per_expert_v1 / shared_h_v1 from\n"
      "config.json's hybrid_tr3_tail), TP and per-expert K tiers.");
  return [o] {
    const auto ckpt = Checkpoint::open(o->path);
    auto report = checkpoint_report(ckpt);
    moe::annotate_report(report, ckpt);
    if (o->json) {
      fmt::print("{}\n", report.dump(2));
    } else {
      fmt::print("{}", render_report_text(report));
    }
    return 0;
  };
}

}  // namespace exl3::cli
