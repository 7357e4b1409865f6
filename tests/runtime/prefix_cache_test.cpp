// Prefix caching in the paged KV cache and the CPU engine: full pages are published under their
// chained token hash; a new sequence adopts the published pages its prompt starts with (never its
// last token); shared pages are reference counted, cached pages no sequence holds are reclaimed
// least recently released first; a cut inside a published page unpublishes it (or is refused
// while another sequence shares it). On the CPU engine a prompt that adopts a cached prefix gives
// the same logits, bit for bit, as computing that prefix again.
#include <numeric>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/kv_cache.hpp"
#include "exl3/runtime/recurrent_snapshots.hpp"
#include "runtime_test_util.hpp"
#include "test_support.hpp"

namespace exl3::runtime {
namespace {

std::vector<int32_t> iota_tokens(int n, int first = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A cache of 8 pages of 4 tokens with prefix caching; `seq` gets `tokens` committed.
void fill(PagedKvCache& c, PagedKvCache::SeqId seq, std::span<const int32_t> tokens) {
  c.reserve(seq, static_cast<int64_t>(tokens.size()));
  c.advance(seq, tokens);
}

TEST(PrefixCache, FullPagesArePublishedAndAdopted) {
  PagedKvCache c({{2, 2}}, 4, 8);
  c.enable_prefix_cache();
  const auto a = c.add_sequence();
  const auto prompt = iota_tokens(10);  // pages [100..103], [104..107], and 2 tokens
  fill(c, a, prompt);
  EXPECT_EQ(c.cached_pages(), 2);
  EXPECT_EQ(c.free_pages(), 5);
  // The same prompt again: both full pages, the last two tokens still to compute.
  const auto b = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(b, prompt), 8);
  EXPECT_EQ(c.length(b), 8);
  EXPECT_EQ(c.page_table(b)[0], c.page_table(a)[0]);
  EXPECT_EQ(c.page_table(b)[1], c.page_table(a)[1]);
  EXPECT_EQ(c.free_pages(), 5);  // nothing taken
  // A prompt of exactly two pages adopts one: its last token must be computed.
  const auto d = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(d, iota_tokens(8)), 4);
  // Another second page, or another first page: what matches, and nothing after a miss.
  auto other = iota_tokens(10);
  other[5] = 7;
  const auto e = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(e, other), 4);
  other[1] = 7;
  const auto f = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(f, other), 0);
  EXPECT_EQ(c.prefix_hit_tokens(), 8 + 4 + 4);
  // Only an empty sequence adopts.
  EXPECT_THROW(c.adopt_prefix(b, prompt), Error);
}

TEST(PrefixCache, ReleasedPagesStayCachedUntilThePoolNeedsThem) {
  PagedKvCache c({{2, 2}}, 4, 4);
  c.enable_prefix_cache();
  const auto a = c.add_sequence();
  fill(c, a, iota_tokens(8, 100));  // two published pages
  const auto b = c.add_sequence();
  fill(c, b, iota_tokens(4, 200));  // one more
  c.remove_sequence(a);             // released first
  c.remove_sequence(b);
  EXPECT_EQ(c.free_pages(), 4);  // one free, three cached and reclaimable
  EXPECT_EQ(c.cached_pages(), 3);
  // Two pages for a new sequence: the free one, then the least recently released cached one.
  // A sequence releases its pages last to first, so a's second page goes before its first: a
  // prefix outlives its continuations.
  const auto n = c.add_sequence();
  c.reserve(n, 8);
  EXPECT_EQ(c.cached_pages(), 2);
  const auto x = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(x, iota_tokens(9, 100)), 4);  // a's first page, not its second
  const auto y = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(y, iota_tokens(5, 200)), 4);  // b's page
  EXPECT_EQ(c.free_pages(), 0);
  c.remove_sequence(y);
  EXPECT_EQ(c.free_pages(), 1);
}

TEST(PrefixCache, CutsInsidePublishedPages) {
  PagedKvCache c({{2, 2}}, 4, 8);
  c.enable_prefix_cache();
  const auto a = c.add_sequence();
  fill(c, a, iota_tokens(8));
  // Alone on the page: the cut unpublishes it (it will be written again).
  c.truncate(a, 6);
  EXPECT_EQ(c.cached_pages(), 1);
  const auto b = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(b, iota_tokens(9)), 4);
  // Shared: refused, and nothing changes.
  fill(c, a, iota_tokens(2, 106));  // the same tokens again: page 1 full, published again
  EXPECT_EQ(c.cached_pages(), 2);
  const auto d = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(d, iota_tokens(9)), 8);
  EXPECT_THAT(test::error_of([&] { c.truncate(a, 5); }), testing::HasSubstr("shares"));
  EXPECT_EQ(c.length(a), 8);
  // A cut at a page boundary keeps whole pages: allowed.
  c.truncate(a, 4);
  EXPECT_EQ(c.length(a), 4);
  // With prefix caching, committing needs the tokens.
  EXPECT_THROW(c.advance(a, 1), Error);
}

TEST(PrefixCache, OffByDefault) {
  PagedKvCache c({{2, 2}}, 4, 8);
  const auto a = c.add_sequence();
  fill(c, a, iota_tokens(8));
  EXPECT_EQ(c.cached_pages(), 0);
  const auto b = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(b, iota_tokens(9)), 0);
  c.remove_sequence(a);
  EXPECT_EQ(c.free_pages(), 8);
}

