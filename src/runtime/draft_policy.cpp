// How many tokens a sequence drafts next round (see draft_policy.hpp).
#include "exl3/runtime/draft_policy.hpp"

#include <algorithm>
#include <cmath>

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
  const int n = static_cast<int>(c.verify.size());
  if (k < n && c.verify[static_cast<size_t>(k)].seconds() > 0.0)
    return c.verify[static_cast<size_t>(k)].seconds();
  // The nearest measured k below and above (or the two nearest on one side), then a line.
  int lo = -1, hi = -1;
  for (int j = std::min(k, n) - 1; j >= 0 && lo < 0; --j)
    if (c.verify[static_cast<size_t>(j)].seconds() > 0.0) lo = j;
  for (int j = k + 1; j < n && hi < 0; ++j)
    if (c.verify[static_cast<size_t>(j)].seconds() > 0.0) hi = j;
  if (lo < 0 && hi < 0) return 0.0;
  if (lo < 0 || hi < 0) {
    const int a = lo >= 0 ? lo : hi;
    int b = -1;  // a second point on the same side
    if (lo >= 0) {
      for (int j = a - 1; j >= 0 && b < 0; --j)
        if (c.verify[static_cast<size_t>(j)].seconds() > 0.0) b = j;
    } else {
      for (int j = a + 1; j < n && b < 0; ++j)
        if (c.verify[static_cast<size_t>(j)].seconds() > 0.0) b = j;
    }
    if (b < 0) return c.verify[static_cast<size_t>(a)].seconds();
    lo = std::min(a, b);
    hi = std::max(a, b);
  }
  const double tl = c.verify[static_cast<size_t>(lo)].seconds();
  const double th = c.verify[static_cast<size_t>(hi)].seconds();
  // A longer run never costs less than a shorter one (noise can tilt the line the wrong way).
  const double slope = std::max(0.0, (th - tl) / (hi - lo));
  return std::max(tl + slope * (k - lo), 0.0);
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
  if (best == 0 && a.plain_since >= kProbeEvery << std::min(a.failed_probes, kMaxBackoff)) return 1;
  return best;
}

}  // namespace exl3::runtime
