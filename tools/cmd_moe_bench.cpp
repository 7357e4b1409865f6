// `exl3 moe-bench`: the fused CUDA MoE layer at a model's per-rank geometry against the device
// copy bandwidth and a BF16 cuBLAS grouped-GEMM baseline on the same routes, all in one run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "env_options.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"

#if defined(EXL3_HAVE_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "exl3/cuda/bench_timer.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/moe.hpp"
#include "exl3/moe/weights.hpp"
#include "exl3/trellis/half.hpp"
#endif

namespace exl3::cli {

namespace {

struct MoeBenchOptions {
  std::string geometry = "glm52";
  int64_t hidden = 0, intermediate = 0;
  int experts = 0, top_k = 0;
  std::string tiers = "3", layout = "shared_h", m_list = "1,2,4,8,16,32,64,256,1024,3072",
              json_path;
  int reps = 20;
  int64_t capacity = 0;
  uint64_t seed = 1;
  bool baseline = true;
};

#if defined(EXL3_HAVE_CUDA)

std::vector<int64_t> parse_int_list(const std::string& s, const char* what) {
  std::vector<int64_t> v;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    const std::string t = s.substr(p, q - p);
    try {
      size_t used = 0;
      v.push_back(std::stoll(t, &used));
      if (used != t.size()) throw std::invalid_argument(t);
    } catch (const std::exception&) {
      fail("{}: '{}' is not an integer (expected a comma list like 1,8,64)", what, t);
    }
    p = q + 1;
  }
  if (v.empty()) fail("{}: empty list", what);
  return v;
}

// "3" (uniform) or "3:148,4:108" (K:count pairs summing to the expert count) -> K per expert.
std::vector<int> parse_tiers(const std::string& s, int experts) {
  std::vector<int> bits;
  if (s.find(':') == std::string::npos) {
    const auto k = parse_int_list(s, "--tiers");
    if (k.size() != 1) fail("--tiers '{}': give one K or K:count pairs", s);
    bits.assign(static_cast<size_t>(experts), static_cast<int>(k[0]));
  } else {
    size_t p = 0;
    while (p < s.size()) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      const std::string t = s.substr(p, q - p);
      const size_t c = t.find(':');
      if (c == std::string::npos) fail("--tiers '{}': '{}' is not K:count", s, t);
      const int K = std::stoi(t.substr(0, c)), n = std::stoi(t.substr(c + 1));
      bits.insert(bits.end(), static_cast<size_t>(n), K);
      p = q + 1;
    }
  }
  if (static_cast<int>(bits.size()) != experts) {
    fail("--tiers '{}' covers {} experts, the geometry has {}", s, bits.size(), experts);
  }
  for (int K : bits) {
    if (K < 1 || K > 8) fail("--tiers '{}': K {} outside 1..8", s, K);
  }
  return bits;
}

// A synthetic layer in host memory: random trellis words (every pattern decodes), random-sign
// rotation vectors with |v| in [0.5, 1].
struct HostLayer {
  moe::MoeLayerWeights w;
};

