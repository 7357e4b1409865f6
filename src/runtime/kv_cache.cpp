// PagedKvCache (see kv_cache.hpp).
#include "exl3/runtime/kv_cache.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "exl3/error.hpp"

namespace exl3::runtime {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr uint64_t kRootHash = 0x6A09E667F3BCC908ull;

// The hash of a page of `tokens` after a prefix whose last page hashed to `parent`.
uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent);
  for (const int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

}  // namespace

PagedKvCache::PagedKvCache(std::vector<KvLayerShape> layers, int64_t page_size, int64_t num_pages,
                           bool host_storage, KvFormat format)
    : layers_(std::move(layers)),
      page_size_(page_size),
      num_pages_(num_pages),
      host_storage_(host_storage),
      format_(format) {
  if (page_size <= 0) fail("KV cache: page size {} must be positive", page_size);
  if (num_pages <= 0 || num_pages > INT32_MAX)
    fail("KV cache: page count {} must be in 1..2^31-1", num_pages);
  const bool quantized = cpu::kv_quantized(format_);
  k_.resize(layers_.size());
  v_.resize(layers_.size());
  kq_.resize(layers_.size());
  vq_.resize(layers_.size());
  ks_.resize(layers_.size());
  vs_.resize(layers_.size());
  const auto slots = static_cast<size_t>(num_pages * page_size);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const auto& s = layers_[l];
    if (s.k_width < 0 || s.v_width < 0) fail("KV cache: layer {} has a negative width", l);
    if (quantized && (s.k_width % cpu::kKvGroup != 0 || s.v_width % cpu::kKvGroup != 0)) {
      fail(
          "KV cache: layer {} holds {} / {} channels per token; the {} format quantizes groups of "
          "{}",
          l, s.k_width, s.v_width, cpu::kv_format_name(format_), cpu::kKvGroup);
    }
    if (!host_storage_) continue;
    if (quantized) {
      kq_[l].assign(slots * static_cast<size_t>(cpu::kv_code_bytes(format_, s.k_width)), 0);
      vq_[l].assign(slots * static_cast<size_t>(cpu::kv_code_bytes(format_, s.v_width)), 0);
      ks_[l].assign(slots * static_cast<size_t>(s.k_width / cpu::kKvGroup), 0);
      vs_[l].assign(slots * static_cast<size_t>(s.v_width / cpu::kKvGroup), 0);
      continue;
    }
    k_[l].assign(slots * static_cast<size_t>(s.k_width), 0.0f);
    v_[l].assign(slots * static_cast<size_t>(s.v_width), 0.0f);
  }
  free_.reserve(static_cast<size_t>(num_pages));
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
  refs_.assign(static_cast<size_t>(num_pages), 0);
}

void PagedKvCache::enable_prefix_cache() {
  prefix_cache_ = true;
  published_.resize(static_cast<size_t>(num_pages_));
  idle_pos_.resize(static_cast<size_t>(num_pages_));
}

int32_t PagedKvCache::take_page() {
  int32_t p = 0;
  if (!free_.empty()) {
    p = free_.back();
    free_.pop_back();
  } else {
    p = idle_.front();  // the least recently released cached page
    idle_.pop_front();
    unpublish(p);
  }
  refs_[static_cast<size_t>(p)] = 1;
  return p;
}

void PagedKvCache::release_page(int32_t page) {
  const auto p = static_cast<size_t>(page);
  if (--refs_[p] > 0) return;
  if (prefix_cache_ && published_[p].live) {
    idle_pos_[p] = idle_.insert(idle_.end(), page);
  } else {
    free_.push_back(page);
  }
}

void PagedKvCache::unpublish(int32_t page) {
  auto& pub = published_[static_cast<size_t>(page)];
  if (!pub.live) return;
  by_hash_.erase(pub.hash);
  pub = Published{};
}

int64_t PagedKvCache::adopt_prefix(SeqId seq, std::span<const int32_t> prompt,
                                   const std::function<bool(uint64_t)>& usable_end) {
  Seq& s = seq_at(seq);
  if (!prefix_cache_ || prompt.empty()) return 0;
  if (s.length != 0 || !s.pages.empty())
    fail("KV cache: sequence {} already holds tokens; a prefix is adopted by a new one", seq);
  const auto page = static_cast<size_t>(page_size_);
  const size_t full = (prompt.size() - 1) / page;  // at least one prompt token stays to compute
  // The published run of the prompt's pages, then the deepest of them the caller can end at.
  std::vector<std::pair<int32_t, uint64_t>> run;  // page, chain hash
  uint64_t parent = kRootHash;
  for (size_t i = 0; i < full; ++i) {
    const auto tokens = prompt.subspan(i * page, page);
    const uint64_t h = chain_hash(parent, tokens);
    const auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const int32_t p = it->second;
    const auto& pub = published_[static_cast<size_t>(p)];
    if (pub.parent != parent || !std::ranges::equal(pub.tokens, tokens)) break;
    run.emplace_back(p, h);
    parent = h;
  }
  if (usable_end) {
    while (!run.empty() && !usable_end(run.back().second)) run.pop_back();
  }
  for (const auto& [p, h] : run) {
    if (refs_[static_cast<size_t>(p)]++ == 0) idle_.erase(idle_pos_[static_cast<size_t>(p)]);
    s.pages.push_back(p);
    s.hashes.push_back(h);
  }
  s.length = static_cast<int64_t>(s.pages.size()) * page_size_;
  s.tokens.assign(prompt.begin(), prompt.begin() + s.length);
  hit_tokens_ += s.length;
  if (s.length > 0) s.generation = ++generations_;
  return s.length;
}

