// GET /metrics in Prometheus' text format (see metrics.hpp).
#include "metrics.hpp"

#include <fmt/format.h>

namespace exl3::server {
namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

void histogram(std::string& out, const char* name, const char* help, const LatencyHistogram& h) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.buckets[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, h.count, name,
                     h.sum, name, h.count);
}

}  // namespace

std::string prometheus_metrics(const MetricsInput& in) {
  const SchedulerStats& s = in.stats;
  std::string out;
  metric(out, "exl3_requests_running", "gauge", "Requests generating now.",
         static_cast<double>(s.running));
  metric(out, "exl3_requests_queued", "gauge", "Requests waiting for a run slot or KV room.",
         static_cast<double>(s.queued));
  out +=
      "# HELP exl3_requests_total Requests that ended, by outcome.\n# TYPE exl3_requests_total "
      "counter\n";
  out += fmt::format("exl3_requests_total{{outcome=\"completed\"}} {}\n", s.completed);
  out += fmt::format("exl3_requests_total{{outcome=\"cancelled\"}} {}\n", s.cancelled);
  out += fmt::format("exl3_requests_total{{outcome=\"failed\"}} {}\n", s.failed);
  metric(out, "exl3_requests_refused_queue_full_total", "counter",
         "Requests answered 503 because the queue was full.",
         static_cast<double>(s.refused_queue_full));
  metric(out, "exl3_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
         static_cast<double>(s.prompt_tokens));
  metric(out, "exl3_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens found in the KV cache (prefix caching), not prefilled again.",
         static_cast<double>(s.prefix_hit_tokens));
  metric(out, "exl3_generation_tokens_total", "counter", "Tokens sampled.",
         static_cast<double>(s.generation_tokens));
  metric(out, "exl3_preemptions_total", "counter",
         "Running requests sent back to the queue to free KV pages (prefilled again later).",
         static_cast<double>(s.preemptions));
  metric(out, "exl3_preemption_recomputed_tokens_total", "counter",
         "Tokens prefilled again when preempted requests were readmitted.",
         static_cast<double>(s.recomputed_tokens));
  metric(out, "exl3_forward_steps_total", "counter", "Batched forward steps run.",
         static_cast<double>(s.steps));
  metric(out, "exl3_kv_cache_tokens", "gauge", "KV cache capacity in tokens.",
         static_cast<double>(s.cache_tokens));
  metric(out, "exl3_kv_cache_free_tokens", "gauge", "KV cache tokens no sequence holds.",
         static_cast<double>(s.free_cache_tokens));
  metric(out, "exl3_kv_cache_usage_ratio", "gauge", "Share of the KV cache in use (0..1).",
         s.cache_tokens > 0
             ? 1.0 - static_cast<double>(s.free_cache_tokens) / static_cast<double>(s.cache_tokens)
             : 0.0);
  if (s.draft_cache_tokens > 0) {  // speculative decoding (serve --draft)
    metric(out, "exl3_speculative_rounds_total", "counter",
           "Speculative rounds run, counted per sequence (each one model pass for it).",
           static_cast<double>(s.speculative_rounds));
    metric(out, "exl3_speculative_drafted_tokens_total", "counter",
           "Tokens the draft model proposed.", static_cast<double>(s.drafted_tokens));
    metric(out, "exl3_speculative_accepted_tokens_total", "counter",
           "Proposed tokens the model kept.", static_cast<double>(s.accepted_tokens));
    metric(out, "exl3_draft_kv_cache_free_tokens", "gauge",
           "Draft model KV cache tokens no sequence holds.",
           static_cast<double>(s.draft_free_cache_tokens));
  }
  metric(out, "exl3_http_connections", "gauge", "Open HTTP connections.", in.connections);
  metric(out, "exl3_http_max_connections", "gauge", "The connection cap (--max-connections).",
         in.max_connections);
  metric(out, "exl3_draining", "gauge", "1 while the server drains before stopping.",
         in.draining ? 1.0 : 0.0);
  histogram(out, "exl3_time_to_first_token_seconds", "From arrival to the first sampled token.",
            s.time_to_first_token);
  histogram(out, "exl3_inter_token_latency_seconds", "Between consecutive tokens of one request.",
            s.inter_token_latency);
  return out;
}

}  // namespace exl3::server