std::unique_ptr<HostLayer> make_layer(int64_t H, int64_t I, const std::vector<int>& bits,
                                      bool shared_h, uint64_t seed) {
  auto L = std::make_unique<HostLayer>();
  auto& w = L->w;
  const int E = static_cast<int>(bits.size());
  w.layer = 0;
  w.hidden = H;
  w.intermediate = I;
  w.codebook = trellis::Codebook::kMcg;
  w.rotation = shared_h ? moe::RotationLayout::kSharedH : moe::RotationLayout::kPerExpert;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mag(0.5f, 1.0f);
  auto vec = [&](std::vector<uint16_t>& v, size_t n) {
    v.resize(n);
    for (auto& x : v) x = trellis::float_to_half(((rng() & 1) ? -1.0f : 1.0f) * mag(rng));
  };
  const int64_t h_rows = shared_h ? 1 : E;
  w.rotations.h_rows = h_rows;
  vec(w.rotations.gate_suh, static_cast<size_t>(h_rows * H));
  vec(w.rotations.up_suh, static_cast<size_t>(h_rows * H));
  vec(w.rotations.down_svh, static_cast<size_t>(h_rows * H));
  vec(w.rotations.intermediate, static_cast<size_t>(E) * 3 * I);
  w.experts.resize(static_cast<size_t>(E));
  w.trellis_copies.reserve(3 * static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    auto& ex = w.experts[static_cast<size_t>(e)];
    moe::ProjWeights* projs[3] = {&ex.gate, &ex.up, &ex.down};
    for (int p = 0; p < 3; ++p) {
      const int64_t in = p < 2 ? H : I, out = p < 2 ? I : H;
      const int K = bits[static_cast<size_t>(e)];
      auto& t = w.trellis_copies.emplace_back(static_cast<size_t>(in / 16 * (out / 16) * 16 * K));
      for (size_t i = 0; i + 4 <= t.size(); i += 4) {
        const uint64_t r = rng();
        std::memcpy(&t[i], &r, 8);
      }
      auto& pw = *projs[p];
      pw.trellis = t;
      pw.bits = K;
      pw.in_features = in;
      pw.out_features = out;
      const int64_t hrow = shared_h ? 0 : e;
      const auto& hs =
          p == 0 ? w.rotations.gate_suh : (p == 1 ? w.rotations.up_suh : w.rotations.down_svh);
      const std::span<const uint16_t> hside(hs.data() + hrow * H, static_cast<size_t>(H));
      const std::span<const uint16_t> iside(
          w.rotations.intermediate.data() + (static_cast<int64_t>(e) * 3 + p) * I,
          static_cast<size_t>(I));
      pw.suh = p < 2 ? hside : iside;
      pw.svh = p < 2 ? iside : hside;
    }
  }
  return L;
}

template <typename T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
  return cuda::DeviceBuffer::upload(v, "moe-bench data");
}

// One route set: k distinct uniformly random experts per token, positive weights summing to 1.
struct Routes {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
Routes random_routes(int64_t m, int k, int E, std::mt19937_64& rng) {
  Routes r;
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  std::vector<int> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < m; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    float sum = 0.0f;
    std::vector<float> w(static_cast<size_t>(k));
    for (int j = 0; j < k; ++j) {
      std::swap(perm[static_cast<size_t>(j)], perm[j + rng() % static_cast<size_t>(E - j)]);
      r.ids.push_back(perm[static_cast<size_t>(j)]);
      w[static_cast<size_t>(j)] = u(rng);
      sum += w[static_cast<size_t>(j)];
    }
    for (float v : w) r.weights.push_back(v / sum);
  }
  return r;
}

