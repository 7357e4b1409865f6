// `exl3 generate`: text in, streamed text out, through the model runtime, the model's tokenizer
// and (with --chat) its chat format.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "draft_options.hpp"
#include "env_options.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/runtime/speculative.hpp"
#include "exl3/text/chat_template.hpp"
#include "exl3/text/stop_tokens.hpp"
#include "exl3/text/tokenizer.hpp"
#include "kv_cache_option.hpp"
#include "overlay_options.hpp"
#include "tp_option.hpp"

namespace exl3::cli {

Runner add_generate(CLI::App& app, Common&) {
  struct Opts {
    OverlayArgs overlay;
    std::string model, prompt, system, chat_format, device = "cpu";
    DraftOptions draft;
    int64_t max_tokens = 128, page_size = 32;
    int tp = 1;
    std::string kv_cache = "auto";
    float temperature = 0.0f, top_p = 1.0f;
    uint64_t seed = 0;
    bool chat = false, json = false, ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option(
         "MODEL", o->model,
         "Model folder: config.json, EXL3 *.safetensors, tokenizer.json (+ tokenizer_config.json)")
      ->required();
  app.add_option("--prompt,-p", o->prompt, "Prompt text (with --chat: the user message)")
      ->required();
  app.add_option("--max-tokens,-n", o->max_tokens, "Most tokens to generate")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--temperature", o->temperature,
                 "Sampling temperature; 0 = greedy (always the most likely token)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--top-p", o->top_p,
                 "Nucleus sampling: sample only from the most likely tokens whose probabilities "
                 "add up to P")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  app.add_option("--seed", o->seed, "Sampling seed (same seed, same model, same prompt: same text)")
      ->capture_default_str();
  app.add_option("--device", o->device,
                 "Compute device: cpu (the fp32 reference runtime) or cuda (the GPU kernels; EXL3 "
                 "experts and linears, decode steps as CUDA graphs)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  auto* chat_flag = app.add_flag("--chat", o->chat,
                                 "Wrap the prompt as one user turn in the model's chat format, "
                                 "with the assistant generation prompt");
  app.add_option("--system", o->system, "With --chat: a system message before the user turn")
      ->needs(chat_flag);
  app.add_option("--chat-format", o->chat_format,
                 "With --chat: use this native format instead of the model's chat_template")
      ->check(CLI::IsMember({"chatml", "llama3", "plain"}))
      ->needs(chat_flag);
  app.add_flag("--ignore-eos", o->ignore_eos,
               "Do not stop at end-of-sequence tokens (for speed measurements)");
  app.add_option("--page-size", o->page_size, "KV cache page size in tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_draft_options(app, o->draft, "Loaded on the same device.");
  add_tp_option(app, o->tp);
  add_kv_cache_option(app, o->kv_cache);
  add_overlay_options(app, o->overlay);
  app.add_flag("--json", o->json,
               "Print one JSON document instead of streaming (text, ids, stop_reason, tokens/s)");
  app.footer(
      "Prefills the prompt in one forward pass, then decodes one token at a time through the paged "
      "KV\n"
      "cache, streaming the text as it is produced. Generation stops at an end-of-sequence token\n"
      "(config.json / generation_config.json eos_token_id, the tokenizer's eos_token, and with "
      "--chat\n"
      "the format's end-of-turn token) or after --max-tokens. The last line gives the prompt\n"
      "(prefill) and generation (decode) speed in tokens per second.\n\n"
      "Examples:\n"
      "  exl3 generate ./Qwen3-8B-exl3 --prompt 'The capital of France is' --max-tokens 16\n"
      "  exl3 generate ./Qwen3-8B-exl3 --chat --prompt 'Write a haiku' --temperature 0.7 --top-p "
      "0.9 --seed 1\n"
      "  exl3 generate ./m --prompt 'def main' --json | jq .text\n"
      "  exl3 generate ./m --prompt 'Hello' --tp 2     # two tensor-parallel ranks (threads), same "
      "text\n"
      "  exl3 generate ./m --prompt 'Hello' --device cuda --tp 2   # GPUs 0 and 1, NCCL between "
      "them\n\n"
      "  exl3 generate ./GLM-4.5-Air-exl3 --prompt 'Hi' --overlay "
      "linear=mxfp8,shared_experts=mxfp8\n"
      "  exl3 generate ./Qwen3-32B-exl3 --prompt 'Hi' --draft ./Qwen3-0.6B-exl3 --draft-tokens "
      "4\n"
      "  exl3 generate ./DeepSeek-V3-exl3 --prompt 'Hi' --device cpu --mtp 2\n\n"
      "--draft runs speculative decoding: greedy output is the model's own, token for token, and\n"
      "sampled output follows the model's own distribution, so the draft only changes the speed;\n"
      "the last line reports how many drafted tokens the model accepted and the tokens per pass.\n"
      "Each round drafts 0..K tokens: the first rounds time a plain step and a one-token draft,\n"
      "then the count that gives the most tokens per second at the acceptance seen so far is\n"
      "used; a draft that does not pay makes plain steps, retried with one token now and then.\n"
      "--mtp K drafts with the model's own MTP layer (DeepSeek-V3 / V3.2, GLM-5; CPU) instead of\n"
      "a second model, with the same guarantees.\n"
      "--overlay stores the unquantized attention / dense-MLP / shared-expert linears as MXFP8 "
      "(about\n"
      "half their BF16 bytes); see docs/mxfp8.md.\n"
      "--chat renders the model's own Jinja chat_template as transformers does; a template that\n"
      "uses something exl3's interpreter lacks is refused, naming the line: --chat-format\n"
      "chatml|llama3|plain picks a native format instead. Special tokens are not printed.");
  return [o] {
    const std::filesystem::path dir(o->model);
    const auto tok = Tokenizer::load(dir);
    std::vector<int32_t> prompt;
    std::optional<ChatTemplate> chat;
    std::set<int32_t> stops;
    if (o->chat) {
      std::optional<ChatFormat> force;
      if (!o->chat_format.empty()) force = parse_chat_format(o->chat_format);
      chat = ChatTemplate::for_tokenizer(tok, force);
      std::vector<ChatMessage> msgs;
      if (!o->system.empty()) msgs.push_back({"system", o->system});
      msgs.push_back({"user", o->prompt});
      prompt = tok.encode(chat->render(msgs, true), chat->encode_adds_special_tokens());
      if (!chat->end_of_turn().empty()) {
        if (const auto id = tok.token_to_id(chat->end_of_turn())) stops.insert(*id);
      }
    } else {
      prompt = tok.encode(o->prompt, true);
    }
    if (prompt.empty()) fail("--prompt: the prompt encodes to no tokens");

    // Refused before anything is loaded (and before the KV cache is sized from it): the model has
    // no positions past max_position_embeddings.
    const Checkpoint ckpt = Checkpoint::open(dir);
    runtime::check_context_length(runtime::describe_model(ckpt),
                                  static_cast<int64_t>(prompt.size()), o->max_tokens, "generate",
                                  "--max-tokens / -n");

    runtime::EngineOptions eo;
    eo.load_progress = runtime::make_load_progress_printer(stderr, ::isatty(2) != 0);
    eo.device = runtime::parse_device(o->device);
    eo.page_size = o->page_size;
    eo.tp = o->tp;
    eo.kv_format = kv_cache_format(o->kv_cache);
    eo.overlay = overlay_policy(o->overlay);
    eo.cache_tokens = static_cast<int64_t>(prompt.size()) + o->max_tokens + 1;
    engine_options_from_env(eo);
    auto engine = runtime::load_engine(ckpt, eo);
    const auto draft = load_draft(o->draft, *engine, ckpt, eo);
    if (!o->json) print_overlay_summary(engine->overlay_report());
    for (const int32_t id : model_stop_tokens(dir, engine->spec().eos_token_ids, tok))
      stops.insert(id);

    runtime::GenerateOptions go;
    go.max_new_tokens = o->max_tokens;
    go.sampling = {o->temperature, o->top_p, o->seed};
    if (!o->ignore_eos) go.stop_tokens.assign(stops.begin(), stops.end());

    StreamDecoder stream(tok, /*skip_special=*/true);
    std::string text;
    auto on_token = [&](int32_t id) {
      const std::string piece = stream.push(id);
      text += piece;
      if (!o->json && !piece.empty()) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
      return true;
    };
    runtime::SpeculativeStats spec;
    const auto r = draft ? runtime::generate_speculative(*engine, *draft, prompt, go,
                                                         o->draft.speculative(), &spec, on_token)
                         : runtime::generate(*engine, prompt, go, on_token);
    const std::string tail = stream.finish();
    text += tail;

    if (o->json) {
      nlohmann::json j = {
          {"model", o->model},
          {"device", o->device},
          {"tp", o->tp},
          {"prompt_ids", prompt},
          {"prompt_tokens", r.prompt_tokens},
          {"ids", r.tokens},
          {"generated_tokens", r.tokens.size()},
          {"text", text},
          {"stop_reason", r.stop_reason},
          {"prompt_seconds", r.prompt_seconds},
          {"prompt_tokens_per_second", r.prompt_tokens_per_second()},
          {"decode_steps", r.decode_steps},
          {"decode_seconds", r.decode_seconds},
          {"generation_tokens_per_second", r.decode_tokens_per_second()},
          {"sampling", {{"temperature", o->temperature}, {"top_p", o->top_p}, {"seed", o->seed}}}};
      if (r.stop_token >= 0) j["stop_token"] = r.stop_token;
      j["overlay"] = engine->overlay_report().to_json();
      if (chat) j["chat_format"] = std::string(chat->kind());
      if (draft) {
        j["speculative"] = {{"draft", o->draft.source()},
                            {"draft_tokens", o->draft.speculative().draft_tokens},
                            {"adaptive", !o->draft.fixed},
                            {"rounds", spec.rounds},
                            {"drafted", spec.drafted},
                            {"accepted", spec.accepted},
                            {"acceptance_rate", spec.acceptance_rate()},
                            {"tokens_per_round", spec.tokens_per_round()}};
      }
      fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
      return 0;
    }
    if (!tail.empty()) std::fwrite(tail.data(), 1, tail.size(), stdout);
    fmt::print(
        "\n[prompt: {} tokens, {:.1f} tokens/s | generation: {} tokens, {:.1f} tokens/s | stop: "
        "{}]\n",
        r.prompt_tokens, r.prompt_tokens_per_second(), r.tokens.size(),
        r.decode_tokens_per_second(), r.stop_reason);
    if (draft && spec.drafted == 0) {
      fmt::print(
          "[{}: no tokens drafted in {} model passes (plain steps: the draft did not pay "
          "or the generation was too short to time it)]\n",
          o->draft.mtp > 0 ? "mtp" : "draft", spec.rounds);
    } else if (draft) {
      fmt::print("[{}: {} of {} drafted tokens accepted ({:.0f}%), {:.2f} tokens per model pass]\n",
                 o->draft.mtp > 0 ? "mtp" : "draft", spec.accepted, spec.drafted,
                 100.0 * spec.acceptance_rate(), spec.tokens_per_round());
    }
    return 0;
  };
}

}  // namespace exl3::cli
