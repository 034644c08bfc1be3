// Progress lines on stderr for long work: only when stderr is a terminal, and only once the work has run
// for 2 s, so short runs and piped output stay clean.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace wavealign::cli {

class Progress {
 public:
  Progress() : enabled_(isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()) {}
  ~Progress() {
    if (shown_) std::fputs("\r\033[K", stderr);
  }
  void update(const std::string& message) {
    if (!enabled_) return;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (seconds < 2.0) return;
    std::fprintf(stderr, "\r\033[K[%5.1fs] %s", seconds, message.c_str());
    std::fflush(stderr);
    shown_ = true;
  }

 private:
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace wavealign::cli
