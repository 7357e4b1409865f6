// Preemption on the CUDA engine: the scheduler over the conformance model with a KV pool far too
// small for every request's prompt + max_tokens at once (the CPU twin is
// tests/server/preemption_test.cpp). A preempted request's pages are rebuilt by the prefill
// kernels, not the decode kernels that first wrote them, so its logits may differ in the last
// bits and a reply may part from the uninterrupted one at a near tie (docs/serve.md): the test
// asks every request to finish whole and consistent, the pools to drain, and at least five of
// six replies to equal the same engine's uninterrupted greedy run (a corrupted rebuild would
// part nearly every preempted reply at once).
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "../server/server_test_util.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/server/scheduler.hpp"
#include "require_gpu.hpp"
#include "test_support.hpp"

namespace st = exl3::server::test;
namespace runtime = exl3::runtime;
using exl3::Tokenizer;
using exl3::server::GenerationRequest;
using exl3::server::RequestStream;
using exl3::server::Scheduler;
using exl3::server::SchedulerOptions;

TEST(CudaServer, PreemptedRequestsFinishWholeOnTheGpu) {
  EXL3_REQUIRE_GPU();
  EXL3_REQUIRE_CONFORMANCE(conf);
  const auto model = st::tiny_model(conf);
  const auto tok = Tokenizer::load(model);
  runtime::EngineOptions eo;
  eo.device = runtime::Device::kCuda;
  eo.page_size = 8;
  eo.cache_tokens = 160;
  auto engine = runtime::load_engine(model, eo);
  runtime::EngineOptions ro;
  ro.device = runtime::Device::kCuda;
  auto reference = runtime::load_engine(model, ro);

  SchedulerOptions so{.max_seqs = 6, .max_queue = 8, .max_context = 0, .step_tokens = 32};
  so.preemption = true;
  Scheduler sched(*engine, tok, so);
  // Prompts and max_tokens together 2-3x the pool; none stops early (no stop tokens), so all
  // must grow.
  auto rng = exl3::test::make_rng();
  const std::vector<GenerationRequest> reqs = st::overflowing_requests(rng, {});
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& g : reqs) {
    auto sub = sched.submit(g);
    ASSERT_TRUE(sub.stream) << sub.message;
    streams.push_back(sub.stream);
  }
  int equal = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const st::Done d = st::drain(streams[i], 120.0);
    EXPECT_EQ(static_cast<int64_t>(d.tokens.size()), reqs[i].max_tokens) << "request " << i;
    EXPECT_EQ(d.last.completion_tokens, reqs[i].max_tokens) << "request " << i;
    EXPECT_EQ(d.text, tok.decode(d.tokens, /*skip_special=*/true)) << "request " << i;
    runtime::GenerateOptions go;
    go.max_new_tokens = reqs[i].max_tokens;
    const auto alone = runtime::generate(*reference, reqs[i].prompt, go);
    if (d.tokens == alone.tokens) ++equal;
  }
  const auto s = sched.stats();
  std::printf(
      "cuda preemption: %lld preemptions, %lld tokens recomputed, %d of 6 replies equal "
      "the uninterrupted run\n",
      static_cast<long long>(s.preemptions), static_cast<long long>(s.recomputed_tokens), equal);
  EXPECT_EQ(s.completed, 6);
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.recomputed_tokens, 0);
  EXPECT_GE(equal, 5);
  st::expect_drained_pools(s, "cuda preemption");
}