int run_moe_bench(const MoeBenchOptions& o) {
  int64_t H = 6144, I = 512;
  int E = 256, k = 8;
  if (o.geometry == "qwen3-30b-a3b") {
    H = 2048, I = 768, E = 128, k = 8;
  } else if (o.geometry != "glm52") {
    fail("--geometry '{}': expected glm52 or qwen3-30b-a3b", o.geometry);
  }
  if (o.hidden > 0) H = o.hidden;
  if (o.intermediate > 0) I = o.intermediate;
  if (o.experts > 0) E = o.experts;
  if (o.top_k > 0) k = o.top_k;
  if (o.layout != "shared_h" && o.layout != "per_expert")
    fail("--layout '{}': shared_h or per_expert", o.layout);
  const bool shared_h = o.layout == "shared_h";
  const auto bits = parse_tiers(o.tiers, E);
  const auto ms = parse_int_list(o.m_list, "--m");
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  const int64_t capacity = o.capacity > 0 ? o.capacity : max_m;
  if (max_m > capacity) fail("--m {} exceeds --capacity {}", max_m, capacity);

  cudaDeviceProp prop{};
  EXL3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0),
                  "moe-bench: no CUDA device (moe-bench runs on a GPU)");
  cuda::GpuTimer tm;
  const double copy_gbs = tm.copy_bandwidth_gbs();
  fmt::print("device: {} ({} SMs), copy bandwidth {:.0f} GB/s (read+write)\n", prop.name,
             prop.multiProcessorCount, copy_gbs);
  fmt::print("geometry: H={} I={} E={} top-{} tiers {} layout {} capacity {}\n", H, I, E, k,
             o.tiers, o.layout, capacity);

  // Layer copies so consecutive replays do not find the experts in L2.
  auto host = make_layer(H, I, bits, shared_h, o.seed);
  const uint64_t layer_bytes = host->w.trellis_bytes();
  const int copies = static_cast<int>(std::clamp<uint64_t>((1ull << 30) / layer_bytes + 1, 2, 8));
  cuda::MoeOptions mo = moe_options_from_env();
  mo.capacity = capacity;
  std::vector<std::unique_ptr<cuda::MoeLayerCuda>> layers;
  for (int i = 0; i < copies; ++i)
    layers.push_back(std::make_unique<cuda::MoeLayerCuda>(host->w, k, mo));
  const auto& L0 = *layers[0];
  const size_t arena_bytes = L0.arena_bytes();
  const cuda::DeviceBuffer arena(arena_bytes, "the MoE arena");
  fmt::print(
      "layer: {:.1f} MiB of trellis x {} copies; arena {:.1f} MiB (decode m <= {}, prefill chunk "
      "{}); "
      "decode split-K {}/{}\n",
      static_cast<double>(layer_bytes) / (1 << 20), copies,
      static_cast<double>(arena_bytes) / (1 << 20), mo.decode_max_m, L0.prefill_chunk(),
      L0.decode_splits().first, L0.decode_splits().second);

  // Expert bytes as stored (trellis + its rotation vectors) for the touched-bytes figure.
  std::vector<double> expert_bytes(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    const auto& ex = host->w.experts[static_cast<size_t>(e)];
    expert_bytes[static_cast<size_t>(e)] =
        2.0 * static_cast<double>(ex.gate.trellis.size() + ex.up.trellis.size() +
                                  ex.down.trellis.size()) +
        2.0 * 3 * static_cast<double>(I) + (shared_h ? 0.0 : 2.0 * 3 * static_cast<double>(H));
  }

  // BF16 baseline weights: W1 [E][H, 2I] (gate | up), W2 [E][I, H]; constant bf16 0x3C3C.
  std::unique_ptr<cuda::CudaContext> ctx;  // the baseline's cuBLAS handle and workspace
  cuda::DeviceBuffer w1, w2;
  if (o.baseline) {
    ctx = std::make_unique<cuda::CudaContext>();
    w1 = cuda::DeviceBuffer(static_cast<size_t>(E) * H * 2 * I * 2, "the BF16 baseline's W1");
    w2 = cuda::DeviceBuffer(static_cast<size_t>(E) * I * H * 2, "the BF16 baseline's W2");
    EXL3_CUDA_CHECK(cudaMemset(w1.get(), 0x3C, static_cast<size_t>(E) * H * 2 * I * 2),
                    "moe-bench: fill");
    EXL3_CUDA_CHECK(cudaMemset(w2.get(), 0x3C, static_cast<size_t>(E) * I * H * 2),
                    "moe-bench: fill");
  }

  std::mt19937_64 rng(o.seed + 17);
  std::vector<uint16_t> xh(static_cast<size_t>(capacity * H));
  std::normal_distribution<float> nd;
  for (auto& v : xh) v = trellis::float_to_bf16(nd(rng));
  const auto x = upload(xh);
  const auto out =
      cuda::DeviceBuffer::of<float>(static_cast<size_t>(capacity * H), "the MoE output");

  nlohmann::json cases = nlohmann::json::array();
  constexpr int kRouteSets = 4;
  for (int64_t m : ms) {
    std::vector<Routes> sets;
    std::vector<cuda::DeviceBuffer> d_ids, d_w;
    double touched = 0.0;
    for (int s = 0; s < kRouteSets; ++s) {
      sets.push_back(random_routes(m, k, E, rng));
      d_ids.push_back(upload(sets.back().ids));
      d_w.push_back(upload(sets.back().weights));
      std::set<int> distinct(sets.back().ids.begin(), sets.back().ids.end());
      for (int e : distinct) touched += expert_bytes[static_cast<size_t>(e)];
    }
    touched = touched / kRouteSets + 2.0 * m * H + 4.0 * m * H + 8.0 * m * k;  // + x, out, routes

    std::vector<cudaGraphExec_t> graphs;
    for (int i = 0; i < copies; ++i) {
      for (int s = 0; s < kRouteSets; ++s) {
        cudaGraph_t g;
        EXL3_CUDA_CHECK(cudaStreamBeginCapture(tm.stream(), cudaStreamCaptureModeThreadLocal),
                        "moe-bench: capture");
        EXL3_CUDA_CHECK(
            layers[static_cast<size_t>(i)]->run(
                x.get(), cuda::DType::kBF16, d_ids[static_cast<size_t>(s)].as<int32_t>(),
                d_w[static_cast<size_t>(s)].as<float>(), out.as<float>(), m, arena.get(),
                arena_bytes, tm.stream()),
            "moe-bench: MoE run");
        EXL3_CUDA_CHECK(cudaStreamEndCapture(tm.stream(), &g), "moe-bench: capture");
        cudaGraphExec_t ge;
        EXL3_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0), "moe-bench: instantiate");
        EXL3_CUDA_CHECK(cudaGraphDestroy(g), "moe-bench: graph");
        graphs.push_back(ge);
      }
    }
    const double us = tm.median_us(o.reps, [&](int r) {
      EXL3_CUDA_CHECK(cudaGraphLaunch(graphs[static_cast<size_t>(r) % graphs.size()], tm.stream()),
                      "moe-bench: replay");
    });
    for (auto g : graphs) cudaGraphExecDestroy(g);
    const double gbs = touched / (us * 1e-6) / 1e9;

    // Baseline: per route set, the routes gathered by expert (outside the timing) and two grouped
    // BF16 GEMMs (FC1 [cnt, H] x [H, 2I], FC2 [cnt, I] x [I, H]) with fp32 accumulation.
    double base_us = 0.0;
    if (o.baseline) {
      const int64_t R = m * k;
      const cuda::DeviceBuffer xg(static_cast<size_t>(R * H) * 2, "the baseline's gathered input");
      const cuda::DeviceBuffer c1(static_cast<size_t>(R * 2 * I) * 2, "the baseline's FC1 output");
      const cuda::DeviceBuffer c2(static_cast<size_t>(R * H) * 2, "the baseline's FC2 output");
      EXL3_CUDA_CHECK(cudaMemset(xg.get(), 0x3C, static_cast<size_t>(R * H) * 2),
                      "moe-bench: fill");
      EXL3_CUDA_CHECK(cudaMemset(c1.get(), 0x3C, static_cast<size_t>(R * 2 * I) * 2),
                      "moe-bench: fill");
      struct Grouped {
        std::vector<int> m1, n, k1, lda1, ldb1, ldc1, m2, k2, lda2, ldb2, ldc2;
        std::vector<void*> a1, b1, a2, b2;
        std::vector<void*> c1, c2;
        cuda::DeviceBuffer d_a1, d_b1, d_c1, d_a2, d_b2, d_c2;  // the pointer arrays
      };
      std::vector<Grouped> gs(kRouteSets);
      for (int s = 0; s < kRouteSets; ++s) {
        std::vector<int> count(static_cast<size_t>(E), 0);
        for (int e : sets[static_cast<size_t>(s)].ids) ++count[static_cast<size_t>(e)];
        auto& G = gs[static_cast<size_t>(s)];
        int64_t row = 0;
        for (int e = 0; e < E; ++e) {
          const int c = count[static_cast<size_t>(e)];
          if (c == 0) continue;
          G.m1.push_back(static_cast<int>(2 * I));
          G.n.push_back(c);
          G.k1.push_back(static_cast<int>(H));
          G.lda1.push_back(static_cast<int>(2 * I));
          G.ldb1.push_back(static_cast<int>(H));
          G.ldc1.push_back(static_cast<int>(2 * I));
          G.a1.push_back(w1.as<char>() + static_cast<size_t>(e) * H * 2 * I * 2);
          G.b1.push_back(xg.as<char>() + static_cast<size_t>(row * H) * 2);
          G.c1.push_back(c1.as<char>() + static_cast<size_t>(row * 2 * I) * 2);
          G.m2.push_back(static_cast<int>(H));
          G.k2.push_back(static_cast<int>(I));
          G.lda2.push_back(static_cast<int>(H));
          G.ldb2.push_back(static_cast<int>(2 * I));
          G.ldc2.push_back(static_cast<int>(H));
          G.a2.push_back(w2.as<char>() + static_cast<size_t>(e) * I * H * 2);
          G.b2.push_back(G.c1.back());
          G.c2.push_back(c2.as<char>() + static_cast<size_t>(row * H) * 2);
          row += c;
        }
        G.d_a1 = upload(G.a1);
        G.d_b1 = upload(G.b1);
        G.d_c1 = upload(G.c1);
        G.d_a2 = upload(G.a2);
        G.d_b2 = upload(G.b2);
        G.d_c2 = upload(G.c2);
      }
      std::vector<cublasOperation_t> ops(static_cast<size_t>(E), CUBLAS_OP_N);
      std::vector<float> one(static_cast<size_t>(E), 1.0f), zero(static_cast<size_t>(E), 0.0f);
      std::vector<int> gsize(static_cast<size_t>(E), 1);
      auto gemms = [&](int s) {
        cublasHandle_t cublas = ctx->cublas(tm.stream(), cuda::CudaContext::kCublasWorkspaceBytes);
        if (cublas == nullptr) fail("moe-bench: binding cuBLAS to the timer's stream failed");
        auto& G = gs[static_cast<size_t>(s)];
        const int groups = static_cast<int>(G.n.size());
        EXL3_CUDA_CHECK(
            cublasGemmGroupedBatchedEx(cublas, ops.data(), ops.data(), G.m1.data(), G.n.data(),
                                       G.k1.data(), one.data(), G.d_a1.as<void*>(), CUDA_R_16BF,
                                       G.lda1.data(), G.d_b1.as<void*>(), CUDA_R_16BF,
                                       G.ldb1.data(), zero.data(), G.d_c1.as<void*>(), CUDA_R_16BF,
                                       G.ldc1.data(), groups, gsize.data(), CUBLAS_COMPUTE_32F),
            "moe-bench: BF16 baseline FC1");
        EXL3_CUDA_CHECK(
            cublasGemmGroupedBatchedEx(cublas, ops.data(), ops.data(), G.m2.data(), G.n.data(),
                                       G.k2.data(), one.data(), G.d_a2.as<void*>(), CUDA_R_16BF,
                                       G.lda2.data(), G.d_b2.as<void*>(), CUDA_R_16BF,
                                       G.ldb2.data(), zero.data(), G.d_c2.as<void*>(), CUDA_R_16BF,
                                       G.ldc2.data(), groups, gsize.data(), CUBLAS_COMPUTE_32F),
            "moe-bench: BF16 baseline FC2");
      };
      base_us = tm.median_us(o.reps, [&](int r) { gemms(r % kRouteSets); });
    }

    const cuda::MoePlan plan = L0.plan(m);  // what every replay above ran
    const char* path = cuda::moe_path_name(plan.path);
    const char* tier_mode =
        L0.tiers().size() <= 1 ? "uniform" : (plan.tier_passes ? "passes" : "grid");
    fmt::print("m={:<5} {:>9.1f} us  {:>6.0f} GB/s  {:>5.1f}% copy  [{}, {}]", m, us, gbs,
               100.0 * gbs / copy_gbs, path, tier_mode);
    if (o.baseline) fmt::print("  BF16 grouped {:>9.1f} us  ratio {:.2f}x", base_us, us / base_us);
    fmt::print("\n");
    cases.push_back(
        {{"m", m},
         {"us", us},
         {"touched_bytes", touched},
         {"gbs", gbs},
         {"pct_copy", 100.0 * gbs / copy_gbs},
         {"path", path},
         {"plan", plan},
         {"tiers_mode", tier_mode},
         {"bf16_grouped_us", o.baseline ? nlohmann::json(base_us) : nlohmann::json(nullptr)},
         {"ratio_vs_bf16", o.baseline ? nlohmann::json(us / base_us) : nlohmann::json(nullptr)}});
  }
  if (!o.json_path.empty()) {
    const nlohmann::json doc = {
        {"device", prop.name},
        {"sms", prop.multiProcessorCount},
        {"copy_gbs", copy_gbs},
        {"hidden", H},
        {"intermediate", I},
        {"experts", E},
        {"top_k", k},
        {"tiers", o.tiers},
        {"layout", o.layout},
        {"capacity", capacity},
        {"arena_bytes", arena_bytes},
        {"prefill_chunk", L0.prefill_chunk()},
        {"decode_max_m", mo.decode_max_m},
        {"layer_trellis_bytes", layer_bytes},
        {"reps", o.reps},
        {"synthetic", "random trellis bits (every pattern is valid), not a quantized model"},
        {"cases", cases}};
    write_file_atomic(o.json_path, doc.dump(2) + "\n");
  }
  return 0;
}

