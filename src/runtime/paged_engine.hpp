// The sequence bookkeeping every single-rank engine shares (internal): sequences are the paged KV
// cache's, so the Engine calls about them are the cache's answers. With prefix caching on a model
// with recurrent layers, also the snapshots of their state that let a cached prefix be adopted
// (exl3/runtime/recurrent_snapshots.hpp); the engine copies the states.
#pragma once

#include <memory>
#include <optional>

#include "exl3/error.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/kv_cache.hpp"
#include "exl3/runtime/recurrent_snapshots.hpp"

namespace exl3::runtime {

class PagedEngine : public Engine {
 public:
  SeqId new_sequence() override { return cache_->add_sequence(); }
  void drop_sequence(SeqId seq) override { cache_->remove_sequence(seq); }
  int64_t sequence_length(SeqId seq) const override { return cache_->length(seq); }
  void truncate_sequence(SeqId seq, int64_t length) override { cache_->truncate(seq, length); }
  int64_t adopt_prefix(SeqId seq, std::span<const int32_t> prompt) override {
    if (!snapshots_) return cache_->adopt_prefix(seq, prompt);
    const int64_t n = cache_->adopt_prefix(
        seq, prompt, [this](uint64_t page) { return snapshots_->contains(page); });
    if (n == 0) return 0;
    try {
      const auto page = cache_->page_hash(seq, n / cache_->page_size() - 1);
      restore_recurrent(seq, *snapshots_->find(*page), n);
    } catch (const Error&) {
      // No state to continue from (CUDA: every state slot held): the prompt is computed whole,
      // and its forward reports what it lacks.
      cache_->truncate(seq, 0);
      return 0;
    }
    return n;
  }
  KvCacheInfo kv_cache_info() const override { return {cache_->format(), kv_bytes_per_token_}; }
  int64_t free_cache_tokens() const override { return cache_->free_pages() * cache_->page_size(); }
  int64_t cache_tokens_needed(SeqId seq, int64_t new_tokens) const override {
    return cache_->pages_needed(seq, new_tokens) * cache_->page_size();
  }

 protected:
  // Engines with recurrent layers and prefix caching: copy `seq`'s recurrent state into
  // snapshot `slot`; give `seq` (which has just adopted `length` tokens of cached pages) the
  // state in snapshot `slot`.
  virtual void save_recurrent(SeqId seq, int64_t slot) = 0;
  virtual void restore_recurrent(SeqId seq, int64_t slot, int64_t length) = 0;

  // After a run of `seq` that ended at `end` (its committed length): keeps its recurrent state
  // when the run was (part of) a prefill and ended on a full page boundary.
  void snapshot_if_due(SeqId seq, int64_t end, bool prefill) {
    const int64_t page_size = cache_->page_size();
    if (!snapshots_ || !RecurrentSnapshots::snapshot_after(end, prefill, page_size)) return;
    if (const auto page = cache_->page_hash(seq, end / page_size - 1)) {
      save_recurrent(seq, snapshots_->slot_for(*page));
    }
  }
  // Tokens of a run to feed before the snapshot it is due (all of them when none is due).
  int64_t run_before_snapshot(int64_t start, int64_t n) const {
    return snapshots_ ? RecurrentSnapshots::run_before_snapshot(start, n, cache_->page_size()) : n;
  }

  std::unique_ptr<PagedKvCache> cache_;  // set by the engine's constructor
  uint64_t kv_bytes_per_token_ = 0;      // likewise (the cache itself, or the backend's copy)
  // Set by the constructor of an engine of a recurrent model with prefix caching.
  std::optional<RecurrentSnapshots> snapshots_;
};

}  // namespace exl3::runtime
