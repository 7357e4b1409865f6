// The sequence bookkeeping every single-rank engine shares (internal): sequences are the paged KV
// cache's, so the Engine calls about them are the cache's answers.
#pragma once

#include <memory>

#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/kv_cache.hpp"

namespace exl3::runtime {

class PagedEngine : public Engine {
 public:
  SeqId new_sequence() override { return cache_->add_sequence(); }
  void drop_sequence(SeqId seq) override { cache_->remove_sequence(seq); }
  int64_t sequence_length(SeqId seq) const override { return cache_->length(seq); }
  void truncate_sequence(SeqId seq, int64_t length) override { cache_->truncate(seq, length); }
  int64_t adopt_prefix(SeqId seq, std::span<const int32_t> prompt) override {
    return cache_->adopt_prefix(seq, prompt);
  }
  KvCacheInfo kv_cache_info() const override { return {cache_->format(), kv_bytes_per_token_}; }
  int64_t free_cache_tokens() const override { return cache_->free_pages() * cache_->page_size(); }
  int64_t cache_tokens_needed(SeqId seq, int64_t new_tokens) const override {
    return cache_->pages_needed(seq, new_tokens) * cache_->page_size();
  }

 protected:
  std::unique_ptr<PagedKvCache> cache_;  // set by the engine's constructor
  uint64_t kv_bytes_per_token_ = 0;      // likewise (the cache itself, or the backend's copy)
};

}  // namespace exl3::runtime
