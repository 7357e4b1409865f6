// NcclCommunicator (see nccl_communicator.hpp).
#include "exl3/runtime/nccl_communicator.hpp"

#if defined(EXL3_HAVE_NCCL)

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <nccl.h>

#include "exl3/error.hpp"
#include "nccl_check.hpp"

namespace exl3::runtime {

struct NcclGroupState {
  std::vector<ncclComm_t> comms;
  std::vector<int> devices;
  std::mutex mu;
  std::atomic<bool> aborted{false};

  // Aborts every rank's communicator once. NCCL's abort sets the flag its kernels poll, so a
  // kernel waiting on a rank that will never arrive returns. Each abort runs on its own detached
  // thread, all at once: within a node the ranks' aborts synchronise with each other, and an
  // abort also waits for CUDA graphs that captured the communicator to be destroyed, which their
  // owners only do later; the caller must not block on either.
  void abort_all() noexcept {
    std::vector<ncclComm_t> live;
    {
      std::lock_guard lock(mu);
      if (aborted.exchange(true)) return;
      for (auto& c : comms) {
        if (c != nullptr) live.push_back(c);
        c = nullptr;
      }
    }
    for (ncclComm_t c : live) {
      try {
        std::thread([c] { ncclCommAbort(c); }).detach();
      } catch (...) {
        // No thread to spare: the communicator is left to process exit.
      }
    }
  }
};

namespace {

std::string nccl_message(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return {};
  return fmt::format("{}: {}", what, cuda::detail::describe(r));
}

}  // namespace

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclGroupState> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device());
  staging_.reset();  // on the rank's device, before its stream and communicator go
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  ncclComm_t c = nullptr;
  {
    std::lock_guard lock(group_->mu);
    std::swap(c, group_->comms[static_cast<size_t>(rank_)]);
  }
  // Outside the lock: the ranks' threads destroy their communicators at the same time.
  if (c != nullptr) ncclCommDestroy(c);
}

int NcclCommunicator::size() const {
  return static_cast<int>(group_->devices.size());
}
int NcclCommunicator::device() const {
  return group_->devices[static_cast<size_t>(rank_)];
}
bool NcclCommunicator::aborted() const {
  return group_->aborted.load();
}

void NcclCommunicator::abort() noexcept {
  group_->abort_all();
}

void NcclCommunicator::stage(size_t floats) {
  EXL3_CUDA_CHECK(cudaSetDevice(device()), "selecting the rank's device");
  if (stream_ == nullptr)
    EXL3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                    "creating a stream");
  if (floats <= staging_.count<float>()) return;
  staging_.reset();  // free the old buffer before allocating the larger one
  staging_ = cuda::DeviceBuffer::of<float>(floats, "the NCCL staging buffer");
}

std::string NcclCommunicator::all_reduce_sum_device(float* data, size_t count,
                                                    cudaStream_t stream) {
  if (aborted()) return "the rank group was aborted (another rank failed)";
  return nccl_message(ncclAllReduce(data, data, count, ncclFloat32, ncclSum,
                                    group_->comms[static_cast<size_t>(rank_)], stream),
                      "all-reduce");
}

std::string NcclCommunicator::all_gather_device(const float* send, float* recv, size_t count,
                                                cudaStream_t stream) {
  if (aborted()) return "the rank group was aborted (another rank failed)";
  return nccl_message(ncclAllGather(send, recv, count, ncclFloat32,
                                    group_->comms[static_cast<size_t>(rank_)], stream),
                      "all-gather");
}

