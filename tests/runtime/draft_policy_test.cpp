// DraftPolicy (the adaptive draft count of speculative decoding) on costs and outcomes fed by
// hand: what it times first, its choice at high and low acceptance with cheap and costly drafts,
// the probes of a draft that stopped paying, the interpolated verify costs, and the decayed
// acceptance estimate.
#include <gtest/gtest.h>

#include "exl3/runtime/draft_policy.hpp"

namespace exl3::runtime {
namespace {

// A slow first pass (as when it captures a graph), then three at `s`.
void time_verify(DraftPolicy& p, int64_t seqs, int k, double s) {
  p.record_verify(seqs, k, 99.0);
  for (int i = 0; i < 3; ++i) p.record_verify(seqs, k, s);
}
void time_draft(DraftPolicy& p, int64_t seqs, double s) {
  p.record_draft_step(seqs, 99.0);
  for (int i = 0; i < 3; ++i) p.record_draft_step(seqs, s);
}

DraftPolicy::Acceptance after(int rounds, int drafted, int kept) {
  DraftPolicy::Acceptance a;
  for (int i = 0; i < rounds; ++i) DraftPolicy::record(a, drafted, kept);
  return a;
}

TEST(DraftPolicy, TimesAPlainStepThenOneDraftThenChooses) {
  DraftPolicy p(4);
  const DraftPolicy::Acceptance fresh;
  EXPECT_EQ(p.choose(fresh, 1), 0);
  p.record_verify(1, 0, 0.050);  // one plain step timed (slow: a graph capture, say)
  EXPECT_EQ(p.choose(fresh, 1), 1);
  p.record_verify(1, 0, 0.010);  // the faster of the first two counts
  EXPECT_NEAR(p.tokens_per_second(0, 0.5, 1), 100.0, 1e-9);
  p.record_verify(1, 0, 0.010);
  time_draft(p, 1, 0.001);
  time_verify(p, 1, 1, 0.011);
  // Measured at batch 1 only: a batch of 8 starts over.
  EXPECT_EQ(p.choose(fresh, 8), 0);
  // Verify 10 ms + 1 ms per draft, drafts 1 ms: at acceptance ~0.94 four drafts pay most.
  const auto high = after(10, 4, 4);
  EXPECT_GT(DraftPolicy::rate(high), 0.9);
  EXPECT_EQ(p.choose(high, 1), 4);
  EXPECT_NEAR(p.tokens_per_second(4, 0.5, 1), (1 + 0.5 + 0.25 + 0.125 + 0.0625) / 0.018, 1e-6);
  // A draft that never agrees: plain steps, and a one-token probe after kProbeEvery of them,
  // twice as long a wait after each probe that kept nothing, up to 16 times.
  auto low = after(6, 4, 0);
  EXPECT_LT(DraftPolicy::rate(low), 0.2);
  EXPECT_EQ(p.choose(low, 1), 0);
  const auto plain_until_probe = [&] {
    int steps = 0;
    for (; p.choose(low, 1) == 0 && steps < 10000; ++steps) DraftPolicy::record(low, 0, 0);
    return steps;
  };
  for (const int wait : {32, 64, 128, 256, 512, 512}) {
    EXPECT_EQ(plain_until_probe(), wait);
    DraftPolicy::record(low, 1, 0);  // the probe: rejected
  }
  // A probe that keeps its draft resets the wait (and here makes drafting pay for a while).
  EXPECT_EQ(plain_until_probe(), 512);
  DraftPolicy::record(low, 1, 1);
  EXPECT_EQ(low.failed_probes, 0);
  EXPECT_GE(p.choose(low, 1), 1);
  while (p.choose(low, 1) > 0) DraftPolicy::record(low, 1, 0);
  EXPECT_EQ(plain_until_probe(), 32);
}

TEST(DraftPolicy, ACostlyDraftIsNotWorthIt) {
  DraftPolicy p(3);
  time_verify(p, 1, 0, 0.010);
  time_verify(p, 1, 1, 0.011);
  time_draft(p, 1, 0.010);  // as costly as the target: even all-kept rounds lose
  EXPECT_EQ(p.choose(after(10, 3, 3), 1), 0);
  // So it is not probed either, however long it has been plain.
  auto idle = after(6, 3, 0);
  for (int i = 0; i < 4 * (DraftPolicy::kProbeEvery << DraftPolicy::kMaxBackoff); ++i) {
    ASSERT_EQ(p.choose(idle, 1), 0) << "plain step " << i;
    DraftPolicy::record(idle, 0, 0);
  }
  // A cheap draft: all three at full acceptance, one at half, none when nothing is kept.
  DraftPolicy q(3);
  time_verify(q, 1, 0, 0.010);
  time_verify(q, 1, 1, 0.011);
  time_draft(q, 1, 0.002);
  EXPECT_EQ(q.choose(after(10, 3, 3), 1), 3);
  EXPECT_EQ(q.choose(after(10, 3, 1), 1), 1);
  EXPECT_EQ(q.choose(after(10, 3, 0), 1), 0);
}

TEST(DraftPolicy, VerifyCostsBetweenAndBeyondTheMeasuredOnes) {
  DraftPolicy p(6);
  time_draft(p, 2, 0.001);
  time_verify(p, 2, 0, 0.010);
  time_verify(p, 2, 2, 0.014);
  time_verify(p, 2, 4, 0.030);
  // k = 1: between 0 and 2; k = 3: between 2 and 4; k = 6: past 4 along the 2-4 line.
  EXPECT_NEAR(p.tokens_per_second(1, 0.0, 2), 1.0 / (0.001 + 0.012), 1e-6);
  EXPECT_NEAR(p.tokens_per_second(3, 0.0, 2), 1.0 / (0.003 + 0.022), 1e-6);
  EXPECT_NEAR(p.tokens_per_second(6, 0.0, 2), 1.0 / (0.006 + 0.046), 1e-6);
  // The median of the recent timings: one slow pass changes nothing.
  p.record_verify(2, 0, 1.0);
  EXPECT_NEAR(p.tokens_per_second(0, 0.0, 2), 1.0 / 0.010, 1e-6);
  // Unknown batch size, or a draft count without a draft timing: nothing to say.
  EXPECT_EQ(p.tokens_per_second(1, 0.5, 3), 0.0);
}

TEST(DraftPolicy, AcceptanceForgetsOldRounds) {
  auto a = after(10, 4, 4);
  const double high = DraftPolicy::rate(a);
  for (int i = 0; i < 8; ++i) DraftPolicy::record(a, 4, 0);
  EXPECT_LT(DraftPolicy::rate(a), 0.5);
  EXPECT_LT(DraftPolicy::rate(a), high);
  // Plain steps leave the estimate alone and count toward the next probe.
  const double before = DraftPolicy::rate(a);
  DraftPolicy::record(a, 0, 0);
  EXPECT_EQ(DraftPolicy::rate(a), before);
  EXPECT_EQ(a.plain_since, 1);
  EXPECT_EQ(DraftPolicy::rate({}), 0.5);
}

}  // namespace
}  // namespace exl3::runtime
