// The MTP draft head (see exl3/runtime/mtp.hpp): the MTP layer's block on its own CpuBackend and
// KV cache, fed the target's hidden states.
#include "exl3/runtime/mtp.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "cpu_backend.hpp"
#include "exl3/error.hpp"
#include "exl3/model/decoder.hpp"
#include "exl3/moe/layout.hpp"

namespace exl3::runtime {
namespace {

using model::Act;
using model::Slot;

// The description the head's backend loads from: the target's, with the MTP block as its only
// layer and the MTP layer's embedding, norm and head in place of the target's.
ModelSpec head_spec(const ModelSpec& target) {
  ModelSpec s = target;
  const MtpLayerSpec& m = target.mtp_layers.front();
  s.layers = {m.block};
  s.embed_tokens = m.embed_tokens;
  s.final_norm = m.head_norm;
  s.lm_head = m.head;
  s.lm_head_tied = m.head_tied;
  s.mtp_layers.clear();
  return s;
}

class MtpDraft final : public Engine {
 public:
  MtpDraft(Engine& target, const Checkpoint& ckpt, const EngineOptions& opts)
      : target_(target), ckpt_(ckpt), spec_(head_spec(target.spec())) {
    const MtpLayerSpec& m = target.spec().mtp_layers.front();
    const int64_t h = spec_.hidden_size;
    try {
      if (spec_.is_moe()) layout_ = moe::read_moe_layout(ckpt_);
      CpuBackend::Options bo;
      bo.moe_layout = layout_ ? &*layout_ : nullptr;
      backend_ = std::make_unique<CpuBackend>(ckpt_, spec_, std::move(bo));
      model::Backend& b = *backend_;  // the op layer's defaults (norm eps)
      embedding_ = b.load_embedding();
      enorm_ = b.load_norm(m.enorm, h);
      hnorm_ = b.load_norm(m.hnorm, h);
      eh_proj_ = b.load_linear({m.eh_proj, 2 * h, h});
      block_ = model::load_layer(b, spec_, spec_.layers.front(), 0);
      head_norm_ = b.load_norm(m.head_norm, h);
      head_ = m.head_tied ? b.load_tied_head({0, spec_.vocab_size})
                          : b.load_linear({m.head, h, spec_.vocab_size});
    } catch (const Error& e) {
      fail("{}: MTP layer '{}' does not load: {}", ckpt_.path().string(), m.block.prefix, e.what());
    }
    if (opts.page_size <= 0) fail("MTP: page size {} must be positive", opts.page_size);
    const int64_t pages =
        (std::max<int64_t>(opts.cache_tokens, 1) + opts.page_size - 1) / opts.page_size;
    cache_ = std::make_unique<PagedKvCache>(backend_->kv_shapes(), opts.page_size, pages);
  }

  const ModelSpec& spec() const override { return spec_; }
  Device device() const override { return Device::kCpu; }

  // A sequence that follows no target sequence: it can be sized (cache_tokens_needed) but not
  // run, since the head has no hidden states to read for it.
  SeqId new_sequence() override {
    const SeqId id = cache_->add_sequence();
    seqs_[id];
    return id;
  }

  SeqId new_draft_sequence(Engine& target, SeqId target_seq) override {
    if (&target != &target_) fail("MTP: the head drafts only for the model it was loaded with");
    target_.keep_hidden_states(target_seq, 0);
    const SeqId id = cache_->add_sequence();
    seqs_[id].target = target_seq;
    return id;
  }

  void drop_sequence(SeqId seq) override {
    at(seq);
    cache_->remove_sequence(seq);
    seqs_.erase(seq);
  }

  int64_t sequence_length(SeqId seq) const override {
    return static_cast<int64_t>(at(seq).tokens.size());
  }

