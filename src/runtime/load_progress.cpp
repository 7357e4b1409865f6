// Load progress (see load_progress.hpp).
#include "exl3/runtime/load_progress.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace exl3::runtime {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

LoadProgressFn make_load_progress_printer(std::FILE* out, bool terminal) {
  if (!terminal) {
    // Logs get one line per quarter once a load has taken a second: enough to see a slow load
    // advance, never a line per layer, and nothing for the loads that finish at once.
    return [out](const LoadProgress& p) {
      const int64_t t = std::max<int64_t>(p.layers_total, 1);
      if (p.elapsed < 1.0) return;
      if ((p.layers_done * 4) / t == ((p.layers_done - 1) * 4) / t && p.layers_done != p.layers_total) return;
      fmt::print(out, "loaded layer {}/{} ({}%) in {:.1f} s\n", p.layers_done, p.layers_total,
                 p.layers_done * 100 / t, p.elapsed);
      std::fflush(out);
    };
  }
  return [out](const LoadProgress& p) {
    constexpr int kWidth = 30;
    const double frac = p.layers_total > 0 ? static_cast<double>(p.layers_done) / static_cast<double>(p.layers_total) : 1.0;
    const int fill = static_cast<int>(frac * kWidth);
    const double eta = frac > 0.0 ? p.elapsed / frac - p.elapsed : 0.0;
    fmt::print(out, "\r\x1b[K[{:=<{}}{:<{}}] loading layer {}/{}  {:.1f} s elapsed, ETA {:.0f} s", "", fill, "",
               kWidth - fill, p.layers_done, p.layers_total, p.elapsed, std::max(0.0, eta));
    if (p.layers_done == p.layers_total) fmt::print(out, "\n");
    std::fflush(out);
  };
}

LoadProgressReporter::LoadProgressReporter(const LoadProgressFn& fn, int64_t total)
    : fn_(fn), total_(total), start_(now_seconds()) {}

void LoadProgressReporter::layer_done() {
  ++done_;
  if (fn_) fn_({done_, total_, now_seconds() - start_});
}

}  // namespace exl3::runtime
