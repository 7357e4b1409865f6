// The CUDA tensor-parallel engine: N ranks, rank r a CudaEngine on GPU r holding its slice of
// every weight (the TpPlan the CPU TP engine runs), joined by an NCCL group.
//
//   x = embed(tokens)                                   replicated table (no collective)
//   per layer:  x += all_reduce(o_loc(attention over the local heads))
//               x += all_reduce(down_loc(SiLU(gate_loc(h)) * up_loc(h)))   (or the MoE slice)
//   logits = all_gather(lm_head_loc(norm(x)))          rank 0 hands them out
//
// Each rank runs on its own persistent thread (its device stays current there, and its decode
// graphs, NCCL calls included, are captured there), so one host process drives all GPUs without
// any step protocol between processes: the front validates a batch once, then every rank runs
// the same forward_batch. The embedding is replicated rather than vocab-parallel: it costs
// vocab x hidden x 2 bytes per GPU and saves one all-reduce per step.
#include "cuda_tp_engine.hpp"

#if defined(EXL3_HAVE_NCCL)

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include <cuda_runtime_api.h>

#include "cuda_engine.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/error.hpp"
#include "exl3/model/tp_plan.hpp"
#include "exl3/runtime/nccl_communicator.hpp"

namespace exl3::runtime {
namespace {

// One persistent thread per rank; run() executes a job on every rank and waits for all of them,
// rethrowing the first failure after all have finished.
class RankThreads {
 public:
  explicit RankThreads(int n) {
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  // `on_failure` runs on the failing rank's thread right after it throws (so the others, blocked
  // in a collective, can be released before they are waited for).
  void run(const std::function<void(int)>& job, const std::function<void()>& on_failure) {
    std::unique_lock lock(mu_);
    job_ = &job;
    on_failure_ = &on_failure;
    pending_ = static_cast<int>(threads_.size());
    first_error_ = nullptr;
    ++generation_;
    cv_.notify_all();
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (first_error_) std::rethrow_exception(first_error_);
  }

 private:
  void loop(int r) {
    uint64_t seen = 0;
    while (true) {
      const std::function<void(int)>* job = nullptr;
      const std::function<void()>* on_failure = nullptr;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
        on_failure = on_failure_;
      }
      std::exception_ptr err;
      try {
        (*job)(r);
      } catch (...) {
        err = std::current_exception();
        (*on_failure)();
      }
      std::lock_guard lock(mu_);
      if (err && !first_error_) first_error_ = err;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  const std::function<void()>* on_failure_ = nullptr;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr first_error_;
};

// Times `reduces` all-reduces of n floats plus one all-gather of `gather` floats per rank, as one
// captured graph replayed several times (what a decode step's collectives cost inside its graph).
class CollectiveTimer {
 public:
  CollectiveTimer(NcclCommunicator& c, size_t n, size_t gather, size_t ranks)
      : c_(c),
        n_(n),
        gather_(gather),
        data_(cuda::DeviceBuffer::of<float>(std::max<size_t>({n, gather, 1}),
                                            "the collective timer's data")),
        gathered_(cuda::DeviceBuffer::of<float>(std::max<size_t>(gather * ranks, 1),
                                                "the collective timer's gathered data")) {
    EXL3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                    "timing the collectives: creating a stream");
    EXL3_CUDA_CHECK(cudaMemsetAsync(data_.get(), 0, std::max(n, gather) * sizeof(float), stream_),
                    "timing the collectives: clearing");
    EXL3_CUDA_CHECK(cudaEventCreate(&start_), "timing the collectives: creating an event");
    EXL3_CUDA_CHECK(cudaEventCreate(&stop_), "timing the collectives: creating an event");
  }
  ~CollectiveTimer() {
    if (exec_) cudaGraphExecDestroy(exec_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }
  CollectiveTimer(const CollectiveTimer&) = delete;
  CollectiveTimer& operator=(const CollectiveTimer&) = delete;

  double seconds(size_t reduces) {
    cudaGraph_t graph = nullptr;
    EXL3_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                    "timing the collectives: capturing");
    std::string err;
    for (size_t i = 0; i < reduces && err.empty(); ++i)
      err = c_.all_reduce_sum_device(data_.as<float>(), n_, stream_);
    if (err.empty() && gather_ > 0)
      err = c_.all_gather_device(data_.as<float>(), gathered_.as<float>(), gather_, stream_);
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (!err.empty()) {
      if (graph) cudaGraphDestroy(graph);
      fail("timing the collectives: {}", err);
    }
    EXL3_CUDA_CHECK(end, "timing the collectives: capturing");
    const cudaError_t inst = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    EXL3_CUDA_CHECK(inst, "timing the collectives: instantiating");
    constexpr int kReps = 20;
    EXL3_CUDA_CHECK(cudaGraphLaunch(exec_, stream_),
                    "timing the collectives: warming up");  // NCCL sets up its connections here
    c_.wait(stream_, "timing the collectives");
    EXL3_CUDA_CHECK(cudaEventRecord(start_, stream_), "timing the collectives: timing");
    for (int i = 0; i < kReps; ++i)
      EXL3_CUDA_CHECK(cudaGraphLaunch(exec_, stream_), "timing the collectives: timing");
    EXL3_CUDA_CHECK(cudaEventRecord(stop_, stream_), "timing the collectives: timing");
    c_.wait(stream_, "timing the collectives");
    float ms = 0.0f;
    EXL3_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_), "timing the collectives: timing");
    return ms * 1e-3 / kReps;
  }

