// Perplexity, KL divergence and top-1 agreement over a token stream (see eval.hpp).
#include "exl3/eval/eval.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include <tbb/parallel_for.h>

#include "exl3/error.hpp"
#include "exl3/eval/builtin_text.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/text/tokenizer.hpp"

namespace exl3 {

namespace {

using runtime::Engine;
using runtime::LogitsMode;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void validate_options(const EvalOptions& o) {
  if (o.context < 2)
    fail("eval: context {} is too short; a window needs at least 2 tokens", o.context);
  if (o.stride < 0 || o.stride > o.context) {
    fail("eval: stride {} must be in 1..context ({}), or 0 for stride = context", o.stride,
         o.context);
  }
  if (o.max_tokens < 0) fail("eval: max_tokens {} must be >= 0 (0 = the whole text)", o.max_tokens);
  if (o.chunk < 1) fail("eval: chunk {} must be >= 1", o.chunk);
}

// A sequence that is dropped however the window ends (also on a throw).
class ScopedSequence {
 public:
  explicit ScopedSequence(Engine* e) : engine_(e), seq_(e != nullptr ? e->new_sequence() : -1) {}
  ~ScopedSequence() {
    if (engine_ != nullptr) engine_->drop_sequence(seq_);
  }
  ScopedSequence(const ScopedSequence&) = delete;
  ScopedSequence& operator=(const ScopedSequence&) = delete;
  Engine::SeqId id() const { return seq_; }

