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
//
// Prefix caching (enable_prefix_cache): advance(seq, tokens) records the committed tokens, and
// each page they fill is published under a hash of every token up to its end (chained page by
// page). adopt_prefix gives a new sequence the published pages of its prompt's leading full
// pages, so their keys and values are not computed again. Pages are reference counted: a page
// two sequences hold is read-only (a sequence only writes past its adopted length, on fresh
// pages), and a published page no sequence holds stays cached, reclaimed least recently released
// first when the pool runs out of free pages. A lookup checks the page's own tokens and its
// parent's hash, so a false match needs two different earlier prefixes with equal 64-bit hashes.
//
// Formats (exl3/cpu/kv_codec.hpp): kNative stores fp32 floats, reachable through key() / value();
// the quantized formats (fp8, q8, q4) store codes and fp16 scales per group of 32 channels, written
// by store() and read back by load(). Every width must then be a multiple of 32.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "exl3/cpu/kv_codec.hpp"

namespace exl3::runtime {

using cpu::KvFormat;

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
               bool host_storage = true, KvFormat format = KvFormat::kNative);

  // A new, empty sequence.
  SeqId add_sequence();
  // Returns the sequence's pages to the pool; the id becomes invalid.
  void remove_sequence(SeqId seq);
  // Empties a sequence (its pages go back to the pool), keeping the id.
  void clear(SeqId seq);
  // Keeps the first `length` (<= length(seq)) committed tokens and gives the pages past them
  // back to the pool (speculative decoding drops the draft tokens the target rejected). Refuses
  // to cut inside a page another sequence shares (a prefix-cache page), leaving all as it was.
  void truncate(SeqId seq, int64_t length);

  // Prefix caching, off by default (see the top of this file).
  void enable_prefix_cache();
  bool prefix_cache() const { return prefix_cache_; }
  // On an empty sequence: takes the published pages matching `prompt`'s leading full pages
  // (keeping at least one prompt token to compute) and returns the tokens they hold (0 when
  // caching is off or nothing matches). With `usable_end`, the adopted run ends at the deepest
  // matching page whose chain hash it accepts (an engine that keeps state beside the cache
  // adopts only as far as it has that state).
  int64_t adopt_prefix(SeqId seq, std::span<const int32_t> prompt,
                       const std::function<bool(uint64_t)>& usable_end = {});
  // The chain hash of the sequence's full page `page` (prefix caching), or nullopt for a page
  // not yet full or out of range.
  std::optional<uint64_t> page_hash(SeqId seq, int64_t page) const;
  // Pages published (cached) now, and prompt tokens adopt_prefix has given out so far.
  int64_t cached_pages() const { return static_cast<int64_t>(by_hash_.size()); }
  int64_t prefix_hit_tokens() const { return hit_tokens_; }

  int64_t length(SeqId seq) const;  // committed tokens
  // Changes whenever the sequence's tokens change other than by appending (a new sequence,
  // clear, truncate, an adopted prefix): state kept beside the cache (a gated DeltaNet layer's)
  // is valid only for the generation it was computed in.
  uint64_t generation(SeqId seq) const;
  // Backs positions [0, length + new_tokens) with pages. Throws exl3::Error when the pool has
  // too few free pages (nothing is taken then).
  void reserve(SeqId seq, int64_t new_tokens);
  // Free pages reserve(seq, new_tokens) would take (0 when the sequence's pages suffice).
  int64_t pages_needed(SeqId seq, int64_t new_tokens) const;
  // Commits n reserved tokens: length += n (not with prefix caching, which needs the tokens).
  void advance(SeqId seq, int64_t n);
  // The same for `tokens` (the committed ids, which prefix caching records and publishes).
  void advance(SeqId seq, std::span<const int32_t> tokens);

  KvFormat format() const { return format_; }
  // Writes the keys and values of token `pos` (< reserved length) in `layer` (k_width / v_width
  // floats), quantized in a quantized format.
  void store(int layer, SeqId seq, int64_t pos, const float* k, const float* v);
  // Reads tokens begin .. end - 1 (< reserved length) of `layer` into k [n, k_width] and
  // v [n, v_width], decoded in a quantized format.
  void load(int layer, SeqId seq, int64_t begin, int64_t end, float* k, float* v) const;

  // The K / V slot of token `pos` (< reserved length) in `layer`: kNative only (throws
  // otherwise).
  float* key(int layer, SeqId seq, int64_t pos);
  float* value(int layer, SeqId seq, int64_t pos);
  const float* key(int layer, SeqId seq, int64_t pos) const;
  const float* value(int layer, SeqId seq, int64_t pos) const;

  std::span<const int32_t> page_table(SeqId seq) const;
  int64_t page_size() const { return page_size_; }
  int64_t num_pages() const { return num_pages_; }
  // Pages a sequence may take: free ones and cached ones no sequence holds.
  int64_t free_pages() const { return static_cast<int64_t>(free_.size() + idle_.size()); }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const KvLayerShape& layer_shape(int layer) const { return layers_[static_cast<size_t>(layer)]; }
  uint64_t bytes() const;
  // Bytes one token takes over all layers (K and V, codes and scales).
  uint64_t bytes_per_token() const;

 private:
  struct Seq {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> pages;
    std::vector<int32_t> tokens;   // prefix caching: the committed ids
    std::vector<uint64_t> hashes;  // prefix caching: the chain hash of each full page
    uint64_t generation = 0;
  };
  // A published page: its chain hash, its parent's, and its tokens (checked on a lookup).
  struct Published {
    bool live = false;
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;
  };
  const Seq& seq_at(SeqId seq) const;
  Seq& seq_at(SeqId seq);
  int64_t slot(const Seq& s, int64_t pos) const;
  void commit(SeqId seq, int64_t n);
  int32_t take_page();              // a free page, else the least recently released cached one
  void release_page(int32_t page);  // one holder less
  void unpublish(int32_t page);

  std::vector<KvLayerShape> layers_;
  int64_t page_size_;
  int64_t num_pages_;
  bool host_storage_ = true;
  const float* native_slot(const std::vector<std::vector<float>>& plane, int layer, SeqId seq,
                           int64_t pos, int64_t width) const;

  std::vector<std::vector<float>> k_, v_;  // per layer (kNative)
  KvFormat format_ = KvFormat::kNative;
  // Quantized formats, per layer: codes [slots, code bytes of the width], scales [slots, width /
  // 32].
  std::vector<std::vector<uint8_t>> kq_, vq_;
  std::vector<std::vector<uint16_t>> ks_, vs_;
  std::vector<int32_t> free_;  // free page ids (a stack)
  std::vector<Seq> seqs_;
  std::vector<int32_t> refs_;  // per page: sequences holding it
  bool prefix_cache_ = false;
  std::vector<Published> published_;  // per page
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::list<int32_t> idle_;  // published pages no sequence holds, least recently released first
  std::vector<std::list<int32_t>::iterator> idle_pos_;  // per page, valid while in idle_
  int64_t hit_tokens_ = 0;
  uint64_t generations_ = 0;  // the last generation handed out
};

}  // namespace exl3::runtime
