// Progress of loading a model into an engine: one report per decoder layer loaded (the layers
// hold nearly all the bytes), so front ends can draw a bar over a load that takes minutes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>

namespace exl3::runtime {

struct LoadProgress {
  int64_t layers_done = 0;
  int64_t layers_total = 0;
  double elapsed = 0.0;  // seconds since the engine started loading
};
using LoadProgressFn = std::function<void(const LoadProgress&)>;

// A bar redrawn in place with the ETA when `terminal`; otherwise (logs) one plain line per
// quarter of the layers once the load has taken a second, "loaded layer 12/48 (25%) in 9.8 s".
LoadProgressFn make_load_progress_printer(std::FILE* out, bool terminal);

// Calls `fn` (when set) after each of `total` layers; the clock starts at construction.
class LoadProgressReporter {
 public:
  LoadProgressReporter(const LoadProgressFn& fn, int64_t total);
  void layer_done();

 private:
  const LoadProgressFn& fn_;
  int64_t total_ = 0, done_ = 0;
  double start_ = 0.0;
};

}  // namespace exl3::runtime
