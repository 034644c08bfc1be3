#include "progress.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace wavealign::cli {

namespace {

std::atomic<bool> quiet_flag{false};

// Work shorter than this finishes before a line would help; 0.25 s redraws read as a running clock.
constexpr auto kFirstLineAfter = std::chrono::seconds(2);
constexpr auto kRedrawEvery = std::chrono::milliseconds(250);

}  // namespace

void set_quiet(bool quiet) { quiet_flag = quiet; }

Progress::Progress() {
  if (!quiet_flag && isatty(STDERR_FILENO) == 1) drawer_ = std::jthread([this](std::stop_token stop) { draw(stop); });
}

void Progress::finish() {
  if (!drawer_.joinable()) return;
  drawer_.request_stop();
  drawer_.join();
  if (shown_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
}

void Progress::stage(std::string message) {
  std::lock_guard lock(mutex_);
  stage_ = std::move(message);
}

void Progress::draw(std::stop_token stop) {
  std::unique_lock lock(mutex_);
  // Woken only by a stop request (the predicate never holds): the wait is a sleep that ends early.
  wake_.wait_until(lock, stop, start_ + kFirstLineAfter, [] { return false; });
  while (!stop.stop_requested()) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "\r\033[K[%5.1fs] %s", seconds, stage_.c_str());
    std::fflush(stderr);
    shown_ = true;
    wake_.wait_for(lock, stop, kRedrawEvery, [] { return false; });
  }
}

}  // namespace wavealign::cli
