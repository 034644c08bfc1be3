// The benchmarks' NVML clock sampler (bench/gpu/gpu_clock_sampler.h): it must never fail a benchmark. Without
// NVML (build machines, CI) every statistic is unavailable (NaN); with NVML and a GPU, a window of a few
// sampling periods reports a clock in the range any NVIDIA part runs at.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "gpu_clock_sampler.h"

namespace wavealign::bench {
namespace {

TEST(GpuClockSampler, StopWithoutStartReportsNothing) {
  GpuClockSampler sampler;
  const GpuClockStats stats = sampler.stop();
  EXPECT_FALSE(stats.available);
  EXPECT_EQ(stats.samples, 0);
  EXPECT_TRUE(std::isnan(stats.mean_sm_clock_mhz));
}

TEST(GpuClockSampler, WindowReportsAClockOrNothing) {
  GpuClockSampler sampler;
  for (int window = 0; window < 2; ++window) {  // a second window after stop() starts from zero again
    sampler.start(0);
    std::this_thread::sleep_for(5 * GpuClockSampler::kSamplePeriod);
    const GpuClockStats stats = sampler.stop();
    if (!stats.available) {
      EXPECT_EQ(stats.samples, 0);
      EXPECT_TRUE(std::isnan(stats.mean_sm_clock_mhz));
      EXPECT_TRUE(std::isnan(stats.power_capped_fraction));
      continue;
    }
    EXPECT_GE(stats.samples, 1);
    EXPECT_GT(stats.mean_sm_clock_mhz, 100.0);  // idle parts park near 200-350 MHz, boost is below 3.5 GHz
    EXPECT_LT(stats.mean_sm_clock_mhz, 3500.0);
    if (!std::isnan(stats.power_capped_fraction)) {
      EXPECT_GE(stats.power_capped_fraction, 0.0);
      EXPECT_LE(stats.power_capped_fraction, 1.0);
    }
  }
  EXPECT_FALSE(sampler.stop().available);  // stopping twice is harmless
}

TEST(GpuClockSampler, UnknownDeviceIsUnavailable) {
  GpuClockSampler sampler;
  sampler.start(4096, "0000:ff:1f.7");
  std::this_thread::sleep_for(2 * GpuClockSampler::kSamplePeriod);
  EXPECT_FALSE(sampler.stop().available);
}

}  // namespace
}  // namespace wavealign::bench
