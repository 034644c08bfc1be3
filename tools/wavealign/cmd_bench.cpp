// `wavealign bench`: a mask (the user's .npy or a synthetic workload) through the fused kernel in the original
// and the recommended row order on the local GPU, the measured times and TF/s next to the simulator's
// prediction; FlashAttention-4 and FlexAttention on the same mask and orders through `python3 -m
// wavealign.bench` where they are installed. Without a GPU it says so and prints the prediction alone.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "checks.h"
#include "commands.h"
#include "progress.h"
#include "wavealign/error.h"
#include "wavealign/gpu.h"
#include "wavealign/io.h"
#include "wavealign/plan.h"
#include "wavealign/schedule.h"
#include "workload_options.h"

#if defined(WAVEALIGN_HAS_CUDA)
#include <cuda_runtime.h>

#include "wavealign/attention.h"
#endif

namespace wavealign::cli {

namespace {

struct BenchOptions {
  WorkloadOptions workload;
  std::string gpu = "h200";
  std::string order;  // empty: the order `simulate` recommends
  int wave_size = 0;
  int iterations = 10;
  double plan_reuse = 1;
  std::string plan_cost = "gpu";
  std::string profile;  // empty: the built-in profile of --gpu
  int head_dim = 128;
  double warmup_ms = 2000;
  int iters = 5;
  std::string l2 = "cold";
  std::string peers = "auto";
  std::string python = "python3";
  std::string precision = "native";  // int8: the 8-bit kernel's rows (quantization included) beside the bf16 ones
  bool json = false;
};

// One row of the table: measured (ms < 0: not measured) and predicted.
struct Row {
  std::string impl;
  std::string order;
  double ms = -1;
  double tflops = -1;
  double predicted_ms = -1;
};

std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a shell command; returns its exit status and its standard output.
std::pair<int, std::string> run_command(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  std::string output;
  std::array<char, 4096> buffer;
  size_t read = 0;
  while ((read = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), read);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::filesystem::path own_executable() { return std::filesystem::read_symlink("/proc/self/exe"); }

// The prediction of `wavealign simulate --json` on the same workload: its recommendation and the simulator's
// kernel time of each order.
struct Prediction {
  nlohmann::json simulation;
  std::string recommended;

  double predicted_ms(const std::string& order) const {
    for (const auto& row : simulation["results"])
      if (row["order"] == order) return row["predicted_kernel_ms"].get<double>();
    return -1;
  }
};

std::string workload_flags(const BenchOptions& options) {
  const WorkloadOptions& w = options.workload;
  std::ostringstream flags;
  flags << " --model " << quoted(w.model) << " --frames " << w.frames << " --heads " << w.heads << " --mask "
        << quoted(w.mask) << " --density " << w.density << " --seed " << w.seed << " --gpu " << quoted(options.gpu);
  if (w.block != 0) flags << " --block " << w.block;
  flags << " --wave-size " << options.wave_size << " --iterations " << options.iterations << " --plan-reuse "
        << options.plan_reuse << " --plan-cost " << quoted(options.plan_cost);
  if (!options.profile.empty()) flags << " --profile " << quoted(options.profile);
  return flags.str();
}

// The orders simulate recommends from, and --order when it is another: the recommendation is simulate's own
// whichever order is timed.
std::string simulated_orders(const BenchOptions& options) {
  const std::string recommended_from = "original,s1,s2,wavealign";
  if (options.order.empty() || ("," + recommended_from + ",").find("," + options.order + ",") != std::string::npos)
    return recommended_from;
  return recommended_from + "," + options.order;
}

Prediction predict(const BenchOptions& options) {
  const std::string orders = simulated_orders(options);
  const auto [status, output] =
      run_command(quoted(own_executable().string()) + " simulate" + workload_flags(options) + " --orders " +
                  quoted(orders) + " --json");
  if (status != 0) throw std::runtime_error("the simulator's prediction failed (wavealign simulate exited " +
                                            std::to_string(status) + ")");
  Prediction prediction;
  prediction.simulation = nlohmann::json::parse(output);
  prediction.recommended = options.order.empty()
                               ? prediction.simulation["recommendation"]["order"].get<std::string>()
                               : options.order;
  return prediction;
}

#if defined(WAVEALIGN_HAS_CUDA)

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// The local GPU, or why there is none. Without a GPU the runtime reports cudaErrorInsufficientDriver when no
// NVIDIA driver is loaded at all, whose text ("CUDA driver version is insufficient") reads as "upgrade the
// driver": the line says first that no GPU was found, then what the runtime said.
std::optional<cudaDeviceProp> local_gpu(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaErrorInsufficientDriver) {
    *reason = "no CUDA GPU found (cudaErrorInsufficientDriver: no NVIDIA driver is loaded, or it is older than this "
              "build's CUDA runtime)";
    return std::nullopt;
  }
  if (status != cudaSuccess || count == 0) {
    *reason = status != cudaSuccess ? std::string("no CUDA GPU found (") + cudaGetErrorName(status) + ": " +
                                          cudaGetErrorString(status) + ")"
                                    : "no CUDA GPU found (the driver lists none)";
    return std::nullopt;
  }
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  return properties;
}

// Uniform values in [-1.5, 1.5) from a counter hash, as bf16 bit patterns (round to nearest even).
std::vector<uint16_t> random_bf16(size_t count, uint64_t seed) {
  std::vector<uint16_t> values(count);
  for (size_t i = 0; i < count; ++i) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    const float value = (float(x >> 40) / float(1ull << 24) - 0.5f) * 3.f;
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    values[i] = uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  }
  return values;
}

template <class T>
T* device_copy(const std::vector<T>& host) {
  void* device = nullptr;
  check_cuda(cudaMalloc(&device, std::max<size_t>(host.size(), 1) * sizeof(T)), "cudaMalloc");
  check_cuda(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return static_cast<T*>(device);
}

// The fused kernel on the workload in each schedule: the median of `iters` CUDA-event timings after the warm-up
// kernels have run `warmup_ms` (the GPU's steady, power-capped clock), with L2 flushed before each launch when
// cold. Returns the milliseconds of each schedule.
std::vector<double> time_kernel(const BenchOptions& options, const Workload& workload,
                                const std::vector<Schedule>& schedules, cuda::Precision precision) {
  const BlockMask& mask = workload.mask;
  const CsrMask csr = mask.to_csr();
  const size_t elements = size_t(mask.heads()) * size_t(workload.tokens) * size_t(options.head_dim);
  std::vector<void*> buffers;
  auto upload = [&](auto* pointer) {
    buffers.push_back(pointer);
    return pointer;
  };
  cuda::SparseAttentionArgs args;
  args.q = upload(device_copy(random_bf16(elements, options.workload.seed * 3 + 1)));
  args.k = upload(device_copy(random_bf16(elements, options.workload.seed * 3 + 2)));
  args.v = upload(device_copy(random_bf16(elements, options.workload.seed * 3 + 3)));
  void* out = nullptr;
  check_cuda(cudaMalloc(&out, elements * 2), "cudaMalloc");
  args.o = upload(out);
  void* lse = nullptr;
  check_cuda(cudaMalloc(&lse, size_t(mask.heads()) * workload.tokens * sizeof(float)), "cudaMalloc");
  args.lse = static_cast<float*>(upload(lse));
  args.heads = mask.heads();
  args.tokens = workload.tokens;
  args.head_dim = options.head_dim;
  args.block = BlockShape{workload.block, workload.block};
  args.element_type = cuda::ElementType::kBf16;
  args.row_ptr = upload(device_copy(csr.row_ptr));
  args.col_idx = upload(device_copy(csr.col_idx));
  args.precision = precision;
  const cuda::Support support = cuda::query_support(args);
  WA_CHECK_ARG(support.supported, precision == cuda::Precision::kInt8 ? "--precision" : "--head-dim",
               "the fused kernel cannot run this workload here: ", support.reason);
  void* workspace = nullptr;
  check_cuda(cudaMalloc(&workspace, cuda::workspace_bytes(args)), "cudaMalloc");
  upload(workspace);
  int l2_bytes = 0;
  check_cuda(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0), "cudaDeviceGetAttribute");
  void* flush = nullptr;
  if (options.l2 == "cold") check_cuda(cudaMalloc(&flush, size_t(l2_bytes) * 2), "cudaMalloc");
  if (flush != nullptr) upload(flush);
  cudaStream_t stream;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");

  std::vector<double> medians;
  for (const Schedule& schedule : schedules) {
    args.schedule = upload(device_copy(schedule.items));
    int launches = 0;
    auto launch = [&] {
      if (flush != nullptr)
        check_cuda(cudaMemsetAsync(flush, launches & 0xFF, size_t(l2_bytes) * 2, stream), "cudaMemsetAsync");
      ++launches;
      check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
      cuda::sparse_attention(args, workspace, stream);
      check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      return double(ms);
    };
    for (double spent = 0; launches < 1 || spent < options.warmup_ms;) spent += launch();
    std::vector<double> times;
    for (int i = 0; i < options.iters; ++i) times.push_back(launch());
    std::sort(times.begin(), times.end());
    medians.push_back(times[times.size() / 2]);
  }
  // A NaN in the output would make the timing meaningless.
  std::vector<float> lse_host(size_t(mask.heads()) * workload.tokens);
  check_cuda(cudaMemcpy(lse_host.data(), lse, lse_host.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  if (std::any_of(lse_host.begin(), lse_host.end(), [](float x) { return std::isnan(x); }))
    throw std::runtime_error("the fused kernel wrote NaN into LSE");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  for (void* buffer : buffers) cudaFree(buffer);
  return medians;
}

#endif  // WAVEALIGN_HAS_CUDA

// FlashAttention-4 and FlexAttention on the same mask and orders: `python3 -m wavealign.bench`, which prints one
// JSON object per line. The package next to this executable (the build tree's python/) goes first on PYTHONPATH.
std::vector<nlohmann::json> run_peers(const BenchOptions& options, const Workload& workload,
                                      const std::vector<std::pair<std::string, std::vector<int32_t>>>& orders,
                                      std::string* failure) {
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / ("wavealign-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(folder);
  write_npy(folder / "mask.npy", mask_to_npy(workload.mask));
  std::string command;
  const std::filesystem::path package = own_executable().parent_path() / "python";
  if (std::filesystem::exists(package / "wavealign" / "__init__.py"))
    command = "PYTHONPATH=" + quoted(package.string()) + "${PYTHONPATH:+:$PYTHONPATH} ";
  command += quoted(options.python) + " -m wavealign.bench --mask " + quoted((folder / "mask.npy").string()) +
             " --block " + std::to_string(workload.block) + " --head-dim " + std::to_string(options.head_dim) +
             " --iters " + std::to_string(options.iters) + " --warmup-ms " + std::to_string(options.warmup_ms) +
             " --seed " + std::to_string(options.workload.seed) + (options.l2 == "cold" ? " --cold-l2" : "");
  for (const auto& [name, permutation] : orders) {
    const std::filesystem::path file = folder / (name + ".npy");
    write_npy(file, permutations_to_npy(permutation, workload.mask.heads(), workload.mask.q_blocks()));
    command += " --perm " + quoted(name + "=" + file.string());
  }
  const std::filesystem::path errors = folder / "stderr.txt";
  const auto [status, output] = run_command(command + " 2>" + quoted(errors.string()));
  std::vector<nlohmann::json> rows;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line.front() == '{') rows.push_back(nlohmann::json::parse(line, nullptr, false));
  if (status != 0) {
    std::ifstream text(errors);
    std::string last, line;
    while (std::getline(text, line))
      if (!line.empty()) last = line;
    *failure = options.python + " -m wavealign.bench exited " + std::to_string(status) + (last.empty() ? "" : ": " + last);
  }
  std::filesystem::remove_all(folder);
  return rows;
}

std::string cell(double value, const char* pattern) {
  if (value < 0) return "-";
  char text[32];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

nlohmann::json number_or_null(double value) { return value < 0 ? nlohmann::json() : nlohmann::json(value); }

int run_bench(const BenchOptions& options) {
  WA_CHECK_ARG(options.head_dim == 64 || options.head_dim == 128, "--head-dim", "must be 64 or 128, got ",
               options.head_dim);
  if (!options.order.empty()) enum_flag<Order>("--order", options.order);
  const GpuModel gpu = gpu_model(enum_flag<GpuPreset>("--gpu", options.gpu));
  profile_option(options.profile, gpu.preset);  // a bad --profile is named here, not by the simulate it runs
  Progress progress;
  progress.stage("building the workload");
  const Workload workload = make_workload(options.workload, gpu.default_block);
  progress.stage("predicting with wavealign simulate");
  const Prediction prediction = predict(options);
  const std::string order = prediction.recommended;

  // The original order and the compared one, as permutations [H, MB] (the plan's skip is off: every head runs
  // in that order).
  const int heads = workload.mask.heads(), q_blocks = workload.mask.q_blocks();
  std::vector<std::pair<std::string, std::vector<int32_t>>> orders(1, {"original", std::vector<int32_t>()});
  if (order != "original") orders.emplace_back(order, std::vector<int32_t>());

  std::string device_reason;
  std::string device_name;
  std::vector<double> measured(orders.size(), -1), measured_int8;
  const bool int8 = options.precision == "int8";
#if defined(WAVEALIGN_HAS_CUDA)
  if (const auto properties = local_gpu(&device_reason)) {
    device_name = std::string(properties->name) + " (" + std::to_string(properties->multiProcessorCount) + " SMs)";
    std::vector<Schedule> schedules{original_schedule(heads, q_blocks, HeadOrder::kSequential)};
    orders[0].second.resize(size_t(heads) * q_blocks);
    for (size_t r = 0; r < orders[0].second.size(); ++r) orders[0].second[r] = int32_t(r % q_blocks);
    if (order != "original") {
      PlanConfig config;
      config.order = from_string<Order>(order);
      config.gpu = gpu.preset;
      config.wave_size = options.wave_size;
      config.iterations = options.iterations;
      config.seed = options.workload.seed;
      config.skip = SkipPolicy::kNever;
      const Plan plan = make_plan(workload.mask, config);
      orders[1].second = plan.permutations();
      schedules.push_back(make_schedule(plan, HeadOrder::kSequential));
    }
    progress.stage("timing the fused kernel in " + std::to_string(schedules.size()) + " order(s)");
    measured = time_kernel(options, workload, schedules, cuda::Precision::kNative);
    if (int8) {
      progress.stage("timing the 8-bit kernel (quantization included) in " + std::to_string(schedules.size()) +
                     " order(s)");
      measured_int8 = time_kernel(options, workload, schedules, cuda::Precision::kInt8);
    }
  }
#else
  device_reason = "this wavealign was built without its CUDA kernels (nvcc was not found)";
#endif
  const double flops = 4.0 * workload.block * workload.block * options.head_dim * double(workload.mask.nnz());
  std::vector<Row> rows;
  for (size_t k = 0; k < orders.size(); ++k)
    rows.push_back({"wavealign-kernel", orders[k].first, measured[k], measured[k] < 0 ? -1 : flops / measured[k] / 1e9,
                    prediction.predicted_ms(orders[k].first)});
  if (int8 && measured_int8.empty()) measured_int8.assign(orders.size(), -1);
  for (size_t k = 0; k < measured_int8.size(); ++k)
    rows.push_back({"wavealign-int8", orders[k].first, measured_int8[k],
                    measured_int8[k] < 0 ? -1 : flops / measured_int8[k] / 1e9, -1});

  std::vector<nlohmann::json> peers;
  std::string peer_note;
  if (device_name.empty()) {
    peer_note = "FlashAttention-4 / FlexAttention: not run (no GPU)";
  } else if (options.peers == "none") {
    peer_note = "FlashAttention-4 / FlexAttention: not run (--peers none)";
  } else {
    progress.stage("timing FlashAttention-4 and FlexAttention (python3 -m wavealign.bench)");
    peers = run_peers(options, workload, orders, &peer_note);
  }
  progress.finish();
  for (const nlohmann::json& peer : peers)
    if (peer.contains("impl") && peer.contains("ms"))
      rows.push_back({peer["impl"], peer["order"], peer["ms"].get<double>(), peer["tflops"].get<double>(), -1});

  auto original_ms = [&rows](const Row& row) {
    for (const Row& other : rows)
      if (other.impl == row.impl && other.order == "original") return other.ms;
    return -1.0;
  };
  const double predicted_original = prediction.predicted_ms("original");
  if (options.json) {
    nlohmann::json out;
    out["workload"] = workload.description;
    out["device"] = device_name.empty() ? nlohmann::json() : nlohmann::json(device_name);
    if (!device_reason.empty()) out["no_device"] = device_reason;
    out["recommendation"] = prediction.simulation["recommendation"];
    nlohmann::json results = nlohmann::json::array();
    for (const Row& row : rows) {
      const double base = original_ms(row);
      results.push_back({{"impl", row.impl},
                         {"order", row.order},
                         {"ms", number_or_null(row.ms)},
                         {"tflops", number_or_null(row.tflops)},
                         {"speedup", number_or_null(row.ms > 0 && base > 0 ? base / row.ms : -1)},
                         {"predicted_ms", number_or_null(row.predicted_ms)},
                         {"predicted_speedup", number_or_null(row.predicted_ms > 0 && predicted_original > 0
                                                                  ? predicted_original / row.predicted_ms
                                                                  : -1)}});
    }
    out["results"] = results;
    nlohmann::json other = nlohmann::json::array();
    for (const nlohmann::json& peer : peers)
      if (!(peer.contains("impl") && peer.contains("ms"))) other.push_back(peer);
    out["peer_notes"] = other;
    if (!peer_note.empty()) out["peers"] = peer_note;
    std::cout << out.dump(2) << std::endl;
    return 0;
  }

  std::printf("workload: %s, %lld tokens, %d x %d blocks of %d, %d head(s), density %.3f\n",
              workload.description.value("mask", "") == "file" ? ("mask file " + options.workload.mask).c_str()
                                                                 : (options.workload.model + " " +
                                                                    std::to_string(options.workload.frames) +
                                                                    " frames, " + options.workload.mask + " mask")
                                                                       .c_str(),
              static_cast<long long>(workload.tokens), workload.mask.q_blocks(), workload.mask.kv_blocks(),
              workload.block, workload.mask.heads(), workload.mask.density());
  if (device_name.empty())
    std::printf("device: none: %s; the simulator's prediction only (--gpu %s model)\n", device_reason.c_str(),
                options.gpu.c_str());
  else
    std::printf("device: %s; bf16%s, head_dim %d, %s L2, %.0f ms of warm-up, median of %d\n", device_name.c_str(),
                int8 ? " inputs (wavealign-int8: INT8 Q K^T, FP8 P V, quantization included)" : "", options.head_dim, options.l2.c_str(), options.warmup_ms, options.iters);
  std::printf("order: %s (%s)\n\n", order.c_str(),
              options.order.empty() ? "recommended by wavealign simulate" : "--order");
  std::printf("%-20s %-10s %10s %8s %12s %14s %16s\n", "impl", "order", "ms", "TF/s", "vs original", "simulated ms",
              "sim. speedup");
  for (const Row& row : rows) {
    const double base = original_ms(row);
    std::printf("%-20s %-10s %10s %8s %12s %14s %16s\n", row.impl.c_str(), row.order.c_str(),
                cell(row.ms, "%.3f").c_str(), cell(row.tflops, "%.0f").c_str(),
                cell(row.ms > 0 && base > 0 ? base / row.ms : -1, "%.3fx").c_str(),
                cell(row.predicted_ms, "%.3f").c_str(),
                cell(row.predicted_ms > 0 && predicted_original > 0 ? predicted_original / row.predicted_ms : -1,
                     "%.3fx")
                    .c_str());
  }
  for (const nlohmann::json& peer : peers)
    if (peer.contains("skipped")) std::printf("%s: not run: %s\n", peer["skipped"].get<std::string>().c_str(),
                                              peer.value("reason", "").c_str());
  if (!peer_note.empty()) std::printf("%s\n", peer_note.c_str());
  std::printf("\nms: the median kernel time measured with CUDA events; TF/s: 4 x %d x %d x head_dim x nnz blocks / "
              "time; simulated ms, sim. speedup: the simulator's kernel time on the --gpu model with every head in "
              "the row's order (pred. ms of wavealign simulate) and the original order's over it\n",
              workload.block, workload.block);
  std::printf("%s\n", prediction.simulation["recommendation"].value("text", "").c_str());
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench", "time the fused kernel on a mask in the original and the recommended row order on this GPU, next to "
               "the simulator's prediction (and FlashAttention-4 / FlexAttention where installed)");
  add_workload_options(*command, options->workload);
  command->add_option("--gpu", options->gpu, "GPU preset of the prediction: h100, h200, a40")->capture_default_str();
  command->add_option("--order", options->order,
                      "row order to compare with the original (default: the one `simulate` recommends)");
  add_wave_size_option(*command, options->wave_size);
  add_iterations_option(*command, options->iterations);
  add_plan_reuse_option(*command, options->plan_reuse, "attention calls that share one plan (the recommendation)");
  command->add_option("--plan-cost", options->plan_cost,
                      "plan cost of the recommendation, as in simulate: gpu, cpu or a time in ms per head")
      ->capture_default_str()
      ->check(word_or_number({"gpu", "cpu"}, {0, std::numeric_limits<double>::infinity()}));
  add_profile_option(*command, options->profile,
                     "skip profile of the recommendation, as in simulate (default: the built-in profile of --gpu)");
  command->add_option("--head-dim", options->head_dim, "head dimension of the random Q, K, V: 64 or 128")
      ->capture_default_str()
      ->check(integer_in(1));
  command->add_option("--warmup-ms", options->warmup_ms,
                      "warm-up kernel time before each timing (the GPU's steady, power-capped clock)")
      ->capture_default_str()
      ->check(number_in({0, std::numeric_limits<double>::infinity(), false, false}));
  command->add_option("--iters", options->iters, "timed launches; the median is reported")
      ->capture_default_str()
      ->check(integer_in(1));
  command->add_option("--l2", options->l2, "cold (flush L2 before each launch) or warm")
      ->capture_default_str()
      ->check(CLI::IsMember({"cold", "warm"}));
  command->add_option("--peers", options->peers, "auto (FlashAttention-4 / FlexAttention where installed) or none")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none"}));
  command->add_option("--python", options->python, "interpreter of python3 -m wavealign.bench")
      ->capture_default_str();
  command->add_option("--precision", options->precision,
                      "native (the bf16 kernel) or int8 (also the 8-bit kernel, INT8 Q K^T and FP8 P V, its "
                      "quantization of Q, K, V included in the time)")
      ->capture_default_str()
      ->check(CLI::IsMember({"native", "int8"}));
  command->add_flag("--json", options->json, "print one JSON object");
  return [options] { return run_bench(*options); };
}

}  // namespace wavealign::cli
