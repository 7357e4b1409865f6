// Conversion progress for front ends: a bar with ETA redrawn in place on a terminal, and one
// plain line per tensor otherwise (logs, CI, pipes), so both humans and scripts can follow.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "exl3/quant/convert.hpp"

namespace exl3::quant {

namespace {

std::string duration(double s) {
  if (s < 0.0) return "?";
  const auto t = static_cast<long long>(std::llround(s));
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string detail_of(const ProgressEvent& e) {
  if (e.resumed) return e.quantized ? fmt::format("K={} resumed", e.bits) : "resumed";
  if (e.quantized) return fmt::format("K={} proxy={:.4g} ({:.2f} s)", e.bits, e.proxy_err, e.seconds);
  if (e.mxfp8) return fmt::format("MXFP8 rel-L2 {:.3e} ({:.2f} s)", e.rel_l2, e.seconds);
  return "copied";
}

}  // namespace

ProgressFn make_progress_printer(std::FILE* out, bool terminal) {
  if (!terminal) {
    return [out](const ProgressEvent& e) {
      if (e.stage == ProgressEvent::Stage::kWrite) {
        fmt::print(out, "[write {}/{}] {}\n", e.index, e.total, e.name);
      } else if (e.stage == ProgressEvent::Stage::kLayer) {
        fmt::print(out, "[layer {}/{}] {} calibrated ({:.0f} tokens/s, {:.1f} s)\n", e.index, e.total,
                   e.name, e.tokens_per_s, e.seconds);
      } else {
        fmt::print(out, "[{}/{}] {} {}\n", e.index, e.total, e.name, detail_of(e));
      }
      std::fflush(out);
    };
  }
  return [out](const ProgressEvent& e) {
    constexpr int kWidth = 30;
    if (e.stage == ProgressEvent::Stage::kLayer) {
      fmt::print(out, "\r\x1b[Klayer {}/{} {} calibrated ({:.0f} tokens/s, {:.1f} s)\n", e.index,
                 e.total, e.name, e.tokens_per_s, e.seconds);
    } else if (e.stage == ProgressEvent::Stage::kWrite) {
      fmt::print(out, "\r\x1b[Kwriting {} ({}/{})", e.name, e.index, e.total);
      if (e.index == e.total) fmt::print(out, "\n");
    } else {
      const double frac = e.total > 0 ? static_cast<double>(e.index) / static_cast<double>(e.total) : 1.0;
      const int fill = static_cast<int>(frac * kWidth);
      fmt::print(out, "\r\x1b[K[{:=<{}}{:<{}}] {}/{} {:3.0f}%  {} elapsed, ETA {}  {} {}", "",
                 fill, "", kWidth - fill, e.index, e.total, 100.0 * frac, duration(e.elapsed),
                 duration(e.eta_seconds), e.name, detail_of(e));
      if (e.index == e.total) fmt::print(out, "\n");
    }
    std::fflush(out);
  };
}

}  // namespace exl3::quant