#endif

}  // namespace

Runner add_moe_bench(CLI::App& app, Common& /*common*/) {
  auto o = std::make_shared<MoeBenchOptions>();
  app.description(
      "Benchmark the fused CUDA MoE layer at a model's per-rank geometry (GPU only).\n\n"
      "Weights are synthetic: random trellis bits (every bit pattern is a valid trellis), so no\n"
      "model or conversion is needed. Each case reports the median time of a CUDA-graph replay, "
      "the\n"
      "bandwidth over the bytes of the distinct experts the routes touch as % of the device copy\n"
      "bandwidth (measured in the same run), and a BF16 baseline: cuBLAS grouped GEMMs on the "
      "same\n"
      "routes (inputs pre-gathered, activation omitted: a lower bound for BF16).\n\n"
      "Examples:\n"
      "  exl3 moe-bench                                   GLM-5.2 per-rank (H=6144, I=512, E=256, "
      "top-8), K3\n"
      "  exl3 moe-bench --tiers 3:148,4:108               mixed K3/K4 tiers in one grid\n"
      "  exl3 moe-bench --geometry qwen3-30b-a3b --tiers 4 --m 1,8,64 --json q.json");
  app.add_option("--geometry", o->geometry, "glm52 | qwen3-30b-a3b")->capture_default_str();
  app.add_option("--hidden", o->hidden, "Override H");
  app.add_option("--intermediate", o->intermediate, "Override the per-rank intermediate size I");
  app.add_option("--experts", o->experts, "Override the expert count E");
  app.add_option("--top-k", o->top_k, "Override top-k");
  app.add_option("--tiers", o->tiers, "K for all experts (3) or K:count pairs (3:148,4:108)")
      ->capture_default_str();
  app.add_option("--layout", o->layout, "shared_h (shared_h_v1) | per_expert (per_expert_v1)")
      ->capture_default_str();
  app.add_option("--m", o->m_list, "Comma list of token counts")->capture_default_str();
  app.add_option("--capacity", o->capacity, "Plan capacity (default: the largest --m)");
  app.add_option("--reps", o->reps, "Timed replays per case (median)")->capture_default_str();
  app.add_option("--seed", o->seed, "Random seed")->capture_default_str();
  app.add_flag("!--no-baseline", o->baseline, "Skip the BF16 cuBLAS baseline");
  app.add_option("--json", o->json_path,
                 "Write the results as JSON; each case carries the layer's plan at its m "
                 "(\"plan\": path, tier passes, split-K and arena carve; docs/moe.md)");
  return [o]() -> int {
#if defined(EXL3_HAVE_CUDA)
    return run_moe_bench(*o);
#else
    fail("moe-bench needs a CUDA build (configure with -DEXL3_CUDA=ON on a machine with nvcc)");
#endif
  };
}

}  // namespace exl3::cli
