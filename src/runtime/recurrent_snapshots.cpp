// RecurrentSnapshots (see recurrent_snapshots.hpp).
#include "exl3/runtime/recurrent_snapshots.hpp"

#include "exl3/error.hpp"

namespace exl3::runtime {

RecurrentSnapshots::RecurrentSnapshots(int64_t capacity) : capacity_(capacity) {
  if (capacity < 1)
    fail("prefix cache: {} recurrent-state snapshots; at least 1 is needed", capacity);
}

std::optional<int64_t> RecurrentSnapshots::find(uint64_t page_hash) {
  const auto it = by_hash_.find(page_hash);
  if (it == by_hash_.end()) return std::nullopt;
  lru_.splice(lru_.end(), lru_, it->second);
  return it->second->first;
}

int64_t RecurrentSnapshots::slot_for(uint64_t page_hash) {
  if (const auto slot = find(page_hash)) return *slot;
  int64_t slot = static_cast<int64_t>(lru_.size());
  if (slot == capacity_) {  // full: the least recently used page gives its slot up
    slot = lru_.front().first;
    by_hash_.erase(lru_.front().second);
    lru_.pop_front();
  }
  lru_.emplace_back(slot, page_hash);
  by_hash_.emplace(page_hash, std::prev(lru_.end()));
  return slot;
}

int64_t RecurrentSnapshots::run_before_snapshot(int64_t start, int64_t n, int64_t page_size) {
  if (n <= 1 || (start + n) % page_size == 0) return n;  // a decode step, or ends on a boundary
  const int64_t boundary = (start + n - 1) / page_size * page_size;  // the last one before the end
  return boundary > start ? boundary - start : n;
}

}  // namespace exl3::runtime