std::optional<uint64_t> PagedKvCache::page_hash(SeqId seq, int64_t page) const {
  const Seq& s = seq_at(seq);
  if (page < 0 || static_cast<size_t>(page) >= s.hashes.size()) return std::nullopt;
  return s.hashes[static_cast<size_t>(page)];
}

PagedKvCache::SeqId PagedKvCache::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!seqs_[i].live) {
      seqs_[i] = Seq{};
      seqs_[i].live = true;
      seqs_[i].generation = ++generations_;
      return static_cast<SeqId>(i);
    }
  }
  seqs_.push_back(Seq{});
  seqs_.back().live = true;
  seqs_.back().generation = ++generations_;
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
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) release_page(*it);
  s.pages.clear();
  s.tokens.clear();
  s.hashes.clear();
  s.length = 0;
  s.generation = ++generations_;
}

void PagedKvCache::truncate(SeqId seq, int64_t length) {
  Seq& s = seq_at(seq);
  if (length < 0 || length > s.length) {
    fail("KV cache: sequence {} cannot be cut to {} tokens (it holds {})", seq, length, s.length);
  }
  const auto keep = static_cast<size_t>((length + page_size_ - 1) / page_size_);
  // A page left partial will be written again: it stops being a cached prefix page, which it
  // may only while no other sequence reads it.
  const bool partial = length % page_size_ != 0 && keep <= s.pages.size();
  const int32_t last = partial ? s.pages[keep - 1] : -1;
  if (partial && prefix_cache_ && published_[static_cast<size_t>(last)].live) {
    if (refs_[static_cast<size_t>(last)] > 1) {
      fail(
          "KV cache: sequence {} cannot be cut to {} tokens: that cuts a prefix-cache page another "
          "sequence shares",
          seq, length);
    }
    unpublish(last);
  }
  while (s.pages.size() > keep) {
    release_page(s.pages.back());
    s.pages.pop_back();
  }
  s.length = length;
  s.generation = ++generations_;
  if (prefix_cache_) {
    s.tokens.resize(static_cast<size_t>(length));
    s.hashes.resize(std::min(s.hashes.size(), static_cast<size_t>(length / page_size_)));
  }
}

void PagedKvCache::remove_sequence(SeqId seq) {
  clear(seq);
  seqs_[static_cast<size_t>(seq)].live = false;
}

int64_t PagedKvCache::length(SeqId seq) const {
  return seq_at(seq).length;
}

uint64_t PagedKvCache::generation(SeqId seq) const {
  return seq_at(seq).generation;
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
  for (int64_t i = 0; i < more; ++i) s.pages.push_back(take_page());
}

void PagedKvCache::commit(SeqId seq, int64_t n) {
  Seq& s = seq_at(seq);
  if (n < 0 || s.length + n > static_cast<int64_t>(s.pages.size()) * page_size_) {
    fail("KV cache: sequence {} cannot advance by {} (length {}, {} tokens reserved)", seq, n,
         s.length, static_cast<int64_t>(s.pages.size()) * page_size_);
  }
  s.length += n;
}

void PagedKvCache::advance(SeqId seq, int64_t n) {
  if (prefix_cache_) fail("KV cache: with prefix caching, advance takes the committed tokens");
  commit(seq, n);
}

