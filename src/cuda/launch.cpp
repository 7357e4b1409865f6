// The process-wide launch switch (exl3/cuda/launch.hpp).
#include "exl3/cuda/launch.hpp"

#include <atomic>

namespace exl3::cuda {
namespace {
std::atomic<bool> g_programmatic{true};
}  // namespace

void set_programmatic_launch(bool on) {
  g_programmatic.store(on, std::memory_order_relaxed);
}

bool programmatic_launch() {
  return g_programmatic.load(std::memory_order_relaxed);
}

}  // namespace exl3::cuda
