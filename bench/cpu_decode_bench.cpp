// CPU decode throughput: single-core tile decode per K x codebook (the cost floor of the CPU
// reference path), and the reference linear at decode-sized batches on 1 thread and all threads.
// Every figure is a rate (weights/s); compare against `memcpy` bandwidth measured in the same run.
#include <cstring>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>
#include <tbb/global_control.h>
#include <tbb/info.h>

#include "exl3/cpu/linear.hpp"
#include "exl3/trellis/bitstream.hpp"

namespace tr = exl3::trellis;

namespace {

std::vector<uint16_t> random_words(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> v(n);
  for (auto& w : v) w = static_cast<uint16_t>(rng());
  return v;
}

// Baseline: single-core memcpy of a 64 MiB buffer (bytes/s), to put decode rates in context.
void BM_Memcpy(benchmark::State& st) {
  const size_t n = 64u << 20;
  std::vector<char> a(n, 1), b(n);
  for (auto _ : st) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::DoNotOptimize(b.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * n));
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);

void BM_DecodeTile(benchmark::State& st) {
  const int K = static_cast<int>(st.range(0));
  const auto cb = static_cast<tr::Codebook>(st.range(1));
  const int tiles = 4096;
  const auto words = random_words(static_cast<size_t>(tiles) * tr::tile_words16(K), 7);
  alignas(32) float out[256];
  for (auto _ : st) {
    for (int t = 0; t < tiles; ++t) {
      exl3::cpu::decode_tile_f32(words.data() + static_cast<size_t>(t) * tr::tile_words16(K), K, cb, out);
      benchmark::DoNotOptimize(out);
    }
  }
  st.counters["weights/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * tiles * 256,
                                                benchmark::Counter::kIsRate);
  st.SetLabel(std::string(tr::codebook_name(cb)) + " " + exl3::cpu::decode_path_name());
}
BENCHMARK(BM_DecodeTile)->ArgsProduct({{2, 3, 4, 5, 6, 8}, {0, 1, 2}})->Unit(benchmark::kMillisecond);

// Reference linear, 4096x4096, m rows; threads = 1 or 0 (all cores).
void BM_LinearForward(benchmark::State& st) {
  const int64_t in = 4096, out = 4096, m = st.range(0);
  const int threads = static_cast<int>(st.range(1));
  const int K = 4;
  tbb::global_control gc(tbb::global_control::max_allowed_parallelism,
                         threads > 0 ? static_cast<size_t>(threads) : tbb::info::default_concurrency());
  const auto trellis = random_words(static_cast<size_t>(in / 16 * (out / 16) * 16 * K), 11);
  std::vector<uint16_t> suh(in, 0x2C00), svh(out, 0x3C00);
  exl3::cpu::LinearView v{trellis, in, out, K, tr::Codebook::kMcg, suh, svh, {}};
  std::vector<float> x(static_cast<size_t>(m * in), 0.5f), y(static_cast<size_t>(m * out));
  for (auto _ : st) {
    exl3::cpu::linear_forward(v, x.data(), exl3::cpu::ActDType::kF32, m, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["weights/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * in * out,
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LinearForward)->ArgsProduct({{1, 8, 32}, {1, 0}})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
