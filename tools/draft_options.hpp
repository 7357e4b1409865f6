// The speculative-decoding options shared by `generate` and `serve` (--draft, --draft-tokens,
// --draft-fixed), and loading the draft model beside the target.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "exl3/format/checkpoint.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/speculative.hpp"

namespace exl3::cli {

struct DraftOptions {
  std::string path;  // empty: no draft
  int tokens = 4;
  bool fixed = false;
  runtime::SpeculativeOptions speculative() const { return {tokens, !fixed}; }
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
  app.add_flag("--draft-fixed", d.fixed,
               "With --draft: always propose --draft-tokens tokens (sampled text then repeats for "
               "a seed; adaptive counts depend on timings)")
      ->needs(draft);
}

// The draft engine, on the target's device and options but without an MXFP8 overlay; null
// without --draft.
inline std::unique_ptr<runtime::Engine> load_draft(const DraftOptions& d,
                                                   runtime::EngineOptions eo) {
  if (d.path.empty()) return nullptr;
  eo.overlay = {};
  return runtime::load_engine(Checkpoint::open(d.path), eo);
}

}  // namespace exl3::cli
