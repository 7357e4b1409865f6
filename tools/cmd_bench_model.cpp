// `exl3 bench model`: decode and prefill speed of a whole model through the runtime, with the
// bandwidth ceiling (weight bytes per decoded token over the device copy bandwidth measured in
// the same run) beside each figure. --synthetic writes a model of a known geometry with random
// valid trellis bits first (speed only: the weights are noise).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "env_options.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/format/synthetic.hpp"
#include "exl3/quant/convert.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/model_bench.hpp"
#include "exl3/runtime/mtp.hpp"
#include "kv_cache_option.hpp"
#include "tp_option.hpp"
#if defined(EXL3_HAVE_CUDA)
#include "exl3/cuda/bench_timer.hpp"
#include "exl3/cuda/linear.hpp"
#endif

namespace exl3::cli {
namespace {

// Known geometries for --synthetic.
SyntheticSpec synthetic_geometry(const std::string& name) {
  SyntheticSpec s;
  if (name == "qwen3-30b-a3b") {  // Qwen3-30B-A3B: 48 layers, 128 experts, top-8
    s.hidden_size = 2048;
    s.num_layers = 48;
    s.num_heads = 32;
    s.num_kv_heads = 4;
    s.head_dim = 128;
    s.num_experts = 128;
    s.experts_per_tok = 8;
    s.moe_intermediate_size = 768;
    s.vocab_size = 151936;
    s.max_position_embeddings = 40960;  // so --context 8k and 32k run as on the real model
  } else if (name == "deepseek-v3") {   // DeepSeek-V3 / R1 (Kimi-K2: the same layer, 384 experts)
    s.hidden_size = 7168;
    s.num_layers = 61;
    s.num_heads = 128;
    s.num_kv_heads = 128;
    s.q_lora_rank = 1536;
    s.kv_lora_rank = 512;
    s.qk_nope_head_dim = 128;
    s.qk_rope_head_dim = 64;
    s.v_head_dim = 128;
    s.first_k_dense_replace = 3;
    s.intermediate_size = 18432;
    s.num_experts = 256;
    s.experts_per_tok = 8;
    s.moe_intermediate_size = 2048;
    s.n_shared_experts = 1;
    s.n_group = 8;
    s.topk_group = 4;
    s.vocab_size = 129280;
    s.max_position_embeddings = 40960;
  } else if (name == "gpt-oss-120b" || name == "gpt-oss-20b") {  // 36 / 24 layers, top-4
    s.gpt_oss = true;
    s.hidden_size = 2880;  // every linear padded to 2944 on the 2880 side, as converted
    s.num_layers = name == "gpt-oss-120b" ? 36 : 24;
    s.num_heads = 64;
    s.num_kv_heads = 8;
    s.head_dim = 64;
    s.num_experts = name == "gpt-oss-120b" ? 128 : 32;
    s.experts_per_tok = 4;
    s.moe_intermediate_size = 2880;
    s.sliding_window = 128;
    s.vocab_size = 201088;
    s.max_position_embeddings = 40960;
  } else if (name == "qwen3-next-80b-a3b") {  // 48 layers: 3 gated DeltaNet, then 1 attention
    s.hidden_size = 2048;
    s.num_layers = 48;
    s.num_heads = 16;
    s.num_kv_heads = 2;
    s.head_dim = 256;
    s.linear_num_key_heads = 16;
    s.linear_num_value_heads = 32;
    s.num_experts = 512;
    s.experts_per_tok = 10;
    s.moe_intermediate_size = 512;
    s.shared_expert_intermediate_size = 512;
    s.vocab_size = 151936;
    s.max_position_embeddings = 40960;
  } else if (name != "tiny") {
    fail(
        "--synthetic '{}' is unknown; choose qwen3-30b-a3b, deepseek-v3, gpt-oss-120b, "
        "gpt-oss-20b, qwen3-next-80b-a3b or tiny",
        name);
  }
  return s;
}

}  // namespace

Runner add_bench_model(CLI::App& app, Common&) {
  struct Opts {
    std::string model, synthetic, out_dir, codebook = "mcg", device = "cuda", json_path;
    int bits = 4, head_bits = 6, layers = 0, tp = 1;
    std::string kv_cache = "auto";
    int64_t cache_tokens = 0, max_batch_tokens = 2048;
    runtime::ModelBenchOptions bench;
    int draft_tokens = 0;
    int mtp = 0;
    bool prepare_only = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "EXL3 checkpoint folder (or use --synthetic)");
  app.add_option(
      "--synthetic", o->synthetic,
      "Write and time a synthetic EXL3 model of this geometry: qwen3-30b-a3b, deepseek-v3 "
      "(61 layers; use --layers to keep the first N: 3 dense, then MoE), gpt-oss-120b, "
      "gpt-oss-20b, qwen3-next-80b-a3b (48 layers: 3 gated DeltaNet, then full attention) or tiny "
      "(random valid trellis bits: a speed benchmark, never a quality one)");
  app.add_option("--bits", o->bits, "--synthetic: K of the decoder linears and experts")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--head-bits", o->head_bits, "--synthetic: K of lm_head")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--codebook", o->codebook, "--synthetic: mcg, mul1 or 3inst")
      ->capture_default_str();
  app.add_option("--layers", o->layers,
                 "--synthetic: override the decoder layer count (0 = the geometry's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--out", o->out_dir,
                 "--synthetic: folder for the model (reused when it already holds one); default "
                 "a folder under the system temp dir");
  app.add_option("--device", o->device, "cuda or cpu")->capture_default_str();
  app.add_option("--batch", o->bench.batches, "Decode batch sizes (sequences decoding together)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--context", o->bench.context, "Prompt tokens per sequence before decode is timed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps", o->bench.decode_steps, "Timed decode steps per batch size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--prefill", o->bench.prefill_tokens,
                 "Prompt length of the prefill measurement (0 = skip)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--cache-tokens", o->cache_tokens, "KV pool size (default: what the runs need)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-batch-tokens", o->max_batch_tokens,
                 "Tokens per kernel pass (prefill chunk)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", o->bench.seed,
                 "Seed of the random token ids (and of --synthetic weights)")
      ->capture_default_str();
  app.add_option("--draft-tokens", o->draft_tokens,
                 "Also time speculative decoding at each --batch with up to K draft tokens per "
                 "round, the model drafting for itself: every draft kept, none kept, and the "
                 "adaptive count with none kept (see below)")
      ->check(CLI::Range(1, 16));
  app.add_option("--mtp", o->mtp,
                 "Also time speculative decoding at each --batch with the model's MTP layer "
                 "drafting up to K tokens per round (greedy, CPU): plain steps, K per round and "
                 "the adaptive count, with the acceptance reached")
      ->check(CLI::Range(1, 16));
  app.add_flag("--profile", o->bench.profile,
               "After each --batch's timed steps and after the timed prefills, one more step "
               "with every op timed (CUDA, one GPU): time per op class (norm, linear, attention, "
               "moe, ...) and its share. The "
               "profiled step runs eagerly without programmatic dependent launch, so its total "
               "is longer than a timed step; the shares show where a step's time goes");
  app.add_option("--json", o->json_path, "Also write the results as JSON to this file");
  add_tp_option(app, o->tp);
  add_kv_cache_option(app, o->kv_cache);
  app.add_flag("--prepare-only", o->prepare_only,
               "--synthetic: write the model to --out and stop (e.g. on the CPU while the GPU runs "
               "something else)");
  app.footer(
      "Decode: B sequences prefilled with --context random tokens, then --steps steps of one token "
      "each\n"
      "(median step time; tokens/s = B / step). Prefill: one sequence of --prefill tokens in one "
      "call.\n"
      "Ceiling: the device copy bandwidth measured in this run over the weight bytes one token "
      "reads at\n"
      "batch 1 (non-expert linears, lm_head, top-k experts per MoE layer); % = decode tok/s / "
      "ceiling.\n"
      "--draft-tokens K: each batch's sequences generate --steps tokens after --context, in "
      "rounds\n"
      "of plain steps and speculatively with the model as its own draft, greedy: K drafts with\n"
      "every draft kept (K + 1 tokens per round) and none kept (its logits shifted by one id: 1\n"
      "token per round); any real draft's acceptance lands between the two. Then the adaptive\n"
      "count (generate's default) with none kept: its loss against plain is what a useless draft\n"
      "costs. The verify pass (K + 1 tokens per sequence) against a plain step sets the ceiling\n"
      "of a draft that costs nothing.\n\n"
      "Examples:\n"
      "  exl3 bench model --synthetic qwen3-30b-a3b --bits 4 --out /tmp/q30 --json q30.json\n"
      "  exl3 bench model ./Qwen3-30B-A3B-exl3-4bpw --batch 1,8 --prefill 2048\n"
      "  exl3 bench model --synthetic qwen3-30b-a3b --out /tmp/q30 --tp 2   # 2 GPUs; collectives "
      "timed alone too\n"
      "  exl3 bench model /tmp/q30 --batch 1 --prefill 0 --draft-tokens 3\n"
      "  exl3 bench model /tmp/q30 --batch 1,8 --prefill 0 --profile   # where a step's time goes");
  return [o] {
    std::filesystem::path dir = o->model;
    if (!o->synthetic.empty()) {
      if (!o->model.empty()) fail("give MODEL or --synthetic, not both");
      SyntheticSpec s = synthetic_geometry(o->synthetic);
      if (o->layers > 0) s.num_layers = o->layers;
      s.bits = o->bits;
      s.head_bits = o->head_bits;
      s.seed = o->bench.seed;
      const auto cb = quant::parse_codebook(o->codebook);
      if (!cb) fail("--codebook '{}' is unknown; choose mcg, mul1 or 3inst", o->codebook);
      s.codebook = *cb;
      dir = o->out_dir.empty() ? std::filesystem::temp_directory_path() /
                                     fmt::format("exl3-bench-{}-k{}-{}-l{}", o->synthetic, s.bits,
                                                 o->codebook, s.num_layers)
                               : std::filesystem::path(o->out_dir);
      if (!std::filesystem::exists(dir / "config.json")) {
        std::fprintf(stderr, "writing synthetic %s (%lld layers, K=%d %s) to %s ...\n",
                     o->synthetic.c_str(), static_cast<long long>(s.num_layers), s.bits,
                     o->codebook.c_str(), dir.string().c_str());
        write_synthetic_checkpoint(dir, s);
      } else {
        std::fprintf(stderr, "reusing %s\n", dir.string().c_str());
      }
    }
    if (dir.empty()) fail("no model: give MODEL or --synthetic NAME (see --help)");
    if (o->prepare_only) {
      if (o->synthetic.empty())
        fail("--prepare-only writes a --synthetic model; give --synthetic NAME --out DIR");
      std::printf("synthetic %s ready in %s\n", o->synthetic.c_str(), dir.string().c_str());
      return 0;
    }
    const auto ckpt = Checkpoint::open(dir);
    runtime::EngineOptions eo;
    eo.load_progress = runtime::make_load_progress_printer(stderr, ::isatty(2) != 0);
    eo.device = runtime::parse_device(o->device);
    eo.max_batch_tokens = o->max_batch_tokens;
    eo.tp = o->tp;
    eo.kv_format = kv_cache_format(o->kv_cache);
    if (o->bench.profile && (eo.device != runtime::Device::kCuda || eo.tp > 1)) {
      fail(
          "--profile times the ops of the single-GPU CUDA engine (CUDA events); hint: drop "
          "--profile, or run with --device cuda and --tp 1");
    }
    engine_options_from_env(eo);
    o->bench.max_batch_tokens = o->max_batch_tokens;
    int64_t biggest = 0;
    for (const auto b : o->bench.batches) {
      if (b <= 0) fail("--batch {}: batch sizes must be positive", b);
      biggest = std::max(biggest, b);
    }
    eo.cache_tokens =
        o->cache_tokens > 0
            ? o->cache_tokens
            : std::max({biggest * runtime::bench_sequence_tokens(o->bench) + 64 * biggest,
                        o->bench.prefill_tokens + 64,
                        // --draft-tokens: two sequences per stream (the model drafting for
                        // itself)
                        o->draft_tokens > 0
                            ? 2 * biggest *
                                  (o->bench.context + o->bench.decode_steps + o->draft_tokens + 64)
                            : 0,
                        biggest * (o->bench.context + o->bench.decode_steps + o->mtp + 64)});
    // Gated DeltaNet models: a state slot per sequence of the biggest batch.
    eo.recurrent_slots = std::max(eo.recurrent_slots, biggest);
    std::fprintf(stderr, "loading %s on %s ...\n", dir.string().c_str(), o->device.c_str());
    const auto load_start = std::chrono::steady_clock::now();
    auto engine = runtime::load_engine(ckpt, eo);
    const double load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    std::fprintf(stderr, "loaded in %.1f s\n", load_seconds);
    const uint64_t active = runtime::active_weight_bytes_per_token(ckpt, engine->spec());
    double copy_gbs = 0.0;
    std::string device_name = "cpu";
#if defined(EXL3_HAVE_CUDA)
    if (eo.device == runtime::Device::kCuda) {
      cuda::GpuTimer timer;
      copy_gbs = timer.copy_bandwidth_gbs();
      device_name = cuda::device_name();
    }
#endif
    const auto res = runtime::bench_model(*engine, o->bench);
    const double ceiling = copy_gbs > 0 ? copy_gbs * 1e9 / static_cast<double>(active) : 0.0;
    std::printf("model %s (%s), device %s\n", dir.string().c_str(),
                std::string(runtime::architecture_name(engine->spec().architecture)).c_str(),
                device_name.c_str());
    std::printf(
        "weights read per token at batch 1: %.1f MB; copy bandwidth %.0f GB/s -> ceiling %.1f "
        "tok/s\n",
        static_cast<double>(active) / 1e6, copy_gbs, ceiling);
    const auto kv = engine->kv_cache_info();
    std::printf("KV cache %s: %llu bytes per token; context %lld tokens per sequence\n",
                std::string(cpu::kv_format_name(kv.format)).c_str(),
                static_cast<unsigned long long>(kv.bytes_per_token),
                static_cast<long long>(o->bench.context));
    const bool tp = o->tp > 1;
    // Launches per layer: the step's kernels over the decoder layers (the embedding, final norm,
    // head and step bookkeeping counted in), the figure the decode-fusion work tracks.
    const auto layers = static_cast<double>(std::max<int64_t>(1, engine->spec().num_layers()));
    std::printf("%8s %12s %12s %10s %14s %18s%s\n", "batch", "ms/step", "tok/s", "% ceiling",
                "kernels/layer", "tok/s logits back", tp ? "   collectives ms (% step)" : "");
    nlohmann::json decode = nlohmann::json::array();
    for (const auto& d : res.decode) {
      const double pct = ceiling > 0 ? 100.0 * d.tokens_per_second / ceiling : 0.0;
      std::printf("%8lld %12.3f %12.1f %10.1f", static_cast<long long>(d.batch),
                  1e3 * d.seconds_per_step, d.tokens_per_second, pct);
      if (d.kernels > 0) {
        std::printf(" %14.2f", static_cast<double>(d.kernels) / layers);
      } else {
        std::printf(" %14s", "-");
      }
      const double logits_tps = static_cast<double>(d.batch) / d.seconds_per_step_logits;
      std::printf(" %18.1f", logits_tps);
      if (tp)
        std::printf("   %8.3f (%4.1f%%)", 1e3 * d.collective_seconds,
                    100.0 * d.collective_seconds / d.seconds_per_step);
      std::printf("\n");
      decode.push_back(
          {{"batch", d.batch},
           {"ms_per_step", 1e3 * d.seconds_per_step},
           {"tokens_per_second", d.tokens_per_second},
           {"ms_per_step_logits_back", 1e3 * d.seconds_per_step_logits},
           {"tokens_per_second_logits_back", logits_tps},
           {"percent_of_ceiling", ceiling > 0 ? nlohmann::json(pct) : nlohmann::json(nullptr)},
           {"collectives_ms", 1e3 * d.collective_seconds},
           {"collectives_share", d.collective_seconds / d.seconds_per_step},
           {"kernels_per_step",
            d.kernels > 0 ? nlohmann::json(d.kernels) : nlohmann::json(nullptr)},
           {"kernels_per_layer", d.kernels > 0
                                     ? nlohmann::json(static_cast<double>(d.kernels) / layers)
                                     : nlohmann::json(nullptr)}});
    }
    // A profiled step's table (what) and its JSON.
    const auto print_profile = [](const std::vector<runtime::Engine::OpTime>& profile,
                                  const std::string& what) {
      double total = 0.0;
      for (const auto& t : profile) total += t.ms;
      std::printf("profiled %s (eager, no PDL): %.3f ms\n", what.c_str(), total);
      std::printf("%14s %8s %10s %8s %12s\n", "op", "calls", "ms", "share", "us per call");
      nlohmann::json ops = nlohmann::json::array();
      for (const auto& t : profile) {
        std::printf("%14s %8lld %10.3f %7.1f%% %12.2f\n", t.op.c_str(),
                    static_cast<long long>(t.calls), t.ms, total > 0 ? 100.0 * t.ms / total : 0.0,
                    t.calls > 0 ? 1e3 * t.ms / static_cast<double>(t.calls) : 0.0);
        ops.push_back({{"op", t.op}, {"calls", t.calls}, {"ms", t.ms}});
      }
      return nlohmann::json{{"total_ms", total}, {"ops", ops}};
    };
    for (size_t i = 0; i < res.decode.size(); ++i) {
      const auto& d = res.decode[i];
      if (d.profile.empty()) continue;
      decode[i]["profile"] =
          print_profile(d.profile, fmt::format("step, batch {}", static_cast<long long>(d.batch)));
    }
    nlohmann::json prefill_profile = nullptr;
    if (!res.prefill_profile.empty()) {
      prefill_profile = print_profile(
          res.prefill_profile,
          fmt::format("prefill of {} tokens", static_cast<long long>(res.prefill_tokens)));
    }
    if (res.prefill_tokens > 0) {
      std::printf("prefill %lld tokens: %.1f ms, %.0f tok/s",
                  static_cast<long long>(res.prefill_tokens), 1e3 * res.prefill_seconds,
                  res.prefill_tokens_per_second);
      if (tp) {
        std::printf("; collectives %.3f ms (%.1f%%)", 1e3 * res.prefill_collective_seconds,
                    100.0 * res.prefill_collective_seconds / res.prefill_seconds);
      }
      std::printf("\n");
    }
    nlohmann::json speculative = nullptr;
    if (o->draft_tokens > 0) {
      const auto sp = runtime::bench_speculative(*engine, o->draft_tokens, o->bench);
      const int k = sp.draft_tokens;
      std::printf(
          "speculative, %d draft tokens, the model drafting for itself (%lld tokens per "
          "sequence):\n",
          k, static_cast<long long>(sp.tokens));
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& b : sp.batches) {
        const double ratio = b.verify_seconds / b.decode_step_seconds;
        // A draft that costs nothing and is always right: K + 1 tokens per sequence and verify.
        const double free = static_cast<double>(b.batch * (k + 1)) / b.verify_seconds;
        std::printf(
            "  batch %lld: plain %.1f tok/s | every draft kept %.1f (%.2fx, acceptance %.2f) | "
            "none kept %.1f (%.2fx) | none kept, adaptive %.1f (%.2fx, %.2f drafts per round)\n"
            "    verify pass (%d tokens per sequence) %.3f ms = %.2f plain steps -> %.1f tok/s "
            "(%.2fx) with a free draft at full acceptance\n",
            static_cast<long long>(b.batch), b.plain_tokens_per_second, b.all_tokens_per_second,
            b.all_tokens_per_second / b.plain_tokens_per_second, b.all_acceptance,
            b.none_tokens_per_second, b.none_tokens_per_second / b.plain_tokens_per_second,
            b.adaptive_none_tokens_per_second,
            b.adaptive_none_tokens_per_second / b.plain_tokens_per_second,
            b.adaptive_none_drafts_per_round, k + 1, 1e3 * b.verify_seconds, ratio, free,
            free / b.plain_tokens_per_second);
        rows.push_back({{"batch", b.batch},
                        {"plain_tokens_per_second", b.plain_tokens_per_second},
                        {"all_kept_tokens_per_second", b.all_tokens_per_second},
                        {"all_kept_acceptance", b.all_acceptance},
                        {"none_kept_tokens_per_second", b.none_tokens_per_second},
                        {"none_kept_acceptance", b.none_acceptance},
                        {"adaptive_none_kept_tokens_per_second", b.adaptive_none_tokens_per_second},
                        {"adaptive_none_kept_drafts_per_round", b.adaptive_none_drafts_per_round},
                        {"decode_step_ms", 1e3 * b.decode_step_seconds},
                        {"verify_ms", 1e3 * b.verify_seconds},
                        {"free_draft_ceiling_tokens_per_second", free}});
      }
      speculative = {{"draft_tokens", k}, {"tokens", sp.tokens}, {"batches", rows}};
    }
    nlohmann::json mtp = nullptr;
    if (o->mtp > 0) {
      const auto head = runtime::load_mtp_draft(*engine, ckpt, eo);
      const auto m = runtime::bench_mtp(*engine, *head, o->mtp, o->bench);
      std::printf(
          "speculative with the MTP layer, up to %d draft tokens (%lld tokens per sequence):\n",
          m.draft_tokens, static_cast<long long>(m.tokens));
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& b : m.batches) {
        std::printf(
            "  batch %lld: plain %.1f tok/s | %d per round %.1f (%.2fx, acceptance %.2f, %.2f "
            "tokens per pass) | adaptive %.1f (%.2fx, acceptance %.2f)\n",
            static_cast<long long>(b.batch), b.plain_tokens_per_second, m.draft_tokens,
            b.fixed_tokens_per_second, b.fixed_tokens_per_second / b.plain_tokens_per_second,
            b.fixed_acceptance, b.fixed_tokens_per_round, b.adaptive_tokens_per_second,
            b.adaptive_tokens_per_second / b.plain_tokens_per_second, b.adaptive_acceptance);
        rows.push_back({{"batch", b.batch},
                        {"plain_tokens_per_second", b.plain_tokens_per_second},
                        {"fixed_tokens_per_second", b.fixed_tokens_per_second},
                        {"fixed_acceptance", b.fixed_acceptance},
                        {"fixed_tokens_per_round", b.fixed_tokens_per_round},
                        {"adaptive_tokens_per_second", b.adaptive_tokens_per_second},
                        {"adaptive_acceptance", b.adaptive_acceptance}});
      }
      mtp = {{"draft_tokens", m.draft_tokens}, {"tokens", m.tokens}, {"batches", rows}};
    }
    if (!o->json_path.empty()) {
      const nlohmann::json doc = {
          {"model", dir.string()},
          {"synthetic",
           o->synthetic.empty() ? nlohmann::json(nullptr) : nlohmann::json(o->synthetic)},
          {"synthetic_note", o->synthetic.empty()
                                 ? nlohmann::json(nullptr)
                                 : nlohmann::json("random valid trellis bits; speed only")},
          {"spec", runtime::spec_summary(engine->spec())},
          {"device", device_name},
          {"copy_bandwidth_gbs", copy_gbs},
          {"active_weight_bytes_per_token", active},
          {"ceiling_tokens_per_second", ceiling},
          {"context", o->bench.context},
          {"kv_cache",
           {{"format", std::string(cpu::kv_format_name(engine->kv_cache_info().format))},
            {"bytes_per_token", engine->kv_cache_info().bytes_per_token}}},
          {"tp", o->tp},
          {"load_seconds", load_seconds},
          {"decode", decode},
          {"speculative", speculative},
          {"mtp", mtp},
          {"prefill",
           {{"tokens", res.prefill_tokens},
            {"ms", 1e3 * res.prefill_seconds},
            {"tokens_per_second", res.prefill_tokens_per_second},
            {"collectives_ms", 1e3 * res.prefill_collective_seconds},
            {"collectives_share",
             res.prefill_collective_seconds / std::max(res.prefill_seconds, 1e-12)},
            {"profile", prefill_profile}}}};
      write_file_atomic(o->json_path, doc.dump(2) + "\n");
    }
    return 0;
  };
}

}  // namespace exl3::cli
