// exl3_bench_gemm: EXL3 linear (Exl3LinearCuda) vs cuBLAS BF16 GEMM and the device copy
// bandwidth, all measured in the same run on the same (m, k, n).
//
// Timing: each timed call is one CUDA graph replay (all kernels of one run) between two events,
// queued behind a ~50 us spin kernel so host launch gaps never show; median of --reps. Weights
// rotate through enough distinct random sets (>= 512 MiB together) that they are never
// L2-resident. Data: random trellis words (every bit pattern is a valid trellis), random-sign
// suh/svh with |.| in [0.05, 1], x ~ N(0, 1). No zeros anywhere.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "exl3/cuda/bench_timer.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/hadamard.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/half.hpp"

namespace tr = exl3::trellis;

namespace {

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    v.push_back(std::stoll(s.substr(p, q - p)));
    p = q + 1;
  }
  return v;
}

exl3::cuda::DeviceBuffer dalloc(size_t bytes) {
  return exl3::cuda::DeviceBuffer(bytes, "a benchmark buffer");
}

void fill_random(void* d, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> h((bytes + 7) / 8);
  for (auto& v : h) v = rng();
  EXL3_CUDA_CHECK(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice));
}

void fill_normal_16(void* d, size_t count, bool bf16, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> h(count);
  for (auto& v : h)
    v = bf16 ? tr::float_to_bf16(scale * nd(rng)) : tr::float_to_half(scale * nd(rng));
  EXL3_CUDA_CHECK(cudaMemcpy(d, h.data(), count * 2, cudaMemcpyHostToDevice));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "EXL3 GEMM benchmark: exl3 CUDA linear vs cuBLAS BF16 and copy bandwidth (same run)"};
  std::string shapes_s = "4096x4096,6144x2048,2048x6144,8192x28672", bits_s = "2,3,4,5,6,8",
              m_s = "1,2,4,8,16,32,64,128,256,1024,4096", cb_s = "mcg", json_path;
  int reps = 30;
  int64_t mma_max_m = 128, gemv_max_m = exl3::cuda::LinearOptions{}.gemv_max_m;
  app.add_option("--shapes", shapes_s, "Comma list of KxN (in x out features)")
      ->capture_default_str();
  app.add_option("--bits", bits_s, "Comma list of K")->capture_default_str();
  app.add_option("--m", m_s, "Comma list of row counts")->capture_default_str();
  app.add_option("--codebook", cb_s, "3inst | mcg | mul1")->capture_default_str();
  app.add_option("--reps", reps, "Timed repetitions per case (median reported)")
      ->capture_default_str();
  app.add_option("--gemv-max-m", gemv_max_m, "Largest m on the swap-AB GEMV path (0 = off)")
      ->capture_default_str();
  app.add_option("--mma-max-m", mma_max_m, "Largest m on the tensor-core paths (above: cuBLAS)")
      ->capture_default_str();
  app.add_option("--json", json_path,
                 "Write all results to this JSON file; each case carries the layer's plan at its m "
                 "(\"plan\": path, split-K, workspace carve; docs/cuda-linear.md)");
  std::string had_shape = "8192x8192";
  bool had_only = false;
  app.add_option("--hadamard", had_shape,
                 "ROWSxCOLS for the hadamard128_rows benchmark (empty = skip)")
      ->capture_default_str();
  app.add_flag("--hadamard-only", had_only, "Run only the Hadamard benchmark");
  CLI11_PARSE(app, argc, argv);
  const auto cb = cb_s == "mul1"    ? tr::Codebook::kMul1
                  : cb_s == "3inst" ? tr::Codebook::k3Inst
                                    : tr::Codebook::kMcg;

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
                          {"codebook", cb_s},
                          {"reps", reps},
                          {"cases", nlohmann::json::array()},
                          {"hadamard", nlohmann::json::array()}};
    if (!had_shape.empty()) {
      // hadamard128_rows with pre and post scales, each dtype pair that the linear paths use.
      const int64_t hr = std::stoll(had_shape.substr(0, had_shape.find('x')));
      const int64_t hc = std::stoll(had_shape.substr(had_shape.find('x') + 1));
      using exl3::cuda::DType;
      const auto hx = dalloc(static_cast<size_t>(hr * hc) * 4);
      const auto hy = dalloc(static_cast<size_t>(hr * hc) * 4);
      const auto hs = dalloc(static_cast<size_t>(hc) * 2);
      fill_normal_16(hx.get(), static_cast<size_t>(hr * hc) * 2, false, 5);
      fill_normal_16(hs.get(), static_cast<size_t>(hc), false, 6);
      const std::pair<DType, DType> pairs[] = {{DType::kF16, DType::kF16},
                                               {DType::kBF16, DType::kF16},
                                               {DType::kF32, DType::kF32},
                                               {DType::kF32, DType::kBF16}};
      const char* names[] = {"f16", "bf16", "f32"};
      for (const auto& [ti, to] : pairs) {
        const double us = tm.median_us(reps, [&](int) {
          EXL3_CUDA_CHECK(exl3::cuda::hadamard128_rows(hx.get(), ti, hy.get(), to, hr, hc,
                                                       hs.as<const uint16_t>(),
                                                       hs.as<const uint16_t>(), tm.stream()));
        });
        const double bytes =
            static_cast<double>(hr * hc) *
            static_cast<double>(exl3::cuda::dtype_size(ti) + exl3::cuda::dtype_size(to));
        const double gbs = bytes / (us * 1e-6) / 1e9;
        fmt::print(
            "hadamard128_rows {}x{} {}->{} (suh, svh): {:.1f} us  {:.0f} GB/s  {:.1f}% copy\n", hr,
            hc, names[static_cast<int>(ti)], names[static_cast<int>(to)], us, gbs,
            100.0 * gbs / copy_gbs);
        out["hadamard"].push_back({{"rows", hr},
                                   {"cols", hc},
                                   {"in", names[static_cast<int>(ti)]},
                                   {"out", names[static_cast<int>(to)]},
                                   {"us", us},
                                   {"gbs", gbs},
                                   {"pct_copy", 100.0 * gbs / copy_gbs}});
      }
    }
    if (had_only) {
      if (!json_path.empty()) exl3::write_file_atomic(json_path, out.dump(2) + "\n");
      return 0;
    }
    // One cuBLAS handle and workspace for the baseline and the layers' cuBLAS path.
    exl3::cuda::CudaContext ctx;
    const auto cublas = [&] {
      cublasHandle_t h = ctx.cublas(tm.stream(), exl3::cuda::CudaContext::kCublasWorkspaceBytes);
      if (h == nullptr) throw exl3::Error("binding cuBLAS to the timer's stream failed");
      return h;
    };
    const auto ms = parse_list(m_s);
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());

    for (const auto& shape : [&] {
           std::vector<std::pair<int64_t, int64_t>> v;
           size_t p = 0;
           while (p < shapes_s.size()) {
             size_t q = shapes_s.find(',', p);
             if (q == std::string::npos) q = shapes_s.size();
             const auto t = shapes_s.substr(p, q - p);
             v.emplace_back(std::stoll(t.substr(0, t.find('x'))),
                            std::stoll(t.substr(t.find('x') + 1)));
             p = q + 1;
           }
           return v;
         }()) {
      const auto [k, n] = shape;
      // cuBLAS BF16 baseline: rotate weights (>= 512 MiB in all) and inputs.
      const size_t wbytes = static_cast<size_t>(k * n) * 2;
      const int nb_bf16 = static_cast<int>(std::clamp<size_t>((512ull << 20) / wbytes + 1, 2, 8));
      std::vector<exl3::cuda::DeviceBuffer> wb;
      for (int i = 0; i < nb_bf16; ++i) {
        wb.push_back(dalloc(wbytes));
        fill_normal_16(wb.back().get(), static_cast<size_t>(k * n), true, 100 + i, 0.02f);
      }
      const auto xb = dalloc(static_cast<size_t>(max_m * k) * 2);
      const auto xh = dalloc(static_cast<size_t>(max_m * k) * 2);
      const auto yb = dalloc(static_cast<size_t>(max_m * n) * 4);
      fill_normal_16(xb.get(), static_cast<size_t>(max_m * k), true, 7);
      fill_normal_16(xh.get(), static_cast<size_t>(max_m * k), false, 8);
      std::map<int64_t, double> cublas_us;
      for (int64_t m : ms) {
        const float alpha = 1.0f, beta = 0.0f;
        cublas_us[m] = tm.median_us(reps, [&](int r) {
          EXL3_CUDA_CHECK(cublasGemmEx(
              cublas(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
              static_cast<int>(k), &alpha, wb[r % nb_bf16].get(), CUDA_R_16BF, static_cast<int>(n),
              xb.get(), CUDA_R_16BF, static_cast<int>(k), &beta, yb.get(), CUDA_R_16BF,
              static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
      }
      wb.clear();

      for (int64_t K : parse_list(bits_s)) {
        const size_t tbytes = static_cast<size_t>(k / 16 * (n / 16) * 16 * K) * 2;
        const int nb = static_cast<int>(std::clamp<size_t>((512ull << 20) / tbytes + 1, 2, 16));
        std::vector<std::unique_ptr<exl3::cuda::Exl3LinearCuda>> layers;
        exl3::cuda::LinearOptions opts;
        opts.max_m = max_m;
        opts.mma_max_m = mma_max_m;
        opts.gemv_max_m = gemv_max_m;
        std::mt19937_64 rng(1000 + K);
        std::uniform_real_distribution<float> mag(0.05f, 1.0f);
        for (int i = 0; i < nb; ++i) {
          std::vector<uint16_t> trellis(tbytes / 2), suh(k), svh(n);
          for (auto& w : trellis) w = static_cast<uint16_t>(rng());
          for (auto& v : suh) v = tr::float_to_half(((rng() & 1) ? -1.f : 1.f) * mag(rng));
          for (auto& v : svh) v = tr::float_to_half(((rng() & 1) ? -1.f : 1.f) * mag(rng));
          layers.push_back(std::make_unique<exl3::cuda::Exl3LinearCuda>(
              ctx, "bench", trellis.data(), k, n, static_cast<int>(K), cb, suh.data(), svh.data(),
              nullptr, opts));
        }
        const size_t ws_bytes = layers[0]->workspace_bytes();
        const auto ws = dalloc(ws_bytes);
        for (int64_t m : ms) {
          // One graph per weight set, so each timed call is one replay.
          std::vector<cudaGraphExec_t> graphs(nb);
          for (int i = 0; i < nb; ++i) {
            cudaGraph_t g;
            EXL3_CUDA_CHECK(cudaStreamBeginCapture(tm.stream(), cudaStreamCaptureModeThreadLocal));
            EXL3_CUDA_CHECK(layers[i]->run(xh.get(), exl3::cuda::DType::kF16, yb.get(),
                                           exl3::cuda::DType::kF16, m, ws.get(), ws_bytes,
                                           tm.stream()));
            EXL3_CUDA_CHECK(cudaStreamEndCapture(tm.stream(), &g));
            EXL3_CUDA_CHECK(cudaGraphInstantiate(&graphs[i], g, 0));
            EXL3_CUDA_CHECK(cudaGraphDestroy(g));
          }
          const double us = tm.median_us(
              reps, [&](int r) { EXL3_CUDA_CHECK(cudaGraphLaunch(graphs[r % nb], tm.stream())); });
          for (auto g : graphs) EXL3_CUDA_CHECK(cudaGraphExecDestroy(g));
          const double bytes =
              static_cast<double>(tbytes) + 2.0 * (k + n) + 2.0 * m * k + 2.0 * m * n;
          const double gbs = bytes / (us * 1e-6) / 1e9;
          const exl3::cuda::LinearPlan plan = layers[0]->plan(m);  // what the graphs ran
          const char* path = exl3::cuda::path_name(plan.path);
          const int splits = plan.split_k;
          const double vs_cublas = cublas_us[m] / us;
          fmt::print(
              "{:>5}x{:<5} K={} m={:<5} {:>9.1f} us  {:>6.0f} GB/s  {:>5.1f}% copy  {:>5.2f}x "
              "cuBLAS ({:.1f} us)  "
              "[{} split {}]\n",
              k, n, K, m, us, gbs, 100.0 * gbs / copy_gbs, vs_cublas, cublas_us[m], path, splits);
          out["cases"].push_back({{"k", k},
                                  {"n", n},
                                  {"bits", K},
                                  {"m", m},
                                  {"us", us},
                                  {"gbs", gbs},
                                  {"pct_copy", 100.0 * gbs / copy_gbs},
                                  {"cublas_bf16_us", cublas_us[m]},
                                  {"speedup_vs_cublas", vs_cublas},
                                  {"path", path},
                                  {"split_k", splits},
                                  {"plan", plan},
                                  {"weight_sets", nb}});
        }
      }
    }
    if (!json_path.empty()) exl3::write_file_atomic(json_path, out.dump(2) + "\n");
  } catch (const std::exception& e) {
    fmt::print(stderr, "exl3_bench_gemm: {}\n", e.what());
    return 1;
  }
  return 0;
}
