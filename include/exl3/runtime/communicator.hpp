// The collectives a tensor-parallel engine needs, as a small interface: one Communicator per
// rank, every rank calling the same collectives in the same order. The in-process group runs N
// ranks on N threads of one process (the CPU backend and CI); an NCCL group implements the same
// interface over GPUs.
#pragma once

#include <memory>
#include <span>
#include <vector>

namespace exl3::runtime {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank passes the same number of floats; on return each holds the element-wise sum over
  // the ranks, added in rank order 0, 1, ..., size - 1 (so every rank and every run gets the
  // same bits).
  virtual void all_reduce_sum(std::span<float> data) = 0;
  // Every rank sends send.size() floats (the same count on all ranks); recv (size() * that) gets
  // rank 0's block, then rank 1's, ...
  virtual void all_gather(std::span<const float> send, std::span<float> recv) = 0;
  // Called by a rank that failed between collectives: the other ranks' pending and future
  // collectives throw exl3::Error instead of waiting for it forever.
  virtual void abort() noexcept = 0;
};

// `n` communicators over one shared state, one per rank, for n threads of this process (each
// rank's calls from its own thread). Mismatched counts throw exl3::Error on every rank.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int n);

}  // namespace exl3::runtime
