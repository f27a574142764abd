// Prometheus text metrics: requests by route and status, prompt/completion tokens, time to
// first token and inter-token latency histograms; queue depth and cache counters are read
// from the engine when scraped. Thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace lily {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends the _bucket, _sum and _count lines of `name`.
  void render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t n_ = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& route, int status);
  void observe_ttft(double seconds);
  void observe_itl(double seconds);
  std::string render(const Engine& engine) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_, itl_;
};

}  // namespace lily
