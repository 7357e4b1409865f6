// How many tokens a sequence drafts next round. Speculation pays only when the tokens a round
// is expected to keep outweigh its cost: at per-token acceptance a, a round of k drafts emits
// E(k) = 1 + a + ... + a^k tokens and costs k draft steps plus a verify pass over k + 1
// tokens, where a plain step (k = 0) emits one token for one target step. The policy measures
// those costs as rounds run (wall time per batch size, so the figures include launch and host
// work), estimates a per sequence from its recent rounds, and picks the k in 0..K with the most
// tokens per second. A sequence whose draft stops paying takes plain steps, and drafts one token
// after kProbeEvery plain steps so that a draft which starts agreeing again is noticed; each probe
// that keeps nothing doubles the wait (up to 16x), so a useless draft costs almost nothing. A
// draft too costly to pay even when every draft is kept is never probed.
//
// The choice depends on measured times, so with sampling a seed fixes the output distribution
// but not the text (the rejection rule keeps the target's distribution for any k); a fixed k
// (SpeculativeOptions::adaptive = false) gives reproducible text.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace exl3::runtime {

class DraftPolicy {
 public:
  // Plain steps before a one-token probe of a draft that did not pay, doubled per probe that
  // kept nothing, up to kProbeEvery << kMaxBackoff.
  static constexpr int kProbeEvery = 32;
  static constexpr int kMaxBackoff = 4;

  explicit DraftPolicy(int max_draft_tokens);

  // What one sequence's recent rounds say about its draft (decayed counts).
  struct Acceptance {
    double kept = 0.0;      // drafts kept
    double rejected = 0.0;  // rounds that ended on a rejected draft
    int rounds = 0;         // rounds recorded
    int plain_since = 0;    // plain steps since its last round with drafts
    int failed_probes = 0;  // probes in a row that kept nothing
  };
  // A round of `drafted` drafts of which the first `kept` were kept.
  static void record(Acceptance& a, int drafted, int kept);
  // The per-token acceptance estimate (a prior of one kept and one rejected draft).
  static double rate(const Acceptance& a);

  // Wall time of one draft step over `seqs` sequences, and of a verify pass over `seqs`
  // sequences whose longest run drafted `k` tokens (k = 0: a plain target step).
  void record_draft_step(int64_t seqs, double seconds);
  void record_verify(int64_t seqs, int k, double seconds);

  // The draft count for a sequence with acceptance `a` in a round of `seqs` sequences: a plain
  // step until one is timed, then a one-draft round until one is timed, then the best k by the
  // model (or a probe, see above).
  int choose(const Acceptance& a, int64_t seqs) const;

  // Expected tokens per second of k drafts at acceptance `rate` (0 where a cost is unknown).
  double tokens_per_second(int k, double rate, int64_t seqs) const;

 private:
  // Recent wall times of one kind of pass: the fastest of the first two (the first of a shape may
  // include capturing its CUDA graph), then the median of the last few.
  struct Timing {
    std::vector<double> recent;
    void add(double seconds);
    double seconds() const;  // 0: none counted yet
  };
  struct Costs {
    Timing draft_step;
    std::vector<Timing> verify;  // by k
  };
  // The verify time for k drafts: measured, else linear in k through the nearest measured ones
  // (0 where none is).
  static double verify_seconds(const Costs& c, int k);

  int max_k_;
  std::map<int64_t, Costs> costs_;  // by batch size
};

}  // namespace exl3::runtime