void NcclCommunicator::wait(cudaStream_t stream, const std::string& what) {
  // Spin briefly (a decode step's tail is microseconds), then back off.
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    const cudaError_t query = cudaStreamQuery(stream);
    if (query == cudaSuccess) return;
    if (query != cudaErrorNotReady) {
      EXL3_CUDA_CHECK(query, fmt::format("tensor parallel rank {}: {}", rank_, what));
    }
    if (aborted())
      fail("tensor parallel rank {}: {}: another rank failed and the rank group was aborted", rank_,
           what);
    ncclComm_t c = group_->comms[static_cast<size_t>(rank_)];
    ncclResult_t async = ncclSuccess;
    if (c != nullptr && ncclCommGetAsyncError(c, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      group_->abort_all();
      EXL3_CUDA_CHECK(async, fmt::format("tensor parallel rank {}: {}", rank_, what));
    }
    if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void NcclCommunicator::all_gather(std::span<const float> send, std::span<float> recv) {
  const size_t n = send.size(), total = n * static_cast<size_t>(size());
  // Agree on the count first: mismatched counts would make NCCL read past buffers or hang.
  stage(std::max<size_t>(total, static_cast<size_t>(size()) * 2));
  const auto mine = static_cast<uint64_t>(n);
  auto* counts = staging_.as<uint64_t>();
  EXL3_CUDA_CHECK(
      cudaMemcpyAsync(counts + rank_, &mine, sizeof(mine), cudaMemcpyHostToDevice, stream_),
      "staging");
  EXL3_CUDA_CHECK(ncclAllGather(counts + rank_, counts, 1, ncclUint64,
                                group_->comms[static_cast<size_t>(rank_)], stream_),
                  fmt::format("tensor parallel rank {}: all-gather of the counts", rank_));
  std::vector<uint64_t> all(static_cast<size_t>(size()));
  EXL3_CUDA_CHECK(cudaMemcpyAsync(all.data(), counts, all.size() * sizeof(uint64_t),
                                  cudaMemcpyDeviceToHost, stream_),
                  "reading the counts");
  wait(stream_, "all-gather");
  for (int q = 0; q < size(); ++q) {
    if (all[static_cast<size_t>(q)] != mine) {
      fail("tensor parallel: all_gather counts differ: rank {} sends {}, rank {} sends {}", rank_,
           mine, q, all[static_cast<size_t>(q)]);
    }
  }
  if (recv.size() != total) {
    fail("tensor parallel rank {}: all_gather receive buffer holds {} floats, expected {}", rank_,
         recv.size(), total);
  }
  if (n == 0) return;
  EXL3_CUDA_CHECK(cudaMemcpyAsync(staging_.as<float>() + rank_ * n, send.data(), n * sizeof(float),
                                  cudaMemcpyHostToDevice, stream_),
                  "staging");
  const std::string err =
      all_gather_device(staging_.as<float>() + rank_ * n, staging_.as<float>(), n, stream_);
  if (!err.empty()) fail("tensor parallel rank {}: {}", rank_, err);
  EXL3_CUDA_CHECK(cudaMemcpyAsync(recv.data(), staging_.as<float>(), total * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_),
                  "reading the gathered data");
  wait(stream_, "all-gather");
}

void NcclCommunicator::all_reduce_sum(std::span<float> data) {
  // Gather every rank's vector and add on the host in rank order: the interface's fixed order.
  const size_t n = data.size();
  std::vector<float> all(n * static_cast<size_t>(size()));
  all_gather(data, all);
  for (size_t i = 0; i < n; ++i) {
    float s = all[i];
    for (int q = 1; q < size(); ++q) s += all[static_cast<size_t>(q) * n + i];
    data[i] = s;
  }
}

std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_group(const std::vector<int>& devices) {
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
  if (devices.empty()) fail("tensor parallel: no devices given");
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= visible) {
      fail(
          "tensor parallel: rank {} needs CUDA device {}, but {} device(s) are visible; hint: --tp "
          "at most {} here "
          "(CUDA_VISIBLE_DEVICES selects which)",
          i, devices[i], visible, visible);
    }
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i])
        fail("tensor parallel: ranks {} and {} both name device {}", j, i, devices[i]);
    }
  }
  // Connect every channel at creation rather than on first use: the engine's first use of a
  // message size may be inside a decode-graph capture. A value the user set wins.
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  auto state = std::make_shared<NcclGroupState>();
  state->devices = devices;
  state->comms.assign(devices.size(), nullptr);
  EXL3_CUDA_CHECK(
      ncclCommInitAll(state->comms.data(), static_cast<int>(devices.size()), devices.data()),
      fmt::format("tensor parallel: creating the NCCL communicators over {} GPU(s) (hint: "
                  "NCCL_DEBUG=WARN prints why)",
                  devices.size()));
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  for (size_t i = 0; i < devices.size(); ++i)
    out.push_back(std::make_unique<NcclCommunicator>(state, static_cast<int>(i)));
  return out;
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_NCCL
