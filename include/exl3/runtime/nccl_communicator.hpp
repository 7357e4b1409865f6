// The Communicator over NCCL: one rank per GPU of this host, each driven by its own thread of
// this process (the CUDA tensor-parallel engine's model; NCCL's single-process multi-GPU mode).
//
// Besides the host-span collectives of the Communicator interface (staged through the device;
// all_reduce_sum gathers and adds in rank order on the host, so it keeps the interface's
// fixed-order contract), it offers the stream-ordered device collectives the engine enqueues
// between its kernels (and captures in CUDA graphs). The device all-reduce is NCCL's: every rank
// receives the same bits and a run repeats bit for bit on the same GPUs, but the summation order
// is NCCL's (ring or tree), not rank order.
//
// abort() aborts every communicator of the group (NCCL stops kernels waiting on a peer), and
// wait() polls a stream while watching for that, so a rank that fails between collectives turns
// the others' waits into exl3::Error instead of a hang. After an abort the group is unusable.
// Destroying communicators is collective: the ranks' owners destroy theirs concurrently (one
// thread per rank), after destroying any CUDA graph that captured them.
#pragma once

#if defined(EXL3_HAVE_NCCL)

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/runtime/communicator.hpp"

namespace exl3::runtime {

struct NcclGroupState;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroupState> group, int rank);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override;
  int device() const;  // the CUDA device of this rank

  // Host collectives (the calling thread's current device is switched to device()).
  void all_reduce_sum(std::span<float> data) override;
  void all_gather(std::span<const float> send, std::span<float> recv) override;
  void abort() noexcept override;

  // Device collectives on `stream` (device pointers, asynchronous, graph-capturable). Return
  // the NCCL failure as a message (empty on success) rather than throwing, like the kernels'
  // cudaError_t, so callers add context.
  std::string all_reduce_sum_device(float* data, size_t count, cudaStream_t stream);
  // recv[size() * count] gets rank 0's `count` floats, then rank 1's, ...
  std::string all_gather_device(const float* send, float* recv, size_t count, cudaStream_t stream);
  // Waits for `stream`; throws exl3::Error naming `what` when the group was aborted meanwhile
  // (another rank failed) or the stream failed.
  void wait(cudaStream_t stream, const std::string& what);
  bool aborted() const;

 private:
  void stage(size_t floats);

  std::shared_ptr<NcclGroupState> group_;
  int rank_ = 0;
  cudaStream_t stream_ = nullptr;  // host collectives
  cuda::DeviceBuffer staging_;     // host collectives, grown on demand
};

// One communicator per device of `devices` (distinct CUDA ordinals; rank r runs on devices[r]),
// created together (ncclCommInitAll). Throws exl3::Error when a device is missing or NCCL
// fails, with a hint.
std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_group(const std::vector<int>& devices);

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_NCCL