  void truncate_sequence(SeqId seq, int64_t length) override {
    Seq& s = at(seq);
    if (length < 0 || length > static_cast<int64_t>(s.tokens.size())) {
      fail("MTP: cannot keep {} tokens of a sequence of {}", length, s.tokens.size());
    }
    s.tokens.resize(static_cast<size_t>(length));
    const int64_t entries = std::max<int64_t>(length - 1, 0);
    if (cache_->length(seq) > entries) cache_->truncate(seq, entries);
    s.exact = std::min(s.exact, entries);
    if (s.last_pos >= entries) s.last_pos = -1;
  }

  KvCacheInfo kv_cache_info() const override {
    return {cache_->format(), cache_->bytes_per_token()};
  }
  int64_t free_cache_tokens() const override { return cache_->free_pages() * cache_->page_size(); }
  int64_t cache_tokens_needed(SeqId seq, int64_t new_tokens) const override {
    at(seq);
    return cache_->pages_needed(seq, new_tokens) * cache_->page_size();
  }

  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    Seq& s = at(seq);
    if (s.target < 0) fail("MTP: sequence {} drafts for no target sequence", seq);
    if (mode != LogitsMode::kLast) fail("MTP: the head returns the last token's logits only");
    if (tokens.empty()) fail("MTP: forward of no tokens");
    for (const int32_t t : tokens) {
      if (t < 0 || t >= spec_.vocab_size) {
        fail("MTP: token id {} is outside the vocabulary (0..{})", t, spec_.vocab_size - 1);
      }
    }
    const size_t had = s.tokens.size();
    s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
    try {
      return run(seq, s);
    } catch (...) {
      s.tokens.resize(had);
      throw;
    }
  }

 private:
  struct Seq {
    SeqId target = -1;
    std::vector<int32_t> tokens;  // every token fed; cache entry p is for tokens[p + 1]
    int64_t exact = 0;            // entries below this were built from the target's states
    int64_t last_pos = -1;        // the entry `last_g` is the output of (-1: none)
    std::vector<float> last_g;
  };

  Seq& at(SeqId seq) { return const_cast<Seq&>(std::as_const(*this).at(seq)); }
  const Seq& at(SeqId seq) const {
    const auto it = seqs_.find(seq);
    if (it == seqs_.end()) fail("MTP: no sequence {}", seq);
    return it->second;
  }

  // Builds the entries the fed tokens call for (rebuilding provisional ones the target has
  // since scored) and returns the last one's logits (zeros when the sequence has no entry yet:
  // a single token predicts nothing).
  std::vector<float> run(SeqId seq, Seq& s) {
    const int64_t h = spec_.hidden_size;
    const int64_t end = static_cast<int64_t>(s.tokens.size()) - 1;  // entries wanted
    const auto target_h = [&](int64_t p) { return target_.hidden_state(s.target, p); };
    int64_t p0 = cache_->length(seq);
    if (s.exact < p0 && !target_h(s.exact).empty()) p0 = s.exact;
    if (p0 < cache_->length(seq)) {
      cache_->truncate(seq, p0);
      if (s.last_pos >= p0) s.last_pos = -1;  // its entry is rebuilt below
    }
    std::vector<float> logits(static_cast<size_t>(spec_.vocab_size), 0.0f);
    // The run with the target's states, as one pass.
    int64_t q = p0;
    while (q < end && !target_h(q).empty()) ++q;
    if (q > p0) {
      std::vector<float> hid(static_cast<size_t>((q - p0) * h));
      for (int64_t p = p0; p < q; ++p) {
        const auto row = target_h(p);
        std::copy(row.begin(), row.end(), hid.begin() + (p - p0) * h);
      }
      pass(seq, s, p0, q - p0, hid, logits);
    }
    if (p0 <= s.exact) s.exact = q;
    // Past what the target has computed: one entry at a time, each reading the one before.
    for (int64_t p = q; p < end; ++p) {
      if (p == 0 || s.last_pos != p - 1) {
        fail("MTP: no hidden state for position {} (the target sequence holds {})", p,
             target_.sequence_length(s.target));
      }
      const std::vector<float> hid = s.last_g;
      pass(seq, s, p, 1, hid, logits);
    }
    // The target's states below the exact entries are not read again.
    target_.keep_hidden_states(s.target, s.exact);
    return logits;
  }