 private:
  NcclCommunicator& c_;
  size_t n_, gather_;
  cuda::DeviceBuffer data_, gathered_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

class CudaTpEngine final : public Engine {
 public:
  CudaTpEngine(const Checkpoint& ckpt, ModelSpec spec, const EngineOptions& opts)
      : spec_(std::move(spec)) {
    const int tp = opts.tp;
    std::vector<int> devices;
    for (int r = 0; r < tp; ++r) devices.push_back(r);
    comms_ = make_nccl_group(devices);  // checks the devices first
    plan_ = plan_tensor_parallel(spec_, tp, tp_weight_info(ckpt));
    ranks_.resize(static_cast<size_t>(tp));
    threads_ = std::make_unique<RankThreads>(tp);
    // Every rank loads on its own thread (its device current there). A rank that fails to load
    // has issued no collective, so the others finish loading and the first error is reported
    // once every rank has freed what it loaded.
    try {
      threads_->run(
          [&](int r) {
            const auto ur = static_cast<size_t>(r);
            EXL3_CUDA_CHECK(cudaSetDevice(comms_[ur]->device()),
                            fmt::format("tensor parallel: selecting GPU {}", r));
            const CudaRank rank{&plan_, r, comms_[ur].get()};
            ranks_[ur] = make_cuda_engine(ckpt, spec_, opts, &rank);
          },
          [] {});
    } catch (...) {
      release_ranks();
      throw;
    }
  }

  ~CudaTpEngine() override { release_ranks(); }

  const ModelSpec& spec() const override { return spec_; }
  Device device() const override { return Device::kCuda; }

  SeqId new_sequence() override {
    usable();
    const SeqId id = ranks_[0]->new_sequence();
    for (size_t r = 1; r < ranks_.size(); ++r) {
      if (ranks_[r]->new_sequence() != id)
        fail("tensor parallel: rank {} KV cache lost step with rank 0", r);
    }
    return id;
  }
  void drop_sequence(SeqId seq) override {
    for (auto& rk : ranks_) rk->drop_sequence(seq);
  }
  int64_t sequence_length(SeqId seq) const override { return ranks_[0]->sequence_length(seq); }
  void truncate_sequence(SeqId seq, int64_t length) override {
    for (auto& rk : ranks_) rk->truncate_sequence(seq, length);
  }
  KvCacheInfo kv_cache_info() const override {
    KvCacheInfo all{ranks_[0]->kv_cache_info().format, 0};
    for (const auto& r : ranks_) all.bytes_per_token += r->kv_cache_info().bytes_per_token;
    return all;
  }
  int64_t free_cache_tokens() const override { return ranks_[0]->free_cache_tokens(); }
  int64_t cache_tokens_needed(SeqId seq, int64_t new_tokens) const override {
    return ranks_[0]->cache_tokens_needed(seq, new_tokens);
  }

  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    const BatchEntry e{seq, tokens, mode};
    return std::move(forward_batch(std::span<const BatchEntry>(&e, 1)).front());
  }

