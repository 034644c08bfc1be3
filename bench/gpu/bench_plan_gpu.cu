// Device time of the GPU plan for a full video-DiT layer (default: Wan2.1-14B at 720p, 401 frames: 40 heads x
// 2,841 query blocks, video mask at density 0.28), with the stage breakdown from CUDA events and each stage's
// effective bandwidth (bytes of a single pass over its inputs and outputs / time). One JSON line per input
// form and Stage 1 product kernel. Goal: the whole layer in <= 3 ms. The plan includes the permuted CSR
// (capacity = the layer's nnz, known on the host here), checked against the mask permuted on the host.
//
// --stage1 picks Stage 1's product kernel (tensor: the default, fixed-point input on the integer tensor cores;
// gather: the first design; all (or its older name both): one line per kernel and input form, for comparing
// them in one run). --order times any order with a GPU plan (order_has_gpu_plan: the paper's, com, span); an
// order without Stage 1 prints one line per input form, with "stage1": "none".
//
//   wa_bench_plan_gpu [--heads N] [--frames F] [--density D] [--repeats R] [--order NAME] [--input dense|csr|both]
//                     [--stage1 tensor|gather|all]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bench_cuda_check.h"
#include "wavealign/gpu_plan.h"
#include "wavealign/plan.h"
#include "wavealign/workload.h"

