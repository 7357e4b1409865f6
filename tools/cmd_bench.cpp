// `exl3 bench ...`: benchmark group. `bench quant` prints the encoder's quality table (NMSE per
// codebook and K against the rate-distortion bound and exllamav3's measured NMSE, with encoder
// speed) and the LDLQ proxy-error gain; `bench model` (cmd_bench_model.cpp) times a model's decode and
// prefill, and `bench serve` (cmd_bench_serve.cpp) the OpenAI server under streaming load.
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exl3/quant/quality.hpp"
#include "exl3/quant/viterbi.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::cli {

namespace {

Runner add_bench_quant(CLI::App& app, Common& common) {
  struct Opts {
    int tiles = 256;
    uint64_t seed = 0;
    int64_t ldlq_in = 256, ldlq_out = 384;
    double ldlq_g = 0.0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--tiles", o->tiles, "Gaussian tiles (256 weights each) per codebook and K")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", o->seed, "Random seed")->capture_default_str();
  app.add_option("--threads,-t", common.threads, "CPU worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--ldlq-in", o->ldlq_in, "Input features of the LDLQ gain layer")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--ldlq-out", o->ldlq_out, "Output features of the LDLQ gain layer")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--ldlq-g-scale", o->ldlq_g, "Fixed global scale for the LDLQ layer (0 = search; faster)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--json", o->json, "Print one JSON document (keys: encoder, tiles, rows, ldlq)");
  app.footer("NMSE = mean squared error / variance of i.i.d. Gaussian tiles (sigma = the codebook's RMS);\n"
             "bound = 2^-2K (Gaussian rate-distortion); goal = exllamav3's encoder on an H200 (docs/format.md, Viterbi tile encoder).");
  return [o] {
    const auto rows = quant::quality_table(o->tiles, o->seed, 0);
    const auto g = quant::ldlq_gain(o->ldlq_in, o->ldlq_out, 4, trellis::Codebook::k3Inst, o->seed, 0, o->ldlq_g);
    if (o->json) {
      nlohmann::json j;
      j["encoder"] = quant::viterbi_path_name();
      j["tiles"] = o->tiles;
      j["rows"] = nlohmann::json::array();
      for (const auto& r : rows) {
        j["rows"].push_back({{"codebook", trellis::codebook_name(r.codebook)}, {"bits", r.bits},
                             {"nmse", r.nmse}, {"bound", r.rd_bound}, {"ratio", r.ratio},
                             {"exllamav3_nmse", r.goal}, {"tiles_per_s", r.tiles_per_s}});
      }
      j["ldlq"] = {{"in_features", g.in_features}, {"out_features", g.out_features}, {"bits", g.bits},
                   {"codebook", trellis::codebook_name(g.codebook)}, {"proxy_plain", g.proxy_plain},
                   {"proxy_ldlq", g.proxy_ldlq}, {"gain", g.gain}};
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("encoder: {} Viterbi, {} tiles per codebook and K\n\n", quant::viterbi_path_name(), o->tiles);
    fmt::print("{:<8} {:>2} {:>10} {:>12} {:>7} {:>10} {:>9}\n", "codebook", "K", "NMSE", "bound 2^-2K", "ratio",
               "exllamav3", "tiles/s");
    for (const auto& r : rows) {
      fmt::print("{:<8} {:>2} {:>10.5f} {:>12.5f} {:>7.3f} {:>10.5f} {:>9.0f}\n", trellis::codebook_name(r.codebook),
                 r.bits, r.nmse, r.rd_bound, r.ratio, r.goal, r.tiles_per_s);
    }
    fmt::print("\nLDLQ proxy-error gain ({}x{}, K={}, {}, synthetic skewed Hessian): plain {:.5f} -> LDLQ {:.5f}, gain {:.2f}x\n",
               g.in_features, g.out_features, g.bits, trellis::codebook_name(g.codebook), g.proxy_plain, g.proxy_ldlq, g.gain);
    return 0;
  };
}

}  // namespace

Runner add_bench(CLI::App& app, Common& common) {
  app.require_subcommand(1);
  auto quant_run = std::make_shared<Runner>();
  CLI::App* q = app.add_subcommand("quant", "Encoder quality (NMSE vs bound, per codebook and K), speed, and LDLQ gain");
  *quant_run = add_bench_quant(*q, common);
  auto model_run = std::make_shared<Runner>();
  CLI::App* m = app.add_subcommand("model", "Decode (batch 1/8/64) and prefill tokens/s of a model, with the bandwidth ceiling");
  *model_run = add_bench_model(*m, common);
  auto serve_run = std::make_shared<Runner>();
  CLI::App* sv = app.add_subcommand("serve", "The OpenAI server under streaming load: TTFT, ITL, tokens/s at 1/8/64 streams");
  *serve_run = add_bench_serve(*sv, common);
  return [q, quant_run, m, model_run, sv, serve_run] {
    if (q->parsed()) return (*quant_run)();
    if (m->parsed()) return (*model_run)();
    if (sv->parsed()) return (*serve_run)();
    return 1;
  };
}

}  // namespace exl3::cli