void PagedKvCache::advance(SeqId seq, std::span<const int32_t> tokens) {
  commit(seq, static_cast<int64_t>(tokens.size()));
  if (!prefix_cache_) return;
  Seq& s = seq_at(seq);
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  // Publish each page these tokens filled (unless an identical one is published already).
  const auto page = static_cast<size_t>(page_size_);
  for (size_t i = s.hashes.size(); (i + 1) * page <= s.tokens.size(); ++i) {
    const uint64_t parent = i == 0 ? kRootHash : s.hashes[i - 1];
    const auto span = std::span<const int32_t>(s.tokens).subspan(i * page, page);
    const uint64_t h = chain_hash(parent, span);
    s.hashes.push_back(h);
    const int32_t p = s.pages[i];
    auto& pub = published_[static_cast<size_t>(p)];
    if (pub.live || by_hash_.contains(h)) continue;
    pub.live = true;
    pub.hash = h;
    pub.parent = parent;
    pub.tokens.assign(span.begin(), span.end());
    by_hash_.emplace(h, p);
  }
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

const float* PagedKvCache::native_slot(const std::vector<std::vector<float>>& plane, int layer,
                                       SeqId seq, int64_t pos, int64_t width) const {
  if (format_ != KvFormat::kNative)
    fail("KV cache: a {} cache has no float slots; read it with load()",
         cpu::kv_format_name(format_));
  return plane.at(static_cast<size_t>(layer)).data() + slot(seq_at(seq), pos) * width;
}

float* PagedKvCache::key(int layer, SeqId seq, int64_t pos) {
  return const_cast<float*>(std::as_const(*this).key(layer, seq, pos));
}
float* PagedKvCache::value(int layer, SeqId seq, int64_t pos) {
  return const_cast<float*>(std::as_const(*this).value(layer, seq, pos));
}
const float* PagedKvCache::key(int layer, SeqId seq, int64_t pos) const {
  return native_slot(k_, layer, seq, pos, layers_.at(static_cast<size_t>(layer)).k_width);
}
const float* PagedKvCache::value(int layer, SeqId seq, int64_t pos) const {
  return native_slot(v_, layer, seq, pos, layers_.at(static_cast<size_t>(layer)).v_width);
}

void PagedKvCache::store(int layer, SeqId seq, int64_t pos, const float* k, const float* v) {
  const auto l = static_cast<size_t>(layer);
  const KvLayerShape& s = layers_.at(l);
  if (!cpu::kv_quantized(format_)) {
    std::copy_n(k, s.k_width, key(layer, seq, pos));
    std::copy_n(v, s.v_width, value(layer, seq, pos));
    return;
  }
  const auto at = static_cast<size_t>(slot(seq_at(seq), pos));
  const auto put = [&](const float* x, int64_t width, std::vector<uint8_t>& codes,
                       std::vector<uint16_t>& scales) {
    const int64_t groups = width / cpu::kKvGroup;
    const int64_t group_bytes = cpu::kv_code_bytes(format_, cpu::kKvGroup);
    uint8_t* c = codes.data() + at * static_cast<size_t>(groups * group_bytes);
    uint16_t* sc = scales.data() + at * static_cast<size_t>(groups);
    for (int64_t g = 0; g < groups; ++g)
      sc[g] = cpu::kv_encode_group(format_, x + g * cpu::kKvGroup, c + g * group_bytes);
  };
  put(k, s.k_width, kq_[l], ks_[l]);
  put(v, s.v_width, vq_[l], vs_[l]);
}

void PagedKvCache::load(int layer, SeqId seq, int64_t begin, int64_t end, float* k,
                        float* v) const {
  const auto l = static_cast<size_t>(layer);
  const KvLayerShape& s = layers_.at(l);
  const Seq& sq = seq_at(seq);
  for (int64_t pos = begin; pos < end; ++pos) {
    float* kd = k + (pos - begin) * s.k_width;
    float* vd = v + (pos - begin) * s.v_width;
    if (!cpu::kv_quantized(format_)) {
      std::copy_n(key(layer, seq, pos), s.k_width, kd);
      std::copy_n(value(layer, seq, pos), s.v_width, vd);
      continue;
    }
    const auto at = static_cast<size_t>(slot(sq, pos));
    const auto get = [&](float* x, int64_t width, const std::vector<uint8_t>& codes,
                         const std::vector<uint16_t>& scales) {
      const int64_t groups = width / cpu::kKvGroup;
      const int64_t group_bytes = cpu::kv_code_bytes(format_, cpu::kKvGroup);
      const uint8_t* c = codes.data() + at * static_cast<size_t>(groups * group_bytes);
      const uint16_t* sc = scales.data() + at * static_cast<size_t>(groups);
      for (int64_t g = 0; g < groups; ++g)
        cpu::kv_decode_group(format_, c + g * group_bytes, sc[g], x + g * cpu::kKvGroup);
    };
    get(kd, s.k_width, kq_[l], ks_[l]);
    get(vd, s.v_width, vq_[l], vs_[l]);
  }
}

std::span<const int32_t> PagedKvCache::page_table(SeqId seq) const {
  return seq_at(seq).pages;
}

uint64_t PagedKvCache::bytes() const {
  uint64_t n = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    n += (k_[l].size() + v_[l].size()) * sizeof(float) + kq_[l].size() + vq_[l].size() +
         (ks_[l].size() + vs_[l].size()) * sizeof(uint16_t);
  }
  return n;
}

uint64_t PagedKvCache::bytes_per_token() const {
  uint64_t n = 0;
  for (const KvLayerShape& s : layers_) {
    const int64_t w = s.k_width + s.v_width;
    n += static_cast<uint64_t>(cpu::kv_quantized(format_)
                                   ? cpu::kv_code_bytes(format_, w) + w / cpu::kKvGroup * 2
                                   : w * static_cast<int64_t>(sizeof(float)));
  }
  return n;
}

}  // namespace exl3::runtime
