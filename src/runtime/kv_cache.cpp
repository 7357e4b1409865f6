// PagedKvCache (see kv_cache.hpp).
#include "exl3/runtime/kv_cache.hpp"

#include <algorithm>

#include "exl3/error.hpp"

namespace exl3::runtime {

PagedKvCache::PagedKvCache(std::vector<KvLayerShape> layers, int64_t page_size, int64_t num_pages,
                           bool host_storage)
    : layers_(std::move(layers)),
      page_size_(page_size),
      num_pages_(num_pages),
      host_storage_(host_storage) {
  if (page_size <= 0) fail("KV cache: page size {} must be positive", page_size);
  if (num_pages <= 0 || num_pages > INT32_MAX)
    fail("KV cache: page count {} must be in 1..2^31-1", num_pages);
  k_.resize(layers_.size());
  v_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const auto& s = layers_[l];
    if (s.k_width < 0 || s.v_width < 0) fail("KV cache: layer {} has a negative width", l);
    if (!host_storage_) continue;
    k_[l].assign(static_cast<size_t>(num_pages * page_size * s.k_width), 0.0f);
    v_[l].assign(static_cast<size_t>(num_pages * page_size * s.v_width), 0.0f);
  }
  free_.reserve(static_cast<size_t>(num_pages));
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

PagedKvCache::SeqId PagedKvCache::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!seqs_[i].live) {
      seqs_[i] = Seq{true, 0, {}};
      return static_cast<SeqId>(i);
    }
  }
  seqs_.push_back(Seq{true, 0, {}});
  return static_cast<SeqId>(seqs_.size() - 1);
}

const PagedKvCache::Seq& PagedKvCache::seq_at(SeqId seq) const {
  if (seq < 0 || static_cast<size_t>(seq) >= seqs_.size() ||
      !seqs_[static_cast<size_t>(seq)].live) {
    fail("KV cache: sequence {} does not exist", seq);
  }
  return seqs_[static_cast<size_t>(seq)];
}

PagedKvCache::Seq& PagedKvCache::seq_at(SeqId seq) {
  return const_cast<Seq&>(static_cast<const PagedKvCache*>(this)->seq_at(seq));
}

void PagedKvCache::clear(SeqId seq) {
  Seq& s = seq_at(seq);
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) free_.push_back(*it);
  s.pages.clear();
  s.length = 0;
}

void PagedKvCache::truncate(SeqId seq, int64_t length) {
  Seq& s = seq_at(seq);
  if (length < 0 || length > s.length) {
    fail("KV cache: sequence {} cannot be cut to {} tokens (it holds {})", seq, length, s.length);
  }
  const auto keep = static_cast<size_t>((length + page_size_ - 1) / page_size_);
  while (s.pages.size() > keep) {
    free_.push_back(s.pages.back());
    s.pages.pop_back();
  }
  s.length = length;
}

void PagedKvCache::remove_sequence(SeqId seq) {
  clear(seq);
  seqs_[static_cast<size_t>(seq)].live = false;
}

int64_t PagedKvCache::length(SeqId seq) const {
  return seq_at(seq).length;
}

int64_t PagedKvCache::pages_needed(SeqId seq, int64_t new_tokens) const {
  const Seq& s = seq_at(seq);
  if (new_tokens < 0) fail("KV cache: cannot reserve {} tokens", new_tokens);
  const int64_t need = (s.length + new_tokens + page_size_ - 1) / page_size_;
  return std::max<int64_t>(0, need - static_cast<int64_t>(s.pages.size()));
}

void PagedKvCache::reserve(SeqId seq, int64_t new_tokens) {
  Seq& s = seq_at(seq);
  const int64_t more = pages_needed(seq, new_tokens);
  if (more <= 0) return;
  if (more > free_pages()) {
    fail(
        "KV cache is full: sequence {} needs {} more pages of {} tokens for {} + {} tokens, {} of "
        "{} pages are free; hint: raise the cache size (e.g. --cache-tokens)",
        seq, more, page_size_, s.length, new_tokens, free_pages(), num_pages_);
  }
  for (int64_t i = 0; i < more; ++i) {
    s.pages.push_back(free_.back());
    free_.pop_back();
  }
}

void PagedKvCache::advance(SeqId seq, int64_t n) {
  Seq& s = seq_at(seq);
  if (n < 0 || s.length + n > static_cast<int64_t>(s.pages.size()) * page_size_) {
    fail("KV cache: sequence {} cannot advance by {} (length {}, {} tokens reserved)", seq, n,
         s.length, static_cast<int64_t>(s.pages.size()) * page_size_);
  }
  s.length += n;
}

int64_t PagedKvCache::slot(const Seq& s, int64_t pos) const {
  if (!host_storage_)
    fail("KV cache: this cache keeps no host storage (its backend stores K and V)");
  const int64_t page = pos / page_size_;
  if (pos < 0 || page >= static_cast<int64_t>(s.pages.size())) {
    fail("KV cache: position {} is not reserved ({} tokens reserved)", pos,
         static_cast<int64_t>(s.pages.size()) * page_size_);
  }
  return static_cast<int64_t>(s.pages[static_cast<size_t>(page)]) * page_size_ + pos % page_size_;
}

float* PagedKvCache::key(int layer, SeqId seq, int64_t pos) {
  const auto l = static_cast<size_t>(layer);
  return k_.at(l).data() + slot(seq_at(seq), pos) * layers_[l].k_width;
}
float* PagedKvCache::value(int layer, SeqId seq, int64_t pos) {
  const auto l = static_cast<size_t>(layer);
  return v_.at(l).data() + slot(seq_at(seq), pos) * layers_[l].v_width;
}
const float* PagedKvCache::key(int layer, SeqId seq, int64_t pos) const {
  const auto l = static_cast<size_t>(layer);
  return k_.at(l).data() + slot(seq_at(seq), pos) * layers_[l].k_width;
}
const float* PagedKvCache::value(int layer, SeqId seq, int64_t pos) const {
  const auto l = static_cast<size_t>(layer);
  return v_.at(l).data() + slot(seq_at(seq), pos) * layers_[l].v_width;
}

std::span<const int32_t> PagedKvCache::page_table(SeqId seq) const {
  return seq_at(seq).pages;
}

uint64_t PagedKvCache::bytes() const {
  uint64_t n = 0;
  for (size_t l = 0; l < layers_.size(); ++l) n += (k_[l].size() + v_[l].size()) * sizeof(float);
  return n;
}

}  // namespace exl3::runtime
