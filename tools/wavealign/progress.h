// Progress of long work on stderr: once a command has run 2 s, a line "[  4.2s] <stage>" redrawn in place every
// 0.25 s, so a 40 s mask method or a 20 GB file does not look like a hang. Only when stderr is a terminal and
// --quiet was not given: short runs, pipes and logs stay clean.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace wavealign::cli {

/// --quiet: no progress line (the global flag; main sets it before the command runs).
void set_quiet(bool quiet);

class Progress {
 public:
  Progress();
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// What the command does now, e.g. "writing mask.npy (19.6 GB)".
  void stage(std::string message);

  /// Stops the line and clears it: called before the command prints its result.
  void finish();

 private:
  void draw(std::stop_token stop);

  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::string stage_;
  bool shown_ = false;
  std::jthread drawer_;  // last: started once the members it reads exist, joined before they go
};

}  // namespace wavealign::cli
