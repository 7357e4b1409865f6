// encode_tiles_on: picks the CPU or the CUDA tile encoder.
#include "exl3/quant/encode.hpp"

#include "exl3/error.hpp"
#include "exl3/quant/viterbi.hpp"

#if defined(EXL3_HAVE_CUDA)
#include "exl3/cuda/reconstruct.hpp"
#include "exl3/cuda/viterbi.hpp"
#endif

namespace exl3::quant {

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  fail("unknown device '{}' (expected 'cpu' or 'cuda')", name);
}

bool encode_device_available(Device d) {
  if (d == Device::kCpu) return true;
#if defined(EXL3_HAVE_CUDA)
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

void encode_tiles_on(Device device, const float* tiles, int64_t n, int K, trellis::Codebook cb,
                     uint16_t* states_out, float* decoded_out) {
  if (device == Device::kCpu) {
    encode_tiles(tiles, n, K, cb, states_out, decoded_out);
    return;
  }
#if defined(EXL3_HAVE_CUDA)
  cuda::encode_tiles_cuda_host(tiles, n, K, cb, states_out, decoded_out);
#else
  fail("encode_tiles_on: this exl3 was built without CUDA, so device 'cuda' is unavailable "
       "(rebuild with -DEXL3_CUDA=ON, or use device 'cpu')");
#endif
}

}  // namespace exl3::quant
