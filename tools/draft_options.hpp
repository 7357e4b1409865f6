// The speculative-decoding options shared by `generate` and `serve` (--draft, --draft-tokens,
// --mtp, --draft-fixed), and loading the draft beside the target: a separate model, or the
// model's own MTP layer.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/mtp.hpp"
#include "exl3/runtime/speculative.hpp"

namespace exl3::cli {

struct DraftOptions {
  std::string path;  // empty: no draft model
  int tokens = 4;
  int mtp = 0;  // > 0: the model's MTP layer drafts up to this many tokens per round
  bool fixed = false;
  bool any() const { return !path.empty() || mtp > 0; }
  runtime::SpeculativeOptions speculative() const { return {mtp > 0 ? mtp : tokens, !fixed}; }
  // What drafts, for reports: "mtp" or the draft model's folder.
  std::string source() const { return mtp > 0 ? std::string("mtp") : path; }
};

// `where_loaded` ends --draft's help (how the command loads the draft).
inline void add_draft_options(CLI::App& app, DraftOptions& d, const std::string& where_loaded) {
  auto* draft = app.add_option(
      "--draft", d.path,
      "Speculative decoding: a smaller model folder with the same tokenizer proposes tokens and "
      "the model checks them in one pass per round (greedy: the same text as without it; "
      "sampling: the same distribution). " +
          where_loaded);
  app.add_option("--draft-tokens", d.tokens,
                 "With --draft: the most tokens proposed per round (and request, when serving); "
                 "each round's count adapts to how often the draft is right and what its passes "
                 "cost")
      ->check(CLI::Range(1, 16))
      ->needs(draft)
      ->capture_default_str();
  app.add_option("--mtp", d.mtp,
                 "Speculative decoding with the model's own MTP layer (DeepSeek-V3 / V3.2, GLM-5: "
                 "num_nextn_predict_layers) as the draft, proposing up to K tokens per round by "
                 "chaining it; the same guarantees as --draft. CPU only so far")
      ->check(CLI::Range(1, 16))
      ->excludes(draft);
  app.add_flag("--draft-fixed", d.fixed,
               "With --draft or --mtp: always propose the most tokens (sampled text then repeats "
               "for a seed; adaptive counts depend on timings)");
}

// The draft engine for `target` (loaded from `ckpt`), or null without --draft / --mtp: the draft
// model on the target's device and options but without an MXFP8 overlay, or the MTP head.
inline std::unique_ptr<runtime::Engine> load_draft(const DraftOptions& d, runtime::Engine& target,
                                                   const Checkpoint& ckpt,
                                                   runtime::EngineOptions eo) {
  if (d.fixed && !d.any()) fail("--draft-fixed needs --draft or --mtp");
  if (d.mtp > 0) return runtime::load_mtp_draft(target, ckpt, eo);
  if (d.path.empty()) return nullptr;
  eo.overlay = {};
  return runtime::load_engine(Checkpoint::open(d.path), eo);
}

}  // namespace exl3::cli
