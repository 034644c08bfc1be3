// SM clock, board power and power-cap state of one GPU, sampled every 10 ms on a background thread while a
// benchmark's timed runs execute.
//
// Why: the H200 runs the attention kernel at its 700 W software power cap. NVML reports the SW power cap
// clock-event reason within ~100 ms of a kernel starting, and the SM clock then falls from 1980 MHz to
// ~1490-1650 MHz (the sparse WaveAlign order at 363,600 tokens settles near 1500 MHz, dense near 1630 MHz).
// The first ~100-300 ms after an idle period still run at boost clocks, so a short case (a 20 ms kernel x 6
// runs) is measured partly in that transient: one case read 597 and 689 TF/s in two sessions. Recording the
// clock next to each timing shows which state a number was measured in.
//
// NVML is loaded with dlopen() at run time instead of being linked: build machines (CI) have the CUDA
// toolkit but no driver, hence no libnvidia-ml.so.1. Without it every statistic reads as unavailable and the
// benchmark runs as before.
#pragma once

#include <dlfcn.h>

#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

namespace wavealign::bench {

/// Means over the samples of one start()/stop() window. A statistic NVML could not report on this GPU is NaN;
/// `available` is false when no SM clock could be read at all (no NVML, no such device).
struct GpuClockStats {
  bool available = false;
  double mean_sm_clock_mhz = std::numeric_limits<double>::quiet_NaN();
  double mean_power_w = std::numeric_limits<double>::quiet_NaN();
  double power_capped_fraction = std::numeric_limits<double>::quiet_NaN();  // of the samples with reasons
  int samples = 0;
};

class GpuClockSampler {
 public:
  static constexpr std::chrono::milliseconds kSamplePeriod{10};

  GpuClockSampler() { load(); }
  GpuClockSampler(const GpuClockSampler&) = delete;
  GpuClockSampler& operator=(const GpuClockSampler&) = delete;
  ~GpuClockSampler() {
    stop();
    if (initialized_) shutdown_();
    if (library_ != nullptr) dlclose(library_);
  }

  /// Starts sampling one GPU. NVML numbers devices in PCI order, which can differ from the CUDA numbering
  /// (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER=FASTEST_FIRST), so a PCI bus id ("0000:19:00.0", as
  /// cudaDeviceGetPCIBusId writes it), which names the same GPU in both, is used when given; NVML index
  /// `device_index` otherwise or if this NVML cannot look bus ids up.
  void start(unsigned device_index, const std::string& pci_bus_id = {}) {
    stop();
    if (!initialized_) return;
    Device device = nullptr;
    const bool by_bus_id = !pci_bus_id.empty() && get_handle_by_pci_bus_id_ != nullptr;
    const Return found = by_bus_id ? get_handle_by_pci_bus_id_(pci_bus_id.c_str(), &device)
                                   : get_handle_by_index_(device_index, &device);
    if (found == kSuccess) begin(device);
  }

  /// Ends the window and returns its statistics (unavailable if start() found no device).
  GpuClockStats stop() {
    if (!thread_.joinable()) return {};
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_requested_ = true;
    }
    wake_.notify_all();
    thread_.join();
    GpuClockStats stats;
    stats.samples = clock_samples_;
    stats.available = clock_samples_ > 0;
    if (clock_samples_ > 0) stats.mean_sm_clock_mhz = clock_sum_mhz_ / clock_samples_;
    if (power_samples_ > 0) stats.mean_power_w = power_sum_mw_ / power_samples_ / 1000.0;
    if (reason_samples_ > 0) stats.power_capped_fraction = double(capped_samples_) / reason_samples_;
    return stats;
  }

 private:
  // The few NVML declarations used here (nvml.h is not needed to build): an opaque device handle and
  // nvmlReturn_t, an enum whose 0 is NVML_SUCCESS.
  struct NvmlDevice;
  using Device = NvmlDevice*;
  using Return = unsigned int;
  static constexpr Return kSuccess = 0;
  static constexpr unsigned int kClockSm = 1;  // NVML_CLOCK_SM
  // nvmlClocksEventReasonSwPowerCap (formerly nvmlClocksThrottleReasonSwPowerCap): the driver lowers the
  // clocks to hold board power at the software power limit.
  static constexpr unsigned long long kSwPowerCapReason = 0x4ULL;

