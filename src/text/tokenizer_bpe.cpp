// BPE merges over one pre-tokenized word: the reference algorithm (tokenizers' Word::merge_all),
// a min-heap of candidate merges keyed by (rank, position) over a linked list of symbols, with
// stale heap entries skipped. O(n log n) per word; words are cached.
#include <algorithm>
#include <queue>

#include "tokenizer_internal.hpp"

namespace exl3::tok {

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    std::lock_guard lock(cache_mu_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    std::lock_guard lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    const auto& alpha = ByteAlphabet::get();
    std::string mapped;
    if (byte_fallback) {
      mapped = word;
    } else {
      mapped.reserve(word.size() * 2);
      for (const char c : word) mapped += alpha.utf8[static_cast<unsigned char>(c)];
    }
    if (auto it = vocab.find(mapped); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }

  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  auto push = [&](int32_t id) {
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1, true});
  };
  // Initial symbols: one per byte. A byte without a token becomes unk (fused with a preceding
  // unk when fuse_unk), or is dropped when the model has no unk token, as in the reference.
  bool pending_unk = false;
  auto unknown = [&] {
    if (!unk_id) return;
    if (pending_unk && !fuse_unk) push(*unk_id);
    pending_unk = true;
  };
  if (byte_fallback) {
    // One symbol per character; a character without a token becomes its byte tokens (a pending
    // unk is not flushed before them, as in the reference), or unk.
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::max<size_t>(1, utf8_step(word, i).len);  // encode() checked UTF-8
      const std::string_view ch = word.substr(i, n);
      i += n;
      if (const auto it = vocab.find(ch); it != vocab.end()) {
        if (pending_unk) push(*unk_id), pending_unk = false;
        push(it->second);
        continue;
      }
      bool all = true;
      for (const char c : ch) all = all && fallback_id[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (const char c : ch) push(fallback_id[static_cast<unsigned char>(c)]);
        continue;
      }
      unknown();
    }
  } else {
    for (const char c : word) {
      const int32_t id = byte_id[static_cast<unsigned char>(c)];
      if (id >= 0) {
        if (pending_unk) push(*unk_id), pending_unk = false;
        push(id);
      } else {
        unknown();
      }
    }
  }
  if (pending_unk) push(*unk_id);
  if (syms.empty()) return;
  syms.back().next = -1;

  struct Cand {
    int32_t rank, pos, new_id;
  };
  auto worse = [](const Cand& a, const Cand& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto consider = [&](int32_t pos) {
    const auto& s = syms[static_cast<size_t>(pos)];
    if (s.next < 0) return;
    if (auto it = merges.find(key(s.id, syms[static_cast<size_t>(s.next)].id));
        it != merges.end()) {
      heap.push({it->second.rank, pos, it->second.new_id});
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);

  while (!heap.empty()) {
    const Cand top = heap.top();
    heap.pop();
    auto& s = syms[static_cast<size_t>(top.pos)];
    if (!s.alive || s.next < 0) continue;
    auto& right = syms[static_cast<size_t>(s.next)];
    // Stale entry: the pair at this position changed since it was queued.
    const auto it = merges.find(key(s.id, right.id));
    if (it == merges.end() || it->second.new_id != top.new_id) continue;
    s.id = top.new_id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) syms[static_cast<size_t>(s.next)].prev = top.pos;
    if (s.prev >= 0) consider(s.prev);
    consider(top.pos);
  }
  for (const auto& s : syms) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace exl3::tok