// An engine that keeps state beside the cache adopts only as far as it has that state: the run
// ends at the deepest matching page whose hash the caller accepts, and page_hash names each.
TEST(PrefixCache, AdoptionEndsWhereTheCallerHasState) {
  PagedKvCache c({{2, 2}}, 4, 8);
  c.enable_prefix_cache();
  const auto a = c.add_sequence();
  fill(c, a, iota_tokens(13));  // three full pages
  std::vector<uint64_t> hashes;
  for (int64_t p = 0; p < 3; ++p) hashes.push_back(c.page_hash(a, p).value());
  EXPECT_FALSE(c.page_hash(a, 3).has_value());  // one token: not full
  EXPECT_NE(hashes[0], hashes[1]);
  // State after page 1 only: two pages, though three match.
  const auto b = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(b, iota_tokens(14), [&](uint64_t h) { return h == hashes[1]; }), 8);
  EXPECT_EQ(c.page_hash(b, 1), hashes[1]);
  EXPECT_EQ(c.page_table(b)[1], c.page_table(a)[1]);
  // None usable: nothing adopted, nothing taken.
  const int64_t free = c.free_pages();
  const auto d = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(d, iota_tokens(14), [](uint64_t) { return false; }), 0);
  EXPECT_EQ(c.free_pages(), free);
  EXPECT_EQ(c.length(d), 0);
  // A usable hash past the matching run is not reached.
  auto other = iota_tokens(14);
  other[6] = 1;
  const auto e = c.add_sequence();
  EXPECT_EQ(c.adopt_prefix(e, other, [&](uint64_t h) { return h != hashes[0]; }), 0);
}

// Where snapshots go: a prefill run is cut at the last page boundary strictly inside it; decode
// steps and runs that end on a boundary are not cut. Slots are reused for their own page and
// handed over least recently used first.
TEST(RecurrentSnapshots, CutsAndReplacesLeastRecentlyUsed) {
  EXPECT_EQ(RecurrentSnapshots::run_before_snapshot(0, 37, 8), 32);
  EXPECT_EQ(RecurrentSnapshots::run_before_snapshot(0, 32, 8), 32);  // ends on one
  EXPECT_EQ(RecurrentSnapshots::run_before_snapshot(30, 5, 8), 2);   // crosses 32
  EXPECT_EQ(RecurrentSnapshots::run_before_snapshot(33, 5, 8), 5);   // crosses none
  EXPECT_EQ(RecurrentSnapshots::run_before_snapshot(31, 1, 8), 1);   // decode
  EXPECT_EQ(RecurrentSnapshots::run_before_snapshot(8, 17, 8), 16);  // 16 tokens to 24
  EXPECT_TRUE(RecurrentSnapshots::snapshot_after(32, true, 8));
  EXPECT_FALSE(RecurrentSnapshots::snapshot_after(32, false, 8));
  EXPECT_FALSE(RecurrentSnapshots::snapshot_after(33, true, 8));
  EXPECT_FALSE(RecurrentSnapshots::snapshot_after(0, true, 8));

  RecurrentSnapshots s(2);
  EXPECT_FALSE(s.find(10).has_value());
  const int64_t a = s.slot_for(10), b = s.slot_for(20);
  EXPECT_NE(a, b);
  EXPECT_EQ(s.slot_for(10), a);  // its own slot again, and now the most recent
  EXPECT_EQ(s.slot_for(30), b);  // 20 was the least recently used
  EXPECT_FALSE(s.contains(20));
  EXPECT_EQ(s.find(10), a);
  EXPECT_EQ(s.find(30), b);
  EXPECT_EQ(s.size(), 2);
  EXPECT_THROW(RecurrentSnapshots(0), Error);
}

// The CPU engine: a second prompt sharing a 3-page prefix adopts it and gives the logits of an
// engine without caching that runs the same two chunks, bit for bit; its pages come back.
TEST(PrefixCache, CpuEngineReusesKvExactly) {
  exl3::test::TempDir dir;
  test::write_model(dir.path(), HfArch::kQwen3, exl3::test::test_seed());
  EngineOptions eo;
  eo.page_size = 4;
  eo.cache_tokens = 256;
  eo.prefix_cache = true;
  auto cached = load_engine(dir.path(), eo);
  eo.prefix_cache = false;
  auto plain = load_engine(dir.path(), eo);
  auto rng = exl3::test::make_rng();
  std::vector<int32_t> system(13), a(5), b(7);
  for (auto* v : {&system, &a, &b})
    for (auto& t : *v) t = static_cast<int32_t>(rng() % 500);
  auto first = system, second = system;
  first.insert(first.end(), a.begin(), a.end());
  second.insert(second.end(), b.begin(), b.end());
  const int64_t full = cached->free_cache_tokens();
  const auto s1 = cached->new_sequence();
  (void)cached->forward(s1, first, LogitsMode::kLast);
  cached->drop_sequence(s1);
  const auto s2 = cached->new_sequence();
  const int64_t reused = cached->adopt_prefix(s2, second);
  EXPECT_EQ(reused, 12);  // three whole pages of the 13-token system prompt
  const auto got = cached->forward(s2, std::span(second).subspan(12), LogitsMode::kAll);
  const auto p = plain->new_sequence();
  (void)plain->forward(p, std::span(second).first(12), LogitsMode::kLast);
  const auto want = plain->forward(p, std::span(second).subspan(12), LogitsMode::kAll);
  EXPECT_EQ(got, want);
  cached->drop_sequence(s2);
  EXPECT_EQ(cached->free_cache_tokens(), full);  // cached pages count as free
  EXPECT_EQ(plain->adopt_prefix(plain->new_sequence(), second), 0);
}

}  // namespace
}  // namespace exl3::runtime