 private:
  Engine* engine_;
  Engine::SeqId seq_;
};

// What one logits row contributes. Computed in fp64 from the fp32 logits.
struct RowScore {
  double nll = 0.0;
  double ref_nll = 0.0;
  double kl = 0.0;
  bool agree = false;
  bool finite = true;
  bool ref_finite = true;
};

// log(sum exp(z)) in fp64, and the argmax (lowest index on ties). Sets finite=false when a
// logit is NaN or infinite.
double log_sum_exp(std::span<const float> z, int32_t& arg, bool& finite) {
  double mx = -std::numeric_limits<double>::infinity();
  arg = 0;
  for (size_t v = 0; v < z.size(); ++v) {
    const double x = z[v];
    if (!std::isfinite(x)) {
      finite = false;
      return 0.0;
    }
    if (x > mx) {
      mx = x;
      arg = static_cast<int32_t>(v);
    }
  }
  double sum = 0.0;
  for (const float x : z) sum += std::exp(static_cast<double>(x) - mx);
  return mx + std::log(sum);
}

RowScore score_row(std::span<const float> z, std::span<const float> zr, int32_t target) {
  RowScore s;
  int32_t arg = 0, arg_r = 0;
  const double lse = log_sum_exp(z, arg, s.finite);
  if (!s.finite) return s;
  s.nll = lse - static_cast<double>(z[static_cast<size_t>(target)]);
  if (zr.empty()) return s;
  const double lse_r = log_sum_exp(zr, arg_r, s.ref_finite);
  if (!s.ref_finite) return s;
  s.ref_nll = lse_r - static_cast<double>(zr[static_cast<size_t>(target)]);
  double kl = 0.0;
  for (size_t v = 0; v < z.size(); ++v) {
    const double lr = static_cast<double>(zr[v]) - lse_r, lm = static_cast<double>(z[v]) - lse;
    kl += std::exp(lr) * (lr - lm);
  }
  s.kl = kl;
  s.agree = arg == arg_r;
  return s;
}

// Appends `tokens` to `seq` in chunks without computing logits (context-only positions).
void feed_context(Engine& e, Engine::SeqId seq, std::span<const int32_t> tokens, int64_t chunk) {
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(chunk)) {
    const size_t n = std::min(tokens.size() - i, static_cast<size_t>(chunk));
    (void)e.forward(seq, tokens.subspan(i, n), LogitsMode::kLast);
  }
}

int64_t cap(int64_t v, int64_t max_positions) {
  return max_positions > 0 ? std::min(v, max_positions) : v;
}

std::string quoted(const std::optional<std::string>& s) {
  if (!s) return "(no token)";
  return nlohmann::json(*s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::vector<EvalWindow> plan_eval_windows(int64_t num_tokens, int64_t context, int64_t stride) {
  if (num_tokens < 2)
    fail("eval: {} token(s) give no prediction to score; at least 2 are needed", num_tokens);
  if (context < 2) fail("eval: context {} is too short; a window needs at least 2 tokens", context);
  if (stride < 1 || stride > context)
    fail("eval: stride {} must be in 1..context ({})", stride, context);
  std::vector<EvalWindow> out;
  int64_t scored_until = 1;  // token 0 has nothing before it
  for (int64_t begin = 0;; begin += stride) {
    const int64_t end = std::min(begin + context, num_tokens);
    const int64_t first = std::max(scored_until, begin + 1);
    if (first < end) out.push_back({begin, end, first});
    scored_until = std::max(scored_until, end);
    if (end == num_tokens) break;
  }
  return out;
}

int64_t effective_context(const Engine& model, const Engine* reference, int64_t requested,
                          int64_t num_tokens) {
  int64_t ctx = cap(requested, model.spec().max_position_embeddings);
  if (reference != nullptr) ctx = cap(ctx, reference->spec().max_position_embeddings);
  return std::min(ctx, num_tokens);
}

EvalResult evaluate(Engine& model, Engine* reference, std::span<const int32_t> all_tokens,
                    const EvalOptions& opts, const EvalProgressFn& progress) {
  validate_options(opts);
  const int64_t vocab = model.spec().vocab_size;
  if (reference != nullptr && reference->spec().vocab_size != vocab) {
    fail(
        "eval: the vocabularies differ: the model has {} logits per token ({} vocab_size), the "
        "reference {} ({}); "
        "KL and top-1 need the same vocabulary (compare a quantized model with its own source)",
        vocab, model.spec().label, reference->spec().vocab_size, reference->spec().label);
  }
  auto tokens = all_tokens;
  if (opts.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > opts.max_tokens) {
    tokens = tokens.first(static_cast<size_t>(opts.max_tokens));
  }
  const auto n = static_cast<int64_t>(tokens.size());
  if (n < 2) fail("eval: {} token(s) give no prediction to score; at least 2 are needed", n);
  // The last token of a window is a target but never an input: check every id here.
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = tokens[static_cast<size_t>(i)];
    if (id < 0 || id >= vocab) {
      fail(
          "eval: token id {} at position {} is outside the vocabulary 0..{} of {}; was the text "
          "tokenized with "
          "another model's tokenizer?",
          id, i, vocab - 1, model.spec().label);
    }
  }

  EvalResult r;
  r.kv_cache = model.kv_cache_info();
  if (reference != nullptr) r.reference_kv_cache = reference->kv_cache_info();
  r.text_tokens = static_cast<int64_t>(all_tokens.size());
  r.tokens = n;
  r.context = effective_context(model, reference, opts.context, n);
  r.stride = std::min(opts.stride == 0 ? r.context : opts.stride, r.context);
  const auto windows = plan_eval_windows(n, r.context, r.stride);
  r.windows = static_cast<int64_t>(windows.size());
  // One window at a time per engine; one engine serving as both holds two sequences.
  const int64_t same = reference == &model ? 2 : 1;
  for (auto* e : {&model, reference}) {
    if (e != nullptr && e->free_cache_tokens() < same * r.context) {
      fail(
          "eval: {}: the KV cache has room for {} tokens, a window needs {}; load the engine with "
          "cache_tokens >= the context",
          e->spec().label, e->free_cache_tokens(), same * r.context);
    }
  }
  int64_t to_score = 0;
  for (const auto& w : windows) to_score += w.end - w.first_target;

  const auto t_start = Clock::now();
  double nll_sum = 0.0, ref_nll_sum = 0.0, kl_sum = 0.0, kl_max = 0.0;
  int64_t agree = 0, scored = 0;
  std::vector<RowScore> rows;
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const EvalWindow& w = windows[wi];
    ScopedSequence seq(&model), ref_seq(reference);
    // Positions before first_target - 1 only give context: their logits predict nothing scored.
    const auto prefix = tokens.subspan(static_cast<size_t>(w.begin),
                                       static_cast<size_t>(w.first_target - 1 - w.begin));
    auto t0 = Clock::now();
    feed_context(model, seq.id(), prefix, opts.chunk);
    r.model_seconds += seconds_since(t0);
    if (reference != nullptr) {
      t0 = Clock::now();
      feed_context(*reference, ref_seq.id(), prefix, opts.chunk);
      r.reference_seconds += seconds_since(t0);
    }
    // Position p's logits predict token p + 1: feed first_target - 1 .. end - 2.
    for (int64_t p0 = w.first_target - 1; p0 < w.end - 1; p0 += opts.chunk) {
      const int64_t p1 = std::min(p0 + opts.chunk, w.end - 1);
      const auto in = tokens.subspan(static_cast<size_t>(p0), static_cast<size_t>(p1 - p0));
      t0 = Clock::now();
      const auto z = model.forward(seq.id(), in, LogitsMode::kAll);
      r.model_seconds += seconds_since(t0);
      std::vector<float> zr;
      if (reference != nullptr) {
        t0 = Clock::now();
        zr = reference->forward(ref_seq.id(), in, LogitsMode::kAll);
        r.reference_seconds += seconds_since(t0);
      }
      const int64_t m = p1 - p0;
      rows.assign(static_cast<size_t>(m), RowScore{});
      tbb::parallel_for(int64_t{0}, m, [&](int64_t i) {
        const auto off = static_cast<size_t>(i * vocab), len = static_cast<size_t>(vocab);
        const auto row = std::span<const float>(z).subspan(off, len);
        const auto ref_row =
            zr.empty() ? std::span<const float>() : std::span<const float>(zr).subspan(off, len);
        rows[static_cast<size_t>(i)] =
            score_row(row, ref_row, tokens[static_cast<size_t>(p0 + i + 1)]);
      });
      // Summed in position order: the result does not depend on the thread count.
      for (int64_t i = 0; i < m; ++i) {
        const RowScore& s = rows[static_cast<size_t>(i)];
        if (!s.finite || !s.ref_finite) {
          fail(
              "eval: {} produced a non-finite logit at token position {} (window {} of {}); the "
              "model's "
              "weights or activations overflow",
              s.finite ? reference->spec().label : model.spec().label, p0 + i, wi + 1,
              windows.size());
        }
        nll_sum += s.nll;
        ref_nll_sum += s.ref_nll;
        kl_sum += s.kl;
        kl_max = std::max(kl_max, s.kl);
        agree += s.agree ? 1 : 0;
      }
      scored += m;
      if (progress) {
        EvalProgress ev;
        ev.window = static_cast<int64_t>(wi) + (p1 == w.end - 1 ? 1 : 0);
        ev.windows = r.windows;
        ev.scored = scored;
        ev.to_score = to_score;
        ev.elapsed = seconds_since(t_start);
        ev.eta_seconds =
            ev.elapsed / static_cast<double>(scored) * static_cast<double>(to_score - scored);
        progress(ev);
      }
    }
  }
  r.seconds = seconds_since(t_start);
  r.scored = scored;
  const auto count = static_cast<double>(scored);
  r.nll = nll_sum / count;
  r.perplexity = std::exp(r.nll);
  if (reference != nullptr) {
    EvalReferenceStats s;
    s.nll = ref_nll_sum / count;
    s.perplexity = std::exp(s.nll);
    s.kl = kl_sum / count;
    s.kl_max = kl_max;
    s.top1_agree = agree;
    s.top1_agreement = static_cast<double>(agree) / count;
    r.reference = s;
  }
  return r;
}

nlohmann::json EvalResult::to_json() const {
  nlohmann::json j = {
      {"text_tokens", text_tokens},
      {"tokens", tokens},
      {"context", context},
      {"stride", stride},
      {"windows", windows},
      {"scored", scored},
      {"nll", nll},
      {"perplexity", perplexity},
      {"seconds", seconds},
      {"model_seconds", model_seconds},
      {"reference_seconds", reference_seconds},
      {"tokens_per_second", seconds > 0 ? static_cast<double>(scored) / seconds : 0.0}};
  if (reference) {
    j["reference"] = {{"nll", reference->nll},
                      {"perplexity", reference->perplexity},
                      {"kl", reference->kl},
                      {"kl_max", reference->kl_max},
                      {"top1_agree", reference->top1_agree},
                      {"top1_agreement", reference->top1_agreement}};
  } else {
    j["reference"] = nullptr;
  }
  if (!overlay.layers.empty() || !overlay.kept_unquantized.empty())
    j["overlay"] = overlay.to_json();
  const auto kv_json = [](const runtime::Engine::KvCacheInfo& k) {
    return nlohmann::json{{"format", std::string(cpu::kv_format_name(k.format))},
                          {"bytes_per_token", k.bytes_per_token}};
  };
  j["kv_cache"] = kv_json(kv_cache);
  j["reference_kv_cache"] =
      reference_kv_cache ? kv_json(*reference_kv_cache) : nlohmann::json(nullptr);
  return j;
}

void check_same_vocabulary(const Tokenizer& a, const Tokenizer& b) {
  if (a.vocab_size() != b.vocab_size() || a.num_tokens() != b.num_tokens()) {
    fail(
        "eval: the tokenizers differ: {} has {} tokens (ids 0..{}), {} has {} (ids 0..{}); KL and "
        "top-1 need "
        "both models to predict over the same vocabulary",
        a.source(), a.num_tokens(), a.vocab_size() - 1, b.source(), b.num_tokens(),
        b.vocab_size() - 1);
  }
  for (int32_t id = 0; id < a.vocab_size(); ++id) {
    const auto ta = a.id_to_token(id), tb = b.id_to_token(id);
    if (ta != tb || a.is_special(id) != b.is_special(id)) {
      fail(
          "eval: the tokenizers differ at token id {}: {} has {}{}, {} has {}{}; KL and top-1 need "
          "both models "
          "to predict over the same vocabulary",
          id, a.source(), quoted(ta), a.is_special(id) ? " (special)" : "", b.source(), quoted(tb),
          b.is_special(id) ? " (special)" : "");
    }
  }
}

std::string load_eval_text(const std::string& file) {
  if (file == kBuiltinTextName) return std::string(builtin_text());
  const std::filesystem::path p(file);
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) {
    fail(
        "{}: no such file; the text must be a plain-text (UTF-8) file, or `{}` for the bundled "
        "text",
        file, kBuiltinTextName);
  }
  if (std::filesystem::is_directory(p, ec)) fail("{}: is a folder, not a text file", file);
  std::string text = read_text_file(p);
  if (text.empty()) fail("{}: the file is empty; give a text of at least a few sentences", file);
  return text;
}

