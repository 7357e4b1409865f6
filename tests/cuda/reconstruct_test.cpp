// GPU reconstruct vs the CPU reference, bit for bit, on random trellis words, every K x codebook.
#include <vector>

#include "exl3/cpu/linear.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace tr = exl3::trellis;

TEST(CudaReconstruct, MatchesCpuBitExact) {
  EXL3_REQUIRE_GPU();
  auto rng = exl3::test::make_rng();
  const int64_t in = 256, out = 384;
  for (int K = 1; K <= 8; ++K) {
    for (int c = 0; c < tr::kNumCodebooks; ++c) {
      const auto cb = static_cast<tr::Codebook>(c);
      std::vector<uint16_t> trellis(static_cast<size_t>(in / 16 * out / 16 * 16 * K));
      for (auto& w : trellis) w = static_cast<uint16_t>(rng());
      std::vector<uint16_t> suh(in, 0x3C00), svh(out, 0x3C00);
      exl3::cpu::LinearView v{trellis, in, out, K, cb, suh, svh, {}};
      const auto expect = exl3::cpu::reconstruct_w_hat(v);

      const auto d_t = exl3::cuda::DeviceBuffer::upload(trellis, "the trellis");
      const auto d_o = exl3::cuda::DeviceBuffer::of<uint16_t>(expect.size(), "W_hat");
      EXL3_CUDA_CHECK(cudaMemset(d_o.get(), 0xFF, d_o.bytes()));  // poison (fp16 NaN)
      EXL3_CUDA_CHECK(exl3::cuda::reconstruct_w_hat(d_t.as<uint16_t>(), in, out, K, cb,
                                                    d_o.as<uint16_t>(), nullptr));
      EXL3_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint16_t> got(expect.size());
      EXL3_CUDA_CHECK(cudaMemcpy(got.data(), d_o.get(), got.size() * 2, cudaMemcpyDeviceToHost));
      ASSERT_EQ(got, expect) << "K=" << K << " cb=" << tr::codebook_name(cb);
    }
  }
}
