#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/quant/encode.hpp"

namespace exl3::cli {

Runner add_encode_tiles(CLI::App& app, Common&) {
  struct Opts {
    std::string input, out, codebook = "mul1", device = "cpu";
    int bits = 4;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("TILES", o->input, "safetensors file with tensor `tiles` (F32 [n, 256], sequence order)")->required();
  app.add_option("--bits,-K", o->bits, "Bits per weight K")->check(CLI::Range(1, 8))->capture_default_str();
  app.add_option("--codebook", o->codebook, "Codebook")->check(CLI::IsMember({"3inst", "mcg", "mul1"}))->capture_default_str();
  app.add_option("--device", o->device, "Encoder: cpu (reference) or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_option("--out,-o", o->out, "Output safetensors: `states` (I16 [n, 256]) and `decoded` (F32 [n, 256])")->required();
  app.add_flag("--json", o->json, "Print {tiles, seconds, tiles_per_s, nmse} as JSON");
  app.footer("Runs the tail-biting Viterbi tile encoder on raw tiles: the building block of `exl3 quantize`,\n"
             "exposed for comparisons with other encoders (bench/peers/exllamav3_compat.py).");
  return [o] {
    const auto store = TensorStore::open(o->input);
    const TensorRef& t = store.at("tiles");
    if (t.info->rank() != 2 || t.info->shape[1] != 256 || t.info->dtype != DType::kF32) {
      fail("{}: tensor 'tiles': expected F32 [n, 256], got {} of rank {}", o->input, dtype_name(t.info->dtype),
           t.info->rank());
    }
    const int64_t n = t.info->shape[0];
    const auto tiles = read_as_float(t);
    const auto cb = o->codebook == "mcg" ? trellis::Codebook::kMcg
                    : o->codebook == "3inst" ? trellis::Codebook::k3Inst
                                             : trellis::Codebook::kMul1;
    const auto dev = quant::parse_device(o->device);
    std::vector<uint16_t> states(static_cast<size_t>(n * 256));
    std::vector<float> decoded(states.size());
    const auto t0 = std::chrono::steady_clock::now();
    quant::encode_tiles_on(dev, tiles.data(), n, o->bits, cb, states.data(), decoded.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double err = 0.0, var = 0.0, mean = 0.0;
    for (float v : tiles) mean += v;
    mean /= static_cast<double>(tiles.size());
    for (size_t i = 0; i < tiles.size(); ++i) {
      err += (decoded[i] - tiles[i]) * static_cast<double>(decoded[i] - tiles[i]);
      var += (tiles[i] - mean) * (tiles[i] - mean);
    }
    const double nmse = var > 0.0 ? err / var : 0.0;
    SafetensorsWriter w;
    w.add<uint16_t>("states", DType::kI16, {n, 256}, states);
    w.add<float>("decoded", DType::kF32, {n, 256}, decoded);
    w.write(o->out);
    const double tps = s > 0.0 ? static_cast<double>(n) / s : 0.0;
    if (o->json) {
      fmt::print("{}\n", nlohmann::json{{"tiles", n}, {"seconds", s}, {"tiles_per_s", tps}, {"nmse", nmse},
                                        {"device", o->device}, {"bits", o->bits}, {"codebook", o->codebook}}
                             .dump());
    } else {
      fmt::print("encoded {} tiles (K={}, {}) on {} in {:.3f} s: {:.0f} tiles/s, NMSE {:.5f} -> {}\n", n, o->bits,
                 o->codebook, o->device, s, tps, nmse, o->out);
    }
    return 0;
  };
}

}  // namespace exl3::cli