EvalResult evaluate_text(const EvalModels& models, std::string_view text, const EvalOptions& opts,
                         const EvalProgressFn& progress, const std::string& text_label) {
  validate_options(opts);
  if (text.empty())
    fail("{}: the text is empty; give a text of at least a few sentences", text_label);
  const auto tok = Tokenizer::load(models.model);
  if (models.reference && std::filesystem::exists(*models.reference / "tokenizer.json")) {
    check_same_vocabulary(tok, Tokenizer::load(*models.reference));
  }
  const auto ids = tok.encode(text, true);
  const auto used = opts.max_tokens > 0
                        ? std::min<int64_t>(opts.max_tokens, static_cast<int64_t>(ids.size()))
                        : static_cast<int64_t>(ids.size());
  if (used < 2) {
    fail(
        "{}: the text gives {} token(s) with {}'s tokenizer; at least 2 are needed to score one "
        "prediction",
        text_label, used, models.model.string());
  }
  runtime::EngineOptions eo;
  eo.device = models.device;
  eo.cache_tokens = std::min(opts.context, used);  // one window at a time
  eo.load_progress = models.load_progress;
  eo.moe = models.moe;
  eo.mxfp8 = models.mxfp8;
  runtime::EngineOptions model_eo = eo;
  model_eo.overlay = models.overlay;
  model_eo.kv_format = models.kv_format;
  auto model = runtime::load_engine(models.model, model_eo);
  std::unique_ptr<Engine> reference;
  if (models.reference) reference = runtime::load_engine(*models.reference, eo);
  EvalResult r = evaluate(*model, reference.get(), ids, opts, progress);
  r.overlay = model->overlay_report();
  return r;
}

