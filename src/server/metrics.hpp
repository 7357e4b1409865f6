// The Prometheus text exposition (format 0.0.4) of `exl3 serve`'s state: GET /metrics.
#pragma once

#include <string>

#include "exl3/server/scheduler.hpp"

namespace exl3::server {

struct MetricsInput {
  SchedulerStats stats;
  int connections = 0;
  int max_connections = 0;
  bool draining = false;
};

// Every metric with its HELP and TYPE lines; names start with exl3_.
std::string prometheus_metrics(const MetricsInput& in);

}  // namespace exl3::server
