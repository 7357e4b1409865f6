// Paged KV cache: fixed-size pages from one pool, a page table per sequence.
//
// Every layer has a K and a V store of num_pages * page_size token slots; a slot holds the
// layer's k_width / v_width floats (GQA: num_kv_heads * head_dim each, heads contiguous; an MLA
// module would declare its latent width instead). Token t of a sequence lives in page
// table[t / page_size], slot t % page_size, in every layer: one page table serves all layers.
//
// A forward pass over n new tokens calls reserve(seq, n) (pages are taken from the free list
// only when the sequence crosses a page boundary), writes the new keys/values of each layer at
// positions length .. length + n - 1, attends over 0 .. length + n - 1, and calls
// advance(seq, n) at the end. Decode is the n = 1 case. All storage is allocated up front.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace exl3::runtime {

struct KvLayerShape {
  int64_t k_width = 0;  // floats per token
  int64_t v_width = 0;
};

class PagedKvCache {
 public:
  using SeqId = int32_t;

  // host_storage = false keeps only the bookkeeping (pages, tables, lengths) for a backend that
  // stores K and V itself (the CUDA engine); key() / value() must not be called then.
  PagedKvCache(std::vector<KvLayerShape> layers, int64_t page_size, int64_t num_pages,
               bool host_storage = true);

  // A new, empty sequence.
  SeqId add_sequence();
  // Returns the sequence's pages to the pool; the id becomes invalid.
  void remove_sequence(SeqId seq);
  // Empties a sequence (its pages go back to the pool), keeping the id.
  void clear(SeqId seq);
  // Keeps the first `length` (<= length(seq)) committed tokens and gives the pages past them
  // back to the pool (speculative decoding drops the draft tokens the target rejected).
  void truncate(SeqId seq, int64_t length);

  int64_t length(SeqId seq) const;  // committed tokens
  // Backs positions [0, length + new_tokens) with pages. Throws exl3::Error when the pool has
  // too few free pages (nothing is taken then).
  void reserve(SeqId seq, int64_t new_tokens);
  // Free pages reserve(seq, new_tokens) would take (0 when the sequence's pages suffice).
  int64_t pages_needed(SeqId seq, int64_t new_tokens) const;
  // Commits n reserved tokens: length += n.
  void advance(SeqId seq, int64_t n);

  // The K / V slot of token `pos` (< reserved length) in `layer`.
  float* key(int layer, SeqId seq, int64_t pos);
  float* value(int layer, SeqId seq, int64_t pos);
  const float* key(int layer, SeqId seq, int64_t pos) const;
  const float* value(int layer, SeqId seq, int64_t pos) const;

  std::span<const int32_t> page_table(SeqId seq) const;
  int64_t page_size() const { return page_size_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const KvLayerShape& layer_shape(int layer) const { return layers_[static_cast<size_t>(layer)]; }
  uint64_t bytes() const;

 private:
  struct Seq {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> pages;
  };
  const Seq& seq_at(SeqId seq) const;
  Seq& seq_at(SeqId seq);
  int64_t slot(const Seq& s, int64_t pos) const;

  std::vector<KvLayerShape> layers_;
  int64_t page_size_;
  int64_t num_pages_;
  bool host_storage_ = true;
  std::vector<std::vector<float>> k_, v_;  // per layer
  std::vector<int32_t> free_;              // free page ids (a stack)
  std::vector<Seq> seqs_;
};

}  // namespace exl3::runtime