EvalProgressFn make_eval_progress_printer(std::FILE* out, bool terminal) {
  if (!terminal) {
    auto last = std::make_shared<int64_t>(0);
    return [out, last](const EvalProgress& e) {
      if (e.window == *last) return;
      *last = e.window;
      fmt::print(out, "[eval window {}/{}] {}/{} tokens scored, {:.1f} s\n", e.window, e.windows,
                 e.scored, e.to_score, e.elapsed);
      std::fflush(out);
    };
  }
  return [out](const EvalProgress& e) {
    constexpr int kWidth = 30;
    const double frac =
        e.to_score > 0 ? static_cast<double>(e.scored) / static_cast<double>(e.to_score) : 1.0;
    const int fill = static_cast<int>(frac * kWidth);
    fmt::print(out,
               "\r\x1b[K[{:=<{}}{:<{}}] window {}/{}  {}/{} tokens {:3.0f}%  {:.1f} s elapsed, ETA "
               "{:.0f} s",
               "", fill, "", kWidth - fill, e.window, e.windows, e.scored, e.to_score, 100.0 * frac,
               e.elapsed, std::max(0.0, e.eta_seconds));
    if (e.scored == e.to_score) fmt::print(out, "\n");
    std::fflush(out);
  };
}

}  // namespace exl3