  // Entries p0 .. p0 + m - 1 from `hid` [m, hidden] (the hidden states they read): the cache
  // writes, `logits` of the last one, and its output as s.last_g.
  void pass(SeqId seq, Seq& s, int64_t p0, int64_t m, const std::vector<float>& hid,
            std::vector<float>& logits) {
    const int64_t h = spec_.hidden_size;
    const auto tok = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(p0 + 1),
                                                                static_cast<size_t>(m));
    cache_->reserve(seq, m);  // throws (nothing taken) when full
    CpuBackend& b = *backend_;
    CpuBackend::Step st;
    st.cache = cache_.get();
    st.seq = seq;
    st.start = p0;
    st.n = m;
    st.tokens = tok;
    st.logit_rows = 1;
    st.logits = logits.data();
    b.begin(st);
    const Act x = b.act(Slot::kX, h);
    b.embed(*embedding_, x);
    if (p0 == 0) std::fill_n(x.data, h, 0.0f);  // position 0 reads no token (as the serving stacks)
    std::vector<float> e(static_cast<size_t>(m * h)), hn(e.size()), in(hid);
    b.add_rms_norm(x, nullptr, *enorm_, {e.data(), m, h});
    b.add_rms_norm({in.data(), m, h}, nullptr, *hnorm_, {hn.data(), m, h});
    // eh_proj reads concat(enorm(embedding), hnorm(hidden)) per row: the embedding half first.
    std::vector<float> cat(static_cast<size_t>(m * 2 * h));
    for (int64_t r = 0; r < m; ++r) {
      std::copy_n(e.data() + r * h, h, cat.data() + r * 2 * h);
      std::copy_n(hn.data() + r * h, h, cat.data() + r * 2 * h + h);
    }
    b.linear(*eh_proj_, {cat.data(), m, 2 * h}, x);
    const Act y = model::layer_forward(b, block_, h, x, nullptr);
    b.logits(x, &y, *head_norm_, *head_);  // x becomes the block's output g
    cache_->advance(seq, tok);
    s.last_g.assign(x.data + (m - 1) * h, x.data + m * h);
    s.last_pos = p0 + m - 1;
  }

  Engine& target_;
  Checkpoint ckpt_;  // keeps the mapped files alive
  ModelSpec spec_;
  std::optional<moe::MoeLayout> layout_;
  std::unique_ptr<CpuBackend> backend_;
  model::ModulePtr embedding_, enorm_, hnorm_, eh_proj_, head_norm_, head_;
  model::LayerModules block_;
  std::unique_ptr<PagedKvCache> cache_;
  std::map<SeqId, Seq> seqs_;
};

}  // namespace

std::unique_ptr<Engine> load_mtp_draft(Engine& target, const Checkpoint& ckpt,
                                       const EngineOptions& opts) {
  const ModelSpec& spec = target.spec();
  if (spec.mtp_layers.empty()) {
    fail(
        "{}: --mtp: the model has no MTP layers (config.json num_nextn_predict_layers is 0 or "
        "absent, or {} has none); hint: draft with a separate model (--draft)",
        ckpt.path().string(), architecture_name(spec.architecture));
  }
  if (target.device() != Device::kCpu) {
    fail(
        "{}: --mtp runs on the CPU engine only so far (the {} engine hands out no hidden "
        "states); hint: --device cpu, or draft with a separate model (--draft)",
        ckpt.path().string(), device_name(target.device()));
  }
  return std::make_unique<MtpDraft>(target, ckpt, opts);
}

}  // namespace exl3::runtime
