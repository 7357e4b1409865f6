#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "exl3/cpu/linear.hpp"
#if defined(EXL3_HAVE_CUDA)
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/linear.hpp"
#endif
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"

namespace exl3::cli {

namespace {

void check_act_dtype(const TensorRef& x) {
  const DType t = x.info->dtype;
  if (t != DType::kF16 && t != DType::kBF16 && t != DType::kF32) {
    fail("{}: tensor 'x': dtype {} is not supported; use F16, BF16 or F32", x.path().string(),
         dtype_name(t));
  }
}

}  // namespace

Runner add_linear(CLI::App& app, Common&) {
  struct Opts {
    std::string path, prefix, input, out, device = "cpu";
  };
  auto o = std::make_shared<Opts>();
  app.add_option("PATH", o->path, "Checkpoint folder or .safetensors file")->required();
  app.add_option("--prefix,-p", o->prefix, "Tensor prefix of the linear (see `exl3 inspect`)")
      ->required();
  app.add_option("--input,-i", o->input,
                 "safetensors file holding tensor `x` (F16/BF16/F32, [m, in_features])")
      ->required();
  app.add_option("--out,-o", o->out,
                 "Output .safetensors file; receives `y` (F32, [m, out_features])")
      ->required();
  app.add_option("--device", o->device,
                 "Compute device: cpu (reference path) or cuda (GPU kernels)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.footer(
      "Computes y = had128(had128(x * suh) @ W_hat) * svh + bias with fp32 accumulation, decoding "
      "the\n"
      "trellis tile by tile (the CPU reference path), or with --device cuda through the GPU "
      "kernels\n"
      "(tensor-core trellis GEMM up to 128 rows, cuBLAS beyond). Inputs narrower than the "
      "(padded)\n"
      "in_features are zero-extended, as exllamav3 does.");
  return [o] {
    const auto ckpt = Checkpoint::open(o->path);
    const auto data = Exl3LinearData::load(ckpt, o->prefix);
    const auto view = cpu::LinearView::of(data);

    const auto xs = TensorStore::open(o->input);
    const TensorRef& x = xs.at("x");
    check_act_dtype(x);
    if (x.info->rank() != 2) {
      fail("{}: tensor 'x': expected rank 2 [m, in_features], got rank {}", o->input,
           x.info->rank());
    }
    const int64_t m = x.info->shape[0], width = x.info->shape[1];
    if (width > view.in_features) {
      fail("{}: tensor 'x': width {} exceeds in_features {} of {}", o->input, width,
           view.in_features, o->prefix);
    }
    // Zero-extend to the padded width in fp32 (exact for every input dtype).
    std::vector<float> xin(static_cast<size_t>(m * view.in_features), 0.0f);
    const auto vals = read_as_float(x);
    for (int64_t r = 0; r < m; ++r) {
      std::copy_n(vals.begin() + r * width, width, xin.begin() + r * view.in_features);
    }

    std::vector<float> y;
    std::string where;
    const auto t0 = std::chrono::steady_clock::now();
    if (o->device == "cuda") {
#if defined(EXL3_HAVE_CUDA)
      where = fmt::format("cuda, {}", cuda::device_name());  // fails clearly without a device
      cuda::LinearOptions opts;
      opts.max_m = std::max<int64_t>(m, 1);
      cuda::CudaContext ctx;
      const cuda::Exl3LinearCuda layer(ctx, data, opts);
      y = cuda::linear_forward_host(layer, xin.data(), m);
#else
      fail("this exl3 was built without CUDA (EXL3_CUDA=OFF); use --device cpu");
#endif
    } else {
      y.resize(static_cast<size_t>(m * view.out_features));
      cpu::linear_forward(view, xin.data(), cpu::ActDType::kF32, m, y.data());
      where = fmt::format("cpu, {}", cpu::decode_path_name());
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    SafetensorsWriter w;
    w.add<float>("y", DType::kF32, {m, view.out_features}, y);
    w.set_metadata("prefix", o->prefix);
    w.write(o->out);
    fmt::print(
        "linear {} ({}x{}, K={}, {}): x [{}, {}] {} -> y [{}, {}] F32 in {:.2f} ms ({}) -> {}\n",
        o->prefix, view.in_features, view.out_features, view.bits,
        trellis::codebook_name(view.codebook), m, width, dtype_name(x.info->dtype), m,
        view.out_features, ms, where, o->out);
    return 0;
  };
}

}  // namespace exl3::cli
