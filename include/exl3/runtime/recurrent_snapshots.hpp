// Prefix caching for models with recurrent layers (gated DeltaNet).
//
// A cached KV page holds its tokens' keys and values, but a recurrent layer's state after those
// tokens lives beside the cache and changes with every token. So the engine also keeps copies of
// that state ("snapshots"), each taken where a prefill run ends on a page boundary and filed
// under the chain hash of the page that ends there (PagedKvCache::page_hash). A new sequence
// adopts cached pages only up to the deepest one with a snapshot, and starts its state from that
// copy: the pages after it are computed again.
//
// A snapshot is as large as a sequence's whole recurrent state (every DeltaNet layer's S and
// convolution window), so a prefill run takes at most one: run_before_snapshot() cuts a run at
// the last page boundary it crosses, which is where a prompt's leading full pages end (and where
// each chunk of a page-aligned chunked prefill ends). Decode steps take none.
//
// This class is the bookkeeping only: which slot holds the state after which page, at most
// `capacity` of them, the least recently used replaced first. Engines copy the states.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <utility>

namespace exl3::runtime {

class RecurrentSnapshots {
 public:
  // capacity >= 1 slots, numbered 0 .. capacity - 1.
  explicit RecurrentSnapshots(int64_t capacity);

  int64_t capacity() const { return capacity_; }
  int64_t size() const { return static_cast<int64_t>(by_hash_.size()); }
  bool contains(uint64_t page_hash) const { return by_hash_.contains(page_hash); }
  // The slot holding the state after the page `page_hash` (made the most recently used), or
  // nullopt.
  std::optional<int64_t> find(uint64_t page_hash);
  // The slot to copy the state after page `page_hash` into: its own when it has one, else an
  // unused slot, else the least recently used one (whose page loses its snapshot).
  int64_t slot_for(uint64_t page_hash);

  // Of a prefill run of n > 1 tokens from position `start`: how many to run before a snapshot,
  // which is up to the last page boundary strictly inside the run, or all n when none is (the
  // run then ends on a boundary, or crosses none). Decode runs (n == 1) are never cut.
  static int64_t run_before_snapshot(int64_t start, int64_t n, int64_t page_size);
  // Whether a run ending at `end` that was (part of) a prefill run ends where a snapshot goes.
  static bool snapshot_after(int64_t end, bool prefill, int64_t page_size) {
    return prefill && end > 0 && end % page_size == 0;
  }

 private:
  int64_t capacity_;
  // Used slots, least recently used first: (slot, page hash).
  std::list<std::pair<int64_t, uint64_t>> lru_;
  std::unordered_map<uint64_t, std::list<std::pair<int64_t, uint64_t>>::iterator> by_hash_;
};

}  // namespace exl3::runtime
