// Work sharing over independent items. Each item's result depends only on its index, so outputs are the same
// for any thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace wavealign::workload {

inline int worker_count(int64_t items) {
  const int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::clamp<int64_t>(items, 1, hardware));
}

/// Calls body(worker, item) for every item in [0, items), items handed out in ascending order from a shared
/// counter; `worker` in [0, workers) indexes per-thread scratch. The first exception is rethrown.
template <class Body>
void parallel_for(int64_t items, int workers, Body&& body) {
  if (items <= 0) return;
  workers = static_cast<int>(std::clamp<int64_t>(workers, 1, items));
  if (workers == 1) {
    for (int64_t item = 0; item < items; ++item) body(0, item);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int worker) {
    try {
      for (int64_t item = next++; item < items; item = next++) body(worker, item);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      next = items;
    }
  };
  std::vector<std::jthread> threads;
  threads.reserve(workers - 1);
  for (int worker = 1; worker < workers; ++worker) threads.emplace_back(run, worker);
  run(0);
  threads.clear();
  if (error) std::rethrow_exception(error);
}

}  // namespace wavealign::workload