namespace {

using namespace wavealign;

struct Options {
  int heads = 40;
  int frames = 401;  // 101 latent frames x 3,600 tokens = 363,600 tokens = 2,841 blocks of 128
  double density = 0.28;  // video-mask target density
  int repeats = 20;
  Order order = Order::kWaveAlign;
  std::string input = "both";
  std::string stage1 = "all";
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--heads") options.heads = std::stoi(value);
    else if (flag == "--frames") options.frames = std::stoi(value);
    else if (flag == "--density") options.density = std::stod(value);
    else if (flag == "--repeats") options.repeats = std::max(1, std::stoi(value));
    else if (flag == "--order") options.order = from_string<Order>(value);
    else if (flag == "--input") options.input = value;
    else if (flag == "--stage1") options.stage1 = value == "both" ? "all" : value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return options;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

template <class T>
T* device_copy(const std::vector<T>& values) {
  T* data = nullptr;
  WA_BENCH_CUDA(cudaMalloc(&data, std::max<size_t>(values.size(), 1) * sizeof(T)));
  if (!values.empty())
    WA_BENCH_CUDA(cudaMemcpy(data, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  int device = 0;
  cudaDeviceProp properties{};
  WA_BENCH_CUDA(cudaGetDevice(&device));
  WA_BENCH_CUDA(cudaGetDeviceProperties(&properties, device));

  const VideoShape shape = video_shape(ModelPreset::kWan21_14B, options.frames);
  VideoMaskOptions mask_options;
  mask_options.density = options.density;
  const BlockMask mask = video_mask(shape, options.heads, {128, 128}, mask_options, 1);
  const int heads = mask.heads(), rows = mask.q_blocks(), cols = mask.kv_blocks();
  const int64_t total_rows = int64_t(heads) * rows;

  PlanConfig config;
  config.order = options.order;
  config.skip = SkipPolicy::kNever;
  const auto cpu_start = std::chrono::steady_clock::now();
  const Plan cpu = make_plan(mask, config);
  const double cpu_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cpu_start).count();
  const std::vector<int32_t> cpu_permutations = cpu.permutations();

  cuda::GpuPlanner planner(heads, rows, cols, config);
  cudaStream_t stream = nullptr;
  WA_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t workspace_bytes = planner.workspace_bytes();
  void* workspace = nullptr;
  WA_BENCH_CUDA(cudaMalloc(&workspace, workspace_bytes));
  planner.prepare(workspace, workspace_bytes, stream);

  int32_t *permutations = nullptr, *inverses = nullptr;
  ScheduleItem* schedule = nullptr;
  MaskStats* stats = nullptr;
  uint8_t* skip = nullptr;
  MaskError* error = nullptr;
  WA_BENCH_CUDA(cudaMalloc(&error, sizeof(MaskError)));
  WA_BENCH_CUDA(cudaMalloc(&permutations, size_t(total_rows) * sizeof(int32_t)));
  WA_BENCH_CUDA(cudaMalloc(&inverses, size_t(total_rows) * sizeof(int32_t)));
  WA_BENCH_CUDA(cudaMalloc(&schedule, size_t(total_rows) * sizeof(ScheduleItem)));
  WA_BENCH_CUDA(cudaMalloc(&stats, size_t(heads) * sizeof(MaskStats)));
  WA_BENCH_CUDA(cudaMalloc(&skip, size_t(heads)));
  const CsrMask csr = mask.to_csr();
  int64_t* permuted_row_ptr = nullptr;
  int32_t* permuted_col_idx = nullptr;
  WA_BENCH_CUDA(cudaMalloc(&permuted_row_ptr, size_t(total_rows + 1) * sizeof(int64_t)));
  WA_BENCH_CUDA(cudaMalloc(&permuted_col_idx, std::max<size_t>(size_t(csr.nnz()), 1) * sizeof(int32_t)));
  cuda::GpuPlanOutputs outputs{permutations, inverses, schedule, HeadOrder::kSequential, stats, skip, error};
  outputs.permuted_row_ptr = permuted_row_ptr;
  outputs.permuted_col_idx = permuted_col_idx;
  outputs.permuted_col_capacity = std::max<int64_t>(csr.nnz(), 1);

  const double density = mask.density();
  const double row_words = (cols + 63) / 64, col_words = (rows + 63) / 64;
  const double bits_bytes = double(total_rows) * row_words * 8;
  const double bits_t_bytes = double(heads) * cols * col_words * 8;
  const bool stage1 = config.order == Order::kS1 || config.order == Order::kWaveAlign;
  // Rows sorted by a key per row: Stage 1's angles or the index keys of com (one sort) and span (two).
  const int row_sorts = stage1 || config.order == Order::kCom ? 1 : config.order == Order::kSpan ? 2 : 0;

  if (options.stage1 != "all" && options.stage1 != "tensor" && options.stage1 != "gather") {
    std::fprintf(stderr, "--stage1 must be tensor, gather or all\n");
    return 2;
  }
  std::vector<std::string> stage1_paths;  // Stage 1's product kernels to time; "none" without Stage 1
  for (const char* path : {"tensor", "gather"})
    if (stage1 && (options.stage1 == "all" || options.stage1 == path)) stage1_paths.push_back(path);
  if (!stage1) stage1_paths.push_back("none");
  std::vector<std::pair<std::string, std::string>> runs;  // (Stage 1 product kernel, input form)
  for (const std::string& stage1_path : stage1_paths)
    for (const char* form : {"dense", "csr"})
      if (options.input == "both" || options.input == form) runs.emplace_back(stage1_path, form);
  for (const auto& [stage1_path, form] : runs) {
    // Read by every plan() call (src/cuda/plan/plan_kernels.h), the graph below is captured with this kernel.
    if (stage1) setenv("WA_PLAN_STAGE1_PRODUCTS", stage1_path.c_str(), 1);
    cuda::DeviceMask device_mask;
    uint8_t* dense = nullptr;
    int64_t* row_ptr = nullptr;
    int32_t* col_idx = nullptr;
    double input_bytes = 0;
    if (form == "dense") {
      dense = device_copy(mask.to_dense());
      device_mask = DenseMaskView{heads, rows, cols, dense, {int64_t(rows) * cols, cols, 1}};
      input_bytes = double(total_rows) * cols;
    } else {
      row_ptr = device_copy(csr.row_ptr);
      col_idx = device_copy(csr.col_idx);
      device_mask = CsrMaskView{heads, rows, cols, {row_ptr, IndexType::kInt64, int64_t(csr.row_ptr.size()), 1},
                                {col_idx, IndexType::kInt32, int64_t(csr.col_idx.size()), 1}};
      input_bytes = double(csr.row_ptr.size()) * 8 + double(csr.col_idx.size()) * 4;
    }

    for (int warm = 0; warm < 3; ++warm) planner.plan(device_mask, outputs, workspace, stream);
    WA_BENCH_CUDA(cudaStreamSynchronize(stream));

    std::vector<double> total, bitpack, stats_ms, iterations, sorts, schedule_ms, permuted_csr_ms;
    for (int r = 0; r < options.repeats; ++r) {
      const cuda::GpuPlanTimes times = planner.plan_timed(device_mask, outputs, workspace, stream);
      total.push_back(times.total_ms);
      bitpack.push_back(times.bitpack_ms);
      stats_ms.push_back(times.stats_ms);
      iterations.push_back(times.iterations_ms);
      sorts.push_back(times.sorts_ms);
      schedule_ms.push_back(times.schedule_ms);
      permuted_csr_ms.push_back(times.permuted_csr_ms);
    }

    // The same plan replayed from a CUDA graph: no launch overhead between the ~40 kernels.
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    WA_BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    planner.plan(device_mask, outputs, workspace, stream);
    WA_BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
    WA_BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t begin, end;
    WA_BENCH_CUDA(cudaEventCreate(&begin));
    WA_BENCH_CUDA(cudaEventCreate(&end));
    WA_BENCH_CUDA(cudaGraphLaunch(exec, stream));
    std::vector<double> graph_ms;
    for (int r = 0; r < options.repeats; ++r) {
      WA_BENCH_CUDA(cudaEventRecord(begin, stream));
      WA_BENCH_CUDA(cudaGraphLaunch(exec, stream));
      WA_BENCH_CUDA(cudaEventRecord(end, stream));
      WA_BENCH_CUDA(cudaEventSynchronize(end));
      float ms = 0;
      WA_BENCH_CUDA(cudaEventElapsedTime(&ms, begin, end));
      graph_ms.push_back(ms);
    }

    std::vector<int32_t> gpu_permutations(static_cast<size_t>(total_rows), 0);
    WA_BENCH_CUDA(cudaMemcpy(gpu_permutations.data(), permutations, gpu_permutations.size() * sizeof(int32_t),
                             cudaMemcpyDeviceToHost));
    int equal_heads = 0;
    for (int h = 0; h < heads; ++h)
      equal_heads += std::equal(gpu_permutations.begin() + int64_t(h) * rows,
                                gpu_permutations.begin() + int64_t(h + 1) * rows,
                                cpu_permutations.begin() + int64_t(h) * rows);
    // The permuted CSR against the mask permuted on the host by the device's own permutation (so that an angle
    // near-tie between the CPU and GPU plans does not count here).
    const CsrMask expected_csr = mask.permute_rows(gpu_permutations).to_csr();
    std::vector<int64_t> gpu_row_ptr(expected_csr.row_ptr.size());
    std::vector<int32_t> gpu_col_idx(expected_csr.col_idx.size());
    WA_BENCH_CUDA(cudaMemcpy(gpu_row_ptr.data(), permuted_row_ptr, gpu_row_ptr.size() * sizeof(int64_t),
                             cudaMemcpyDeviceToHost));
    if (!gpu_col_idx.empty())
      WA_BENCH_CUDA(cudaMemcpy(gpu_col_idx.data(), permuted_col_idx, gpu_col_idx.size() * sizeof(int32_t),
                               cudaMemcpyDeviceToHost));
    const bool csr_equal = gpu_row_ptr == expected_csr.row_ptr && gpu_col_idx == expected_csr.col_idx;

    // Bytes of one pass over each stage's inputs and outputs (the stage's floor; the kernels read some of it
    // several times through L2).
    const double pack_bytes = input_bytes + bits_bytes + (stage1 ? 2 * bits_t_bytes + bits_bytes : 0);
    const double stats_bytes = 3 * bits_bytes;
    // Without Stage 1 the "iterations" stage holds com's and span's index keys: the bits and row NNZ in, a key
    // and a row index out (span: a second key).
    const double iteration_bytes =
        stage1 ? (config.iterations + 1) * (bits_bytes + bits_t_bytes + 16.0 * (2 * total_rows + heads * cols))
        : row_sorts ? bits_bytes + double(total_rows) * (4 + 12 + (row_sorts - 1) * 8)
                    : 0;
    // Each row sort: 8 radix passes over (8-byte key, 4-byte row) in and out; then the Stage 2 rank sort.
    const double sort_bytes =
        row_sorts ? row_sorts * 2.0 * 12 * total_rows * 8 + 4.0 * 4 * total_rows : 8.0 * total_rows;
    const double schedule_bytes = double(total_rows) * (4 + 4 + 4 + 8);
    // Counts (permutation and row NNZ in, int64 out), the scan (int64 in and out), the columns (permutation,
    // row pointer and the original rows' bits in, 4 bytes per entry out).
    const double permuted_csr_bytes =
        double(total_rows) * ((4 + 4 + 8) + (8 + 8) + (4 + 8)) + bits_bytes + 4.0 * double(csr.nnz());
    auto gbps = [](double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e6) : 0.0; };

    std::printf(
        "{\"device\": \"%s\", \"heads\": %d, \"rows\": %d, \"kv_blocks\": %d, \"density\": %.4f, \"input\": \"%s\", "
        "\"order\": \"%s\", \"stage1\": \"%s\", \"iterations\": %d, \"repeats\": %d, \"plan_ms\": %.4f, \"graph_plan_ms\": %.4f, "
        "\"goal_ms\": 3.0, \"cpu_plan_ms\": %.1f, \"heads_equal_to_cpu\": %d, \"permuted_csr_equal\": %s, "
        "\"workspace_mib\": %.1f, "
        "\"breakdown\": {\"bitpack_ms\": %.4f, \"stats_ms\": %.4f, \"iterations_ms\": %.4f, \"sorts_ms\": %.4f, "
        "\"schedule_ms\": %.4f, \"permuted_csr_ms\": %.4f}, \"bandwidth_gbps\": {\"bitpack\": %.1f, "
        "\"stats\": %.1f, \"iterations\": %.1f, \"sorts\": %.1f, \"schedule\": %.1f, \"permuted_csr\": %.1f}}\n",
        properties.name, heads, rows, cols, density, form.c_str(), std::string(to_string(config.order)).c_str(),
        stage1_path.c_str(),
        config.iterations, options.repeats, median(total), median(graph_ms), cpu_ms, equal_heads,
        csr_equal ? "true" : "false", double(workspace_bytes) / (1 << 20), median(bitpack), median(stats_ms),
        median(iterations), median(sorts), median(schedule_ms), median(permuted_csr_ms),
        gbps(pack_bytes, median(bitpack)), gbps(stats_bytes, median(stats_ms)),
        gbps(iteration_bytes, median(iterations)), gbps(sort_bytes, median(sorts)),
        gbps(schedule_bytes, median(schedule_ms)), gbps(permuted_csr_bytes, median(permuted_csr_ms)));
    std::fflush(stdout);

    WA_BENCH_CUDA(cudaEventDestroy(begin));
    WA_BENCH_CUDA(cudaEventDestroy(end));
    WA_BENCH_CUDA(cudaGraphExecDestroy(exec));
    WA_BENCH_CUDA(cudaGraphDestroy(graph));
    cudaFree(dense);
    cudaFree(row_ptr);
    cudaFree(col_idx);
  }
  cudaFree(permutations);
  cudaFree(inverses);
  cudaFree(schedule);
  cudaFree(stats);
  cudaFree(skip);
  cudaFree(error);
  cudaFree(permuted_row_ptr);
  cudaFree(permuted_col_idx);
  cudaFree(workspace);
  cudaStreamDestroy(stream);
  return 0;
}
