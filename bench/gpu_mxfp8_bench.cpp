// exl3_bench_mxfp8: the CUDA MXFP8 linear (Mxfp8LinearCuda) against cuBLAS BF16 GEMM on the
// same (m, k, n), all measured in the same run, plus the device copy bandwidth. Both MXFP8 paths
// are timed at every m the GEMV takes (m <= 64), so the gemv_max_m crossover is read off the
// table; the default path's time is the one compared with cuBLAS.
//
// Timing: GpuTimer (each call queued behind a short GPU spin, CUDA events, median of --reps).
// Weights rotate through enough distinct random sets (>= 512 MiB together, for both formats)
// that they are never L2-resident. Data: random E4M3 codes (NaN codes excluded), UE8M0 scales
// in 2^-17..2^-2, x ~ N(0, 1) in BF16. Output BF16 for both.
//
//   exl3_bench_mxfp8 --shapes 4096x4096,8192x28672 --m 1,16,128,4096 --json mxfp8.json
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "exl3/cuda/bench_timer.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/mxfp8.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/half.hpp"

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    v.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return v;
}

using exl3::cuda::DeviceBuffer;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MXFP8 linear benchmark: exl3 MXFP8 kernels vs cuBLAS BF16 (same run)"};
  std::string shapes_s = "2048x4096,4096x2048,4096x4096,6144x2048,2048x6144,8192x28672,28672x8192";
  std::string m_s = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096", json_path;
  int reps = 30;
  exl3::cuda::Mxfp8Options base;
  app.add_option("--shapes", shapes_s, "Comma list of KxN (in x out features; K % 32 == 0)")
      ->capture_default_str();
  app.add_option("--m", m_s, "Comma list of row counts")->capture_default_str();
  app.add_option("--reps", reps, "Timed repetitions per case (median reported)")
      ->capture_default_str();
  app.add_option("--gemv-max-m", base.gemv_max_m,
                 "Largest m on the tensor-core GEMV (0..64; above: dequant + cuBLAS)")
      ->capture_default_str();
  app.add_option("--split-k", base.split_k,
                 "GEMV split-K (0 = planned from the shape and the SM count)")
      ->capture_default_str();
  app.add_option("--json", json_path,
                 "Write all results to this JSON file; each case carries the layer's plan at its m "
                 "(\"plan\": path, split-K, workspace carve; docs/cuda-linear.md)");
  app.footer(
      "Prints, per shape and m: the time of the path --gemv-max-m picks, the tensor-core GEMV and "
      "the\n"
      "dequant + cuBLAS path separately (m <= 64), cuBLAS BF16, the speedup (cuBLAS / MXFP8; goal "
      ">= 1.7\n"
      "at m = 1 and >= 0.91 at m = 4096), the MXFP8 weight stream in GB/s and % of copy bandwidth, "
      "and\n"
      "the workspace. Memory: MXFP8 weights are 1.03125 bytes/weight vs 2 for BF16.\n\n"
      "Examples:\n"
      "  exl3_bench_mxfp8\n"
      "  exl3_bench_mxfp8 --shapes 8192x28672 --m 1,2,4,8,16 --reps 50 --json "
      "bench/results/mxfp8.json\n"
      "  exl3_bench_mxfp8 --gemv-max-m 64 --m 16,32,48,64   # move the cuBLAS crossover");
  CLI11_PARSE(app, argc, argv);

  try {
    cudaDeviceProp prop{};
    EXL3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    exl3::cuda::GpuTimer tm;
    const double copy_gbs = tm.copy_bandwidth_gbs();
    fmt::print("device: {} ({} SMs), copy bandwidth {:.0f} GB/s (read+write)\n", prop.name,
               prop.multiProcessorCount, copy_gbs);
    nlohmann::json out = {{"device", prop.name},
                          {"sms", prop.multiProcessorCount},
                          {"copy_gbs", copy_gbs},
                          {"reps", reps},
                          {"gemv_max_m", base.gemv_max_m},
                          {"split_k_option", base.split_k},
                          {"cases", nlohmann::json::array()}};
    std::vector<int64_t> ms;
    for (const auto& t : split(m_s)) ms.push_back(std::stoll(t));
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());
    // One cuBLAS handle and workspace for the baseline and the layers' cuBLAS path.
    exl3::cuda::CudaContext ctx;
    const auto cublas = [&] {
      cublasHandle_t h = ctx.cublas(tm.stream(), exl3::cuda::CudaContext::kCublasWorkspaceBytes);
      if (h == nullptr) throw exl3::Error("binding cuBLAS to the timer's stream failed");
      return h;
    };
    out["cublas_workspace_bytes"] = ctx.cublas_workspace_bytes();  // not in workspace_bytes

    for (const auto& shape : split(shapes_s)) {
      const int64_t k = std::stoll(shape.substr(0, shape.find('x'))),
                    n = std::stoll(shape.substr(shape.find('x') + 1));
      std::mt19937_64 rng(static_cast<uint64_t>(k * 131 + n));
      // BF16 baseline weights [n, k] (row-major, as the MXFP8 layer), rotated.
      const size_t wbytes = static_cast<size_t>(k * n) * 2;
      const int nb16 = static_cast<int>(std::clamp<size_t>((512ull << 20) / wbytes + 1, 2, 8));
      std::vector<DeviceBuffer> wb;
      {
        std::normal_distribution<float> nd(0.0f, 0.02f);
        std::vector<uint16_t> h(static_cast<size_t>(k * n));
        for (int i = 0; i < nb16; ++i) {
          for (auto& v : h) v = exl3::trellis::float_to_bf16(nd(rng));
          wb.emplace_back(wbytes, "a BF16 baseline weight");
          EXL3_CUDA_CHECK(cudaMemcpy(wb.back().get(), h.data(), wbytes, cudaMemcpyHostToDevice));
        }
      }
      const DeviceBuffer x(static_cast<size_t>(max_m * k) * 2, "the input"),
          y(static_cast<size_t>(max_m * n) * 2, "the output");
      {
        std::normal_distribution<float> nd;
        std::vector<uint16_t> h(static_cast<size_t>(max_m * k));
        for (auto& v : h) v = exl3::trellis::float_to_bf16(nd(rng));
        EXL3_CUDA_CHECK(cudaMemcpy(x.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
      }
      std::map<int64_t, double> cublas_us;
      for (int64_t m : ms) {
        const float alpha = 1.0f, beta = 0.0f;
        cublas_us[m] = tm.median_us(reps, [&](int r) {
          EXL3_CUDA_CHECK(cublasGemmEx(
              cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
              static_cast<int>(k), &alpha, wb[static_cast<size_t>(r % nb16)].get(), CUDA_R_16BF,
              static_cast<int>(k), x.get(), CUDA_R_16BF, static_cast<int>(k), &beta, y.get(),
              CUDA_R_16BF, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
      }
      wb.clear();

      // MXFP8 layers, rotated the same way: each set of planes as the default-path layer, the
      // all-GEMV layer and the all-cuBLAS layer.
      const size_t mbytes = static_cast<size_t>(k * n + k / 32 * n);
      const int nb8 = static_cast<int>(std::clamp<size_t>((512ull << 20) / mbytes + 1, 2, 16));
      exl3::cuda::Mxfp8Options opts = base, gemv_opts = base, cublas_opts = base;
      opts.max_m = gemv_opts.max_m = cublas_opts.max_m = max_m;
      gemv_opts.gemv_max_m = 64;
      cublas_opts.gemv_max_m = 0;
      std::vector<std::unique_ptr<exl3::cuda::Mxfp8LinearCuda>> layers, gemv_layers, cublas_layers;
      {
        std::vector<uint8_t> v(static_cast<size_t>(k * n)), s(static_cast<size_t>(k / 32 * n));
        std::uniform_int_distribution<int> sc(110, 125);
        for (int i = 0; i < nb8; ++i) {
          for (auto& c : v) {
            c = static_cast<uint8_t>(rng());
            if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
          }
          for (auto& c : s) c = static_cast<uint8_t>(sc(rng));
          layers.push_back(std::make_unique<exl3::cuda::Mxfp8LinearCuda>(
              ctx, "bench", v.data(), s.data(), k, n, nullptr, opts));
          gemv_layers.push_back(std::make_unique<exl3::cuda::Mxfp8LinearCuda>(
              ctx, "bench", v.data(), s.data(), k, n, nullptr, gemv_opts));
          cublas_layers.push_back(std::make_unique<exl3::cuda::Mxfp8LinearCuda>(
              ctx, "bench", v.data(), s.data(), k, n, nullptr, cublas_opts));
        }
      }
      const size_t ws_bytes =
          std::max({layers.front()->workspace_bytes(), gemv_layers.front()->workspace_bytes(),
                    cublas_layers.front()->workspace_bytes()});
      const DeviceBuffer ws(std::max<size_t>(ws_bytes, 1), "the workspace");
      const auto time_layers =
          [&](const std::vector<std::unique_ptr<exl3::cuda::Mxfp8LinearCuda>>& ls, int64_t m) {
            return tm.median_us(reps, [&](int r) {
              EXL3_CUDA_CHECK(ls[static_cast<size_t>(r % nb8)]->run(
                  x.get(), y.get(), exl3::cuda::DType::kBF16, m, ws.get(), ws_bytes, tm.stream()));
            });
          };
      fmt::print(
          "\n{}x{} (in x out): BF16 {:.1f} MiB, MXFP8 {:.1f} MiB (saves {:.1f} MiB, {:.1f}%), GEMV "
          "split-K {}, "
          "workspace {:.1f} MiB (+ the context's {:.0f} MiB cuBLAS workspace, shared)\n",
          k, n, wbytes / 1048576.0, mbytes / 1048576.0, (wbytes - mbytes) / 1048576.0,
          100.0 * (1.0 - static_cast<double>(mbytes) / static_cast<double>(wbytes)),
          layers.front()->gemv_split_k(), ws_bytes / 1048576.0,
          ctx.cublas_workspace_bytes() / 1048576.0);
      fmt::print("{:>6} {:>7} {:>10} {:>10} {:>8} {:>9} {:>7} {:>10} {:>10} {:>10}\n", "m", "path",
                 "mxfp8 us", "cublas us", "speedup", "w GB/s", "% copy", "ws MiB", "gemv us",
                 "dq+cb us");
      for (int64_t m : ms) {
        const double us = time_layers(layers, m);
        const bool both = m <= 64;
        const double gemv_us = both ? time_layers(gemv_layers, m) : 0.0;
        const double cb_us = both ? time_layers(cublas_layers, m) : us;
        const double gbs = static_cast<double>(mbytes) / (us * 1e-6) / 1e9;
        const auto path = layers.front()->path_for(m);
        const double speedup = cublas_us[m] / us;
        fmt::print(
            "{:>6} {:>7} {:>10.1f} {:>10.1f} {:>7.2f}x {:>9.0f} {:>6.1f}% {:>10.1f} {:>10} "
            "{:>10.1f}\n",
            m, exl3::cuda::mxfp8_path_name(path), us, cublas_us[m], speedup, gbs,
            100.0 * gbs / copy_gbs, layers.front()->workspace_bytes(m) / 1048576.0,
            both ? fmt::format("{:.1f}", gemv_us) : "-", cb_us);
        nlohmann::json c = {{"k", k},
                            {"n", n},
                            {"m", m},
                            {"path", exl3::cuda::mxfp8_path_name(path)},
                            {"mxfp8_us", us},
                            {"cublas_bf16_us", cublas_us[m]},
                            {"speedup", speedup},
                            {"weight_gbs", gbs},
                            {"pct_copy", 100.0 * gbs / copy_gbs},
                            {"bf16_bytes", wbytes},
                            {"mxfp8_bytes", mbytes},
                            {"workspace_bytes", layers.front()->workspace_bytes(m)},
                            {"dequant_cublas_us", cb_us},
                            {"gemv_split_k", layers.front()->gemv_split_k()},
                            {"plan", layers.front()->plan(m)}};
        if (both) c["gemv_us"] = gemv_us;
        out["cases"].push_back(c);
      }
    }
    if (!json_path.empty()) exl3::write_file_atomic(json_path, out.dump(2) + "\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exl3_bench_mxfp8: %s\n", e.what());
    return 1;
  }
}
