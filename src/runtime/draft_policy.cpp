// How many tokens a sequence drafts next round (see draft_policy.hpp).
#include "exl3/runtime/draft_policy.hpp"

#include <algorithm>
#include <iterator>
#include <vector>

namespace exl3::runtime {
namespace {

// Weight of a round against the one before it in a sequence's acceptance counts: about the
// last five rounds speak, so a draft that stops agreeing is dropped within a few rounds.
constexpr double kDecay = 0.8;
// Timings kept per kind of pass (their median is used: one slow pass moves nothing).
constexpr size_t kRecent = 5;

}  // namespace

DraftPolicy::DraftPolicy(int max_draft_tokens) : max_k_(max_draft_tokens) {}

void DraftPolicy::record(Acceptance& a, int drafted, int kept) {
  ++a.rounds;
  if (drafted == 0) {
    ++a.plain_since;
    return;
  }
  if (a.plain_since >= kProbeEvery) a.failed_probes = kept > 0 ? 0 : a.failed_probes + 1;
  if (kept > 0) a.failed_probes = 0;
  a.plain_since = 0;
  a.kept = kDecay * a.kept + kept;
  a.rejected = kDecay * a.rejected + (kept < drafted ? 1.0 : 0.0);
}

double DraftPolicy::rate(const Acceptance& a) {
  // Each draft is a trial until the first rejection: kept / trials, with one of each as prior.
  return (a.kept + 1.0) / (a.kept + a.rejected + 2.0);
}

void DraftPolicy::Timing::add(double seconds) {
  recent.push_back(seconds);
  if (recent.size() > kRecent) recent.erase(recent.begin());
}

double DraftPolicy::Timing::seconds() const {
  if (recent.empty()) return 0.0;
  if (recent.size() < 3) return std::ranges::min(recent);
  std::vector<double> v = recent;
  std::ranges::nth_element(v, v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2));
  return v[v.size() / 2];
}

void DraftPolicy::record_draft_step(int64_t seqs, double seconds) {
  costs_[seqs].draft_step.add(seconds);
}

void DraftPolicy::record_verify(int64_t seqs, int k, double seconds) {
  if (k < 0 || k > max_k_) return;
  Costs& c = costs_[seqs];
  c.verify.resize(static_cast<size_t>(max_k_) + 1);
  c.verify[static_cast<size_t>(k)].add(seconds);
}

double DraftPolicy::verify_seconds(const Costs& c, int k) {
  std::vector<int> known;  // the measured draft counts, ascending
  for (int j = 0; j < static_cast<int>(c.verify.size()); ++j)
    if (c.verify[static_cast<size_t>(j)].seconds() > 0.0) known.push_back(j);
  const auto at = [&](int j) { return c.verify[static_cast<size_t>(j)].seconds(); };
  if (known.empty()) return 0.0;
  if (std::ranges::binary_search(known, k)) return at(k);
  if (known.size() == 1) return at(known[0]);
  // A line through the nearest measured counts on both sides of k, or the two nearest on one.
  auto above = std::ranges::upper_bound(known, k);
  if (above == known.begin()) ++above;
  if (above == known.end()) --above;
  const int hi = *above, lo = *std::prev(above);
  // A longer run never costs less than a shorter one (noise can tilt the line the wrong way).
  const double slope = std::max(0.0, (at(hi) - at(lo)) / (hi - lo));
  return std::max(at(lo) + slope * (k - lo), 0.0);
}

double DraftPolicy::tokens_per_second(int k, double rate, int64_t seqs) const {
  const auto it = costs_.find(seqs);
  if (it == costs_.end()) return 0.0;
  const Costs& c = it->second;
  const double verify = verify_seconds(c, k);
  const double draft = k > 0 ? c.draft_step.seconds() : 0.0;
  if (verify <= 0.0 || (k > 0 && draft <= 0.0)) return 0.0;
  double tokens = 0.0, p = 1.0;  // 1 + rate + ... + rate^k
  for (int i = 0; i <= k; ++i, p *= rate) tokens += p;
  return tokens / (k * draft + verify);
}

int DraftPolicy::choose(const Acceptance& a, int64_t seqs) const {
  const auto it = costs_.find(seqs);
  if (it == costs_.end() || it->second.verify.empty() || it->second.verify[0].seconds() <= 0.0)
    return 0;
  const Costs& c = it->second;
  const bool draft_known =
      c.draft_step.seconds() > 0.0 && c.verify.size() > 1 && c.verify[1].seconds() > 0.0;
  if (!draft_known) return std::min(1, max_k_);
  const double r = rate(a);
  int best = 0;
  double best_rate = tokens_per_second(0, r, seqs);
  for (int k = 1; k <= max_k_; ++k) {
    const double t = tokens_per_second(k, r, seqs);
    if (t > best_rate) {
      best = k;
      best_rate = t;
    }
  }
  if (best > 0) return best;
  // Probe only a draft that could pay if it agreed: when even rounds that keep every draft emit
  // fewer tokens per second than plain steps (a draft about as costly as the model), a probe
  // can only cost time.
  bool could_pay = false;
  for (int k = 1; k <= max_k_ && !could_pay; ++k)
    could_pay = tokens_per_second(k, 1.0, seqs) > tokens_per_second(0, 1.0, seqs);
  if (could_pay && a.plain_since >= kProbeEvery << std::min(a.failed_probes, kMaxBackoff)) return 1;
  return 0;
}

}  // namespace exl3::runtime
