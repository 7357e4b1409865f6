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
  if (!terminal) return {};
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
