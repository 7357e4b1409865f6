// The in-process communicator group (see communicator.hpp): a generation barrier over a mutex and
// a condition variable, with an abort flag so one failing rank cannot leave the others waiting.
#include "exl3/runtime/communicator.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "exl3/error.hpp"

namespace exl3::runtime {
namespace {

struct GroupState {
  explicit GroupState(int n) : size(n), sends(static_cast<size_t>(n)), counts(static_cast<size_t>(n)) {}

  const int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::vector<const float*> sends;  // each rank's buffer for the collective in flight
  std::vector<size_t> counts;

  void barrier() {
    std::unique_lock lock(mu);
    if (aborted) fail("tensor parallel: the rank group was aborted (another rank failed)");
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    if (aborted) fail("tensor parallel: the rank group was aborted (another rank failed)");
  }

  void abort() noexcept {
    {
      std::lock_guard lock(mu);
      aborted = true;
    }
    cv.notify_all();
  }

  // Publishes a rank's buffer and waits for all; then checks the counts agree.
  void publish(int rank, const float* p, size_t n, const char* what) {
    sends[static_cast<size_t>(rank)] = p;
    counts[static_cast<size_t>(rank)] = n;
    barrier();
    for (int r = 0; r < size; ++r) {
      if (counts[static_cast<size_t>(r)] != n) {
        // Every rank sees the mismatch and throws; wait so none is left behind in a barrier.
        fail("tensor parallel {}: rank {} passed {} floats, rank {} passed {}", what, rank, n, r,
             counts[static_cast<size_t>(r)]);
      }
    }
  }
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<GroupState> g, int rank) : g_(std::move(g)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  void all_reduce_sum(std::span<float> data) override {
    g_->publish(rank_, data.data(), data.size(), "all_reduce_sum");
    tmp_.assign(g_->sends[0], g_->sends[0] + data.size());
    for (int r = 1; r < g_->size; ++r) {
      const float* p = g_->sends[static_cast<size_t>(r)];
      for (size_t i = 0; i < data.size(); ++i) tmp_[i] += p[i];
    }
    g_->barrier();  // everyone has read every buffer before anyone overwrites its own
    std::copy(tmp_.begin(), tmp_.end(), data.begin());
  }

  void all_gather(std::span<const float> send, std::span<float> recv) override {
    if (recv.size() != send.size() * static_cast<size_t>(g_->size)) {
      g_->abort();
      fail("tensor parallel all_gather: rank {} receives into {} floats, expected {} x {}", rank_, recv.size(),
           g_->size, send.size());
    }
    g_->publish(rank_, send.data(), send.size(), "all_gather");
    for (int r = 0; r < g_->size; ++r) {
      std::copy_n(g_->sends[static_cast<size_t>(r)], send.size(), recv.begin() + static_cast<ptrdiff_t>(r * send.size()));
    }
    g_->barrier();
  }

  void abort() noexcept override { g_->abort(); }

 private:
  std::shared_ptr<GroupState> g_;
  int rank_;
  std::vector<float> tmp_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int n) {
  if (n < 1) fail("tensor parallel: a rank group needs at least one rank, not {}", n);
  auto state = std::make_shared<GroupState>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<InProcessCommunicator>(state, r));
  return out;
}

}  // namespace exl3::runtime