  using InitFn = Return (*)();
  using ShutdownFn = Return (*)();
  using GetHandleByIndexFn = Return (*)(unsigned int, Device*);
  using GetHandleByPciBusIdFn = Return (*)(const char*, Device*);
  using GetClockInfoFn = Return (*)(Device, unsigned int, unsigned int*);
  using GetReasonsFn = Return (*)(Device, unsigned long long*);
  using GetPowerUsageFn = Return (*)(Device, unsigned int*);

  template <typename Fn>
  Fn symbol(const char* name) const {
    return reinterpret_cast<Fn>(dlsym(library_, name));
  }

  void load() {
    library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library_ == nullptr) return;
    const auto init = symbol<InitFn>("nvmlInit_v2");
    shutdown_ = symbol<ShutdownFn>("nvmlShutdown");
    get_handle_by_index_ = symbol<GetHandleByIndexFn>("nvmlDeviceGetHandleByIndex_v2");
    get_handle_by_pci_bus_id_ = symbol<GetHandleByPciBusIdFn>("nvmlDeviceGetHandleByPciBusId_v2");
    get_clock_info_ = symbol<GetClockInfoFn>("nvmlDeviceGetClockInfo");
    // Drivers from 535 name it "ClocksEvent"; older ones only have the "ClocksThrottle" spelling (same ABI).
    get_reasons_ = symbol<GetReasonsFn>("nvmlDeviceGetCurrentClocksEventReasons");
    if (get_reasons_ == nullptr) get_reasons_ = symbol<GetReasonsFn>("nvmlDeviceGetCurrentClocksThrottleReasons");
    get_power_usage_ = symbol<GetPowerUsageFn>("nvmlDeviceGetPowerUsage");
    if (init == nullptr || shutdown_ == nullptr || get_handle_by_index_ == nullptr || get_clock_info_ == nullptr) return;
    initialized_ = init() == kSuccess;
  }

  void begin(Device device) {
    stop_requested_ = false;
    clock_samples_ = power_samples_ = reason_samples_ = capped_samples_ = 0;
    clock_sum_mhz_ = power_sum_mw_ = 0;
    thread_ = std::thread([this, device] { sample_until_stopped(device); });
  }

  // The first sample is taken at once, so even a window shorter than the period has one.
  void sample_until_stopped(Device device) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_requested_) {
      lock.unlock();
      sample(device);
      lock.lock();
      wake_.wait_for(lock, kSamplePeriod, [this] { return stop_requested_; });
    }
  }

  // On Hopper, nvmlDeviceGetPowerUsage is the board power averaged over the last second (not instantaneous),
  // so power_w lags the clock by up to a second: one more reason to warm up before the timed runs.
  void sample(Device device) {
    unsigned int clock_mhz = 0;
    if (get_clock_info_(device, kClockSm, &clock_mhz) == kSuccess) {
      clock_sum_mhz_ += clock_mhz;
      ++clock_samples_;
    }
    unsigned int power_mw = 0;
    if (get_power_usage_ != nullptr && get_power_usage_(device, &power_mw) == kSuccess) {
      power_sum_mw_ += power_mw;
      ++power_samples_;
    }
    unsigned long long reasons = 0;
    if (get_reasons_ != nullptr && get_reasons_(device, &reasons) == kSuccess) {
      capped_samples_ += (reasons & kSwPowerCapReason) != 0 ? 1 : 0;
      ++reason_samples_;
    }
  }

  void* library_ = nullptr;
  bool initialized_ = false;
  ShutdownFn shutdown_ = nullptr;
  GetHandleByIndexFn get_handle_by_index_ = nullptr;
  GetHandleByPciBusIdFn get_handle_by_pci_bus_id_ = nullptr;
  GetClockInfoFn get_clock_info_ = nullptr;
  GetReasonsFn get_reasons_ = nullptr;
  GetPowerUsageFn get_power_usage_ = nullptr;

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
  // Written by the sampling thread only; read by stop() after join().
  int clock_samples_ = 0, power_samples_ = 0, reason_samples_ = 0, capped_samples_ = 0;
  double clock_sum_mhz_ = 0, power_sum_mw_ = 0;
};

}  // namespace wavealign::bench