  std::vector<std::vector<float>> forward_batch(std::span<const BatchEntry> batch) override {
    return on_every_rank(batch, &Engine::forward_batch);
  }

  std::vector<std::vector<int32_t>> forward_batch_argmax(
      std::span<const BatchEntry> batch) override {
    return on_every_rank(batch, &Engine::forward_batch_argmax);
  }

  double collective_seconds(int64_t tokens, int64_t logit_rows) override {
    usable();
    if (tokens <= 0 || logit_rows < 0 || logit_rows > tokens) {
      fail("collective_seconds: {} tokens with {} logits rows", tokens, logit_rows);
    }
    const auto hidden = static_cast<size_t>(spec_.hidden_size);
    int64_t rank_vocab = 0;
    for (const Extent& e : plan_.vocab) rank_vocab = std::max(rank_vocab, e.count);
    const size_t n = static_cast<size_t>(tokens) * hidden, layers = spec_.layers.size();
    const size_t gather = static_cast<size_t>(logit_rows * rank_vocab);
    std::vector<double> seconds(ranks_.size());
    threads_->run(
        [&](int r) {
          NcclCommunicator& c = *comms_[static_cast<size_t>(r)];
          CollectiveTimer t(c, n, gather, static_cast<size_t>(plan_.tp));
          seconds[static_cast<size_t>(r)] = t.seconds(2 * layers);
        },
        [&] {
          broken_ = true;
          comms_[0]->abort();
        });
    return *std::max_element(seconds.begin(), seconds.end());
  }

 private:
  // Each rank's engine frees its device memory, and its communicator is destroyed, on the rank's
  // own thread (its device current there; NCCL's threaded mode tears communicators down
  // concurrently rather than one after another from one thread).
  void release_ranks() noexcept {
    if (!threads_) return;
    try {
      threads_->run(
          [&](int r) {
            ranks_[static_cast<size_t>(r)].reset();
            comms_[static_cast<size_t>(r)].reset();
          },
          [] {});
    } catch (...) {
    }
    threads_.reset();
  }

  // Runs `step` on every rank's engine at once (each rank's forward joins the collectives) and
  // returns rank 0's result; a rank's failure aborts the NCCL group.
  template <typename Out>
  Out on_every_rank(std::span<const BatchEntry> batch,
                    Out (Engine::*step)(std::span<const BatchEntry>)) {
    usable();
    // Validated once here, so the ranks cannot disagree about a bad batch halfway through.
    validate_batch(*this, batch);
    Out out;
    try {
      threads_->run(
          [&](int r) {
            auto got = (ranks_[static_cast<size_t>(r)].get()->*step)(batch);
            if (r == 0) out = std::move(got);
          },
          [&] {
            broken_ = true;
            comms_[0]->abort();  // aborts the whole group: the other ranks' waits throw
          });
    } catch (...) {
      broken_ = true;
      throw;
    }
    return out;
  }

  void usable() const {
    if (broken_) {
      fail(
          "tensor parallel: a rank failed during an earlier step and the NCCL group was aborted; "
          "the engine must be "
          "loaded again");
    }
  }

  ModelSpec spec_;
  TpPlan plan_;
  std::vector<std::unique_ptr<NcclCommunicator>> comms_;
  std::vector<std::unique_ptr<Engine>> ranks_;
  std::unique_ptr<RankThreads> threads_;
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<Engine> make_cuda_tp_engine(const Checkpoint& ckpt, ModelSpec spec,
                                            const EngineOptions& opts) {
  return std::make_unique<CudaTpEngine>(ckpt, std::move(spec), opts);
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_NCCL
