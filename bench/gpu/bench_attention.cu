// Times the block-sparse attention kernel on one configuration: a block mask (random Bernoulli with the
// diagonal kept, or the synthetic video mask of a model preset), random inputs generated on the device, a
// schedule in the requested order. Reports the median of the timed runs (CUDA events around the launch only)
// and the effective rate 4 * Bq * Bk * d * nnz_blocks / time.
//
//   bench_attention [--heads 8] [--tokens 32768 | --model wan2.1-14b --frames 401] [--head-dim 128]
//                   [--block 128] [--dtype bf16|fp16] [--mask random|video] [--density 0.28 | --dense]
//                   [--order original|concurrent-heads|s1|s2|wavealign|shuffled] [--wave-size W]
//                   [--traversal ascending|sawtooth] [--path auto|sm90|sm80] [--warmup 2] [--warmup-ms 0]
//                   [--iters 10] [--cold-l2] [--seed 1] [--json] [--save-mask FILE.npy] [--save-perm FILE.npy]
//                   [--variants default,NAME,...] [--rounds 1] [--precision native|int8]
//
// --precision int8 times the 8-bit path three ways on the same inputs: the whole call ("int8", quantization
// included), the quantization alone ("int8-quantize") and the kernel alone on the quantized operands
// ("int8-kernel"); each line carries "part" and "includes_quantization". The effective rate counts the
// attention's 4 * Bq * Bk * d * nnz_blocks operations in every part (the quantization's own line reads its time).
//
// --json prints one JSON object per run (the fields of bench/results/h200-attention.json); --save-mask and
// --save-perm write the mask (bool [H,MB,NB]) and the plan's permutation (int32 [H,MB]) for the peer benchmark.
//
// --variants times the library's kernel ("default") and tuning variants of it (kernel_variants.h; compiled with
// -DWA_BUILD_KERNEL_VARIANTS=ON) on the same inputs in one call: --rounds rounds, each visiting the variants in
// turn in a rotated order, each visit with its own warm-up; every line then carries "variant" and "round". A
// variant that changes only the load order must give the default's O and LSE bit for bit; the benchmark
// compares them and fails (status 3) if not.
//
// --wave-size sets the plan's wave W (default 0: the H200's 132 slots).
//
// --cold-l2 writes a buffer of twice the L2 size before each timed run, so every run starts with no K/V in
// L2 (the labelled "cold" number); without it consecutive runs reuse whatever the previous one left.
//
// --warmup-ms MS keeps launching untimed warm-up runs after the --warmup count (with the same L2 flush as the
// timed runs) until the warm-up kernels have run MS milliseconds in total. The H200 runs this kernel at its
// 700 W software power cap: the cap engages within ~100 ms of a kernel starting and the SM clock falls from
// 1980 MHz to ~1490-1650 MHz, but the first ~100-300 ms after an idle period still run at boost clocks. A
// short case (a 20 ms kernel x 6 runs) is thus timed partly in that transient (one case read 597 and 689 TF/s
// in two sessions); ~2 s of warm-up puts every timed run in the steady, power-capped state.
//
// The SM clock, board power and the share of time under the power cap are sampled (NVML, every 10 ms) during
// the timed runs only and reported as sm_clock_mhz, power_w and power_capped (null without NVML), next to
// warmup_ms, the warm-up kernel time actually spent.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_cuda_check.h"
#include "cuda/attention/launch.h"
#include "gpu_clock_sampler.h"
#include "kernel_variants.h"
#include "wavealign/attention.h"
#include "wavealign/io.h"
#include "wavealign/mask.h"
#include "wavealign/plan.h"
#include "wavealign/schedule.h"
#include "wavealign/workload.h"

namespace {

using namespace wavealign;
using wavealign::cuda::ElementType;
using wavealign::cuda::KernelPath;

struct Options {
  int heads = 8;
  int64_t tokens = 32768;
  std::string model;  // with frames: tokens from the model preset (and the video mask's shape)
  int frames = 0;
  std::string mask = "random";
  bool json = false;
  std::string save_mask, save_perm;
  std::vector<std::string> variants;  // empty: the library's kernel only, no variant fields in the output
  int rounds = 1;
  int head_dim = 128;
  int block = 128;
  ElementType type = ElementType::kBf16;
  double density = 0.28;
  bool dense = false;
  std::string order = "original";
  int wave_size = 0;  // 0 = the GPU's slots
  Traversal traversal = Traversal::kAscending;
  KernelPath path = KernelPath::kAuto;
  cuda::Precision precision = cuda::Precision::kNative;
  int warmup = 2;
  double warmup_ms = 0;  // warm-up kernel time to reach after the `warmup` runs
  int iters = 10;
  bool cold_l2 = false;
  uint64_t seed = 1;
};

// A duration in milliseconds: finite and >= 0, else an error that names the flag.
double parse_milliseconds(const std::string& flag, const std::string& text) {
  size_t end = 0;
  double value = -1;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (end == 0 || end != text.size() || !std::isfinite(value) || value < 0)
    throw std::invalid_argument(flag + " must be a number of milliseconds >= 0, got '" + text + "'");
  return value;
}

/// "a,b,c" as {"a", "b", "c"}.
std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> names;
  size_t start = 0;
  for (size_t comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1)
    names.push_back(list.substr(start, comma - start));
  names.push_back(list.substr(start));
  return names;
}

/// What --variants names: the library's kernel (variant null) or a tuning variant of it; variants of another
/// configuration than the case runs are left out.
struct Contender {
  std::string name;
  const bench::KernelVariant* variant = nullptr;
  bool quantize = true;  // precision int8: which parts of the call run
  bool attend = true;
};

std::vector<Contender> contenders(const Options& o, const cuda::Support& support) {
  if (o.precision == cuda::Precision::kInt8) {
    if (!o.variants.empty()) throw std::invalid_argument("--variants times the bf16/fp16 kernel's tuning variants");
    return {Contender{"int8", nullptr, true, true}, Contender{"int8-quantize", nullptr, true, false},
            Contender{"int8-kernel", nullptr, false, true}};
  }
  if (o.variants.empty()) return {Contender{"default", nullptr}};
  std::vector<Contender> list;
  for (const std::string& name : o.variants) {
    if (name == "default") {
      list.push_back({name, nullptr});
      continue;
    }
    const auto variants = bench::kernel_variants();
    const auto found = std::find_if(variants.begin(), variants.end(),
                                    [&](const bench::KernelVariant& v) { return name == v.name; });
    if (found == variants.end()) {
      std::string known = "default";
      for (const bench::KernelVariant& v : variants) known += std::string(", ") + v.name;
      throw std::invalid_argument("--variants: no variant '" + name + "' in this build (" + known +
                                  (variants.empty() ? "; configure with -DWA_BUILD_KERNEL_VARIANTS=ON for more" : "") +
                                  ")");
    }
    const std::string kernel = "sm90_tma_wgmma_ws_" + std::string(to_string(found->element)) + "_d" +
                               std::to_string(found->head_dim) + "_b" + std::to_string(found->block) + "x" +
                               std::to_string(found->block);
    if (support.kernel != kernel) {
      // One --variants list serves every case of a run script: a variant of another kernel sits this case out.
      std::fprintf(stderr, "--variants: '%s' is a variant of %s, not of %s: not run\n", name.c_str(), kernel.c_str(),
                   support.kernel.c_str());
      continue;
    }
    list.push_back({name, &*found});
  }
  if (list.empty()) throw std::invalid_argument("--variants: none of them runs this case's kernel " + support.kernel);
  return list;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("missing value for " + flag);
      return argv[++i];
    };
    if (flag == "--heads") o.heads = std::stoi(value());
    else if (flag == "--tokens") o.tokens = std::stoll(value());
    else if (flag == "--model") o.model = value();
    else if (flag == "--frames") o.frames = std::stoi(value());
    else if (flag == "--mask") o.mask = value();
    else if (flag == "--json") o.json = true;
    else if (flag == "--save-mask") o.save_mask = value();
    else if (flag == "--save-perm") o.save_perm = value();
    else if (flag == "--variants") o.variants = split_names(value());
    else if (flag == "--rounds") o.rounds = std::stoi(value());
    else if (flag == "--head-dim") o.head_dim = std::stoi(value());
    else if (flag == "--block") o.block = std::stoi(value());
    else if (flag == "--dtype") o.type = from_string<ElementType>(value());
    else if (flag == "--density") o.density = std::stod(value());
    else if (flag == "--dense") o.dense = true;
    else if (flag == "--order") o.order = value();
    else if (flag == "--wave-size") o.wave_size = std::stoi(value());
    else if (flag == "--traversal") o.traversal = from_string<Traversal>(value());
    else if (flag == "--path") o.path = from_string<KernelPath>(value());
    else if (flag == "--precision") o.precision = from_string<cuda::Precision>(value());
    else if (flag == "--warmup") o.warmup = std::stoi(value());
    else if (flag == "--warmup-ms") o.warmup_ms = parse_milliseconds(flag, value());
    else if (flag == "--iters") o.iters = std::stoi(value());
    else if (flag == "--cold-l2") o.cold_l2 = true;
    else if (flag == "--seed") o.seed = std::stoull(value());
    else throw std::invalid_argument("unknown flag " + flag);
  }
  if (o.iters < 1) throw std::invalid_argument("--iters must be >= 1");
  if (o.warmup < 0) throw std::invalid_argument("--warmup must be >= 0");
  if (!o.model.empty()) o.tokens = video_shape(from_string<ModelPreset>(o.model), o.frames).tokens();
  if (o.mask != "random" && o.mask != "video") throw std::invalid_argument("--mask random|video");
  if (o.mask == "video" && o.model.empty()) throw std::invalid_argument("--mask video needs --model and --frames");
  if (o.rounds < 1) throw std::invalid_argument("--rounds must be >= 1");
  return o;
}

/// Uniform values in [-1.5, 1.5) from a counter hash, stored as bf16/fp16 bits (both are 16-bit).
__global__ void fill_random(uint16_t* out, size_t n, uint64_t seed, bool bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    const float value = (float(x >> 40) / float(1ull << 24) - 0.5f) * 3.f;
    if (bf16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(value);
      out[i] = *reinterpret_cast<const uint16_t*>(&b);
    } else {
      const __half h = __float2half_rn(value);
      out[i] = *reinterpret_cast<const uint16_t*>(&h);
    }
  }
}

// The schedule of `order` and the permutation it came from ([H, MB]; identity for the head orders).
Schedule make_bench_schedule(const Options& o, const BlockMask* mask, int q_blocks, std::vector<int32_t>* permutation) {
  if (o.order == "concurrent-heads" || o.order == "concurrent" || mask == nullptr) {
    if (mask == nullptr && o.order != "original" && o.order != "concurrent-heads" && o.order != "concurrent")
      throw std::invalid_argument("--order " + o.order + " needs a sparse mask");
    Schedule schedule = original_schedule(o.heads, q_blocks, o.order == "original" ? HeadOrder::kSequential
                                                                                   : HeadOrder::kConcurrent);
    permutation->resize(size_t(o.heads) * q_blocks);
    for (size_t r = 0; r < permutation->size(); ++r) (*permutation)[r] = int32_t(r % q_blocks);
    return schedule;
  }
  PlanConfig config;
  config.order = from_string<Order>(o.order);
  config.gpu = GpuPreset::kH200;
  config.seed = o.seed;
  config.wave_size = o.wave_size;
  config.skip = SkipPolicy::kNever;  // the order asked for, on every head: the benchmark compares orders
  const Plan plan = make_plan(*mask, config);
  if (!o.json) std::printf("plan: %.1f ms for %d heads\n", plan.plan_ms, o.heads);
  *permutation = plan.permutations();
  return make_schedule(plan, HeadOrder::kSequential);
}

int run(const Options& o) {
  const int q_blocks = blocks_for(o.tokens, o.block);
  const int kv_blocks = blocks_for(o.tokens, o.block);
  int64_t nnz = int64_t(o.heads) * q_blocks * kv_blocks;
  std::vector<int64_t> row_ptr;
  std::vector<int32_t> col_idx;
  BlockMask mask;
  if (!o.dense) {
    if (o.mask == "video") {
      VideoMaskOptions options;
      options.density = o.density;
      mask = video_mask(video_shape(from_string<ModelPreset>(o.model), o.frames), o.heads, BlockShape{o.block, o.block},
                        options, o.seed);
    } else {
      mask = random_mask(o.heads, q_blocks, kv_blocks, o.density, o.seed);  // the CLI's mask for this seed
    }
    if (!o.save_mask.empty()) write_npy(o.save_mask, mask_to_npy(mask));
    CsrMask csr = mask.to_csr();
    nnz = csr.nnz();
    row_ptr = std::move(csr.row_ptr);
    col_idx = std::move(csr.col_idx);
  }
  std::vector<int32_t> permutation;
  const Schedule schedule = make_bench_schedule(o, o.dense ? nullptr : &mask, q_blocks, &permutation);
  if (!o.save_perm.empty()) write_npy(o.save_perm, permutations_to_npy(permutation, o.heads, q_blocks));

  const size_t elements = size_t(o.heads) * size_t(o.tokens) * size_t(o.head_dim);
  void *q, *k, *v, *out, *workspace, *items, *d_row_ptr = nullptr, *d_col_idx = nullptr;
  float* lse;
  WA_BENCH_CUDA(cudaMalloc(&q, elements * 2));
  WA_BENCH_CUDA(cudaMalloc(&k, elements * 2));
  WA_BENCH_CUDA(cudaMalloc(&v, elements * 2));
  WA_BENCH_CUDA(cudaMalloc(&out, elements * 2));
  WA_BENCH_CUDA(cudaMalloc(&lse, size_t(o.heads) * o.tokens * sizeof(float)));
  const bool bf16 = o.type == ElementType::kBf16;
  fill_random<<<1024, 256>>>(static_cast<uint16_t*>(q), elements, o.seed * 3 + 1, bf16);
  fill_random<<<1024, 256>>>(static_cast<uint16_t*>(k), elements, o.seed * 3 + 2, bf16);
  fill_random<<<1024, 256>>>(static_cast<uint16_t*>(v), elements, o.seed * 3 + 3, bf16);
  WA_BENCH_CUDA(cudaGetLastError());
  if (!o.dense) {
    WA_BENCH_CUDA(cudaMalloc(&d_row_ptr, row_ptr.size() * sizeof(int64_t)));
    WA_BENCH_CUDA(cudaMalloc(&d_col_idx, std::max<size_t>(col_idx.size(), 1) * sizeof(int32_t)));
    WA_BENCH_CUDA(cudaMemcpy(d_row_ptr, row_ptr.data(), row_ptr.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    WA_BENCH_CUDA(cudaMemcpy(d_col_idx, col_idx.data(), col_idx.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  WA_BENCH_CUDA(cudaMalloc(&items, schedule.items.size() * sizeof(ScheduleItem)));
  WA_BENCH_CUDA(cudaMemcpy(items, schedule.items.data(), schedule.items.size() * sizeof(ScheduleItem), cudaMemcpyHostToDevice));

  cuda::SparseAttentionArgs args;
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = out;
  args.lse = lse;
  args.heads = o.heads;
  args.tokens = o.tokens;
  args.head_dim = o.head_dim;
  args.block = BlockShape{o.block, o.block};
  args.element_type = o.type;
  args.dense = o.dense;
  args.row_ptr = static_cast<const int64_t*>(d_row_ptr);
  args.col_idx = static_cast<const int32_t*>(d_col_idx);
  args.schedule = static_cast<const ScheduleItem*>(items);
  args.traversal = o.traversal;
  args.path = o.path;
  args.precision = o.precision;
  const cuda::Support support = cuda::query_support(args);
  if (!support.supported) {
    std::fprintf(stderr, "unsupported: %s\n", support.reason.c_str());
    return 2;
  }
  WA_BENCH_CUDA(cudaMalloc(&workspace, cuda::workspace_bytes(args)));

  int device = 0, l2_bytes = 0;
  WA_BENCH_CUDA(cudaGetDevice(&device));
  WA_BENCH_CUDA(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  void* flush = nullptr;
  const size_t flush_bytes = size_t(l2_bytes) * 2;
  if (o.cold_l2) WA_BENCH_CUDA(cudaMalloc(&flush, flush_bytes));

  cudaStream_t stream;
  WA_BENCH_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  WA_BENCH_CUDA(cudaEventCreate(&start));
  WA_BENCH_CUDA(cudaEventCreate(&stop));
  const std::vector<Contender> runs = contenders(o, support);
  // One launch of `contender` between the events, after the L2 flush (warm-up and timed runs alike); its kernel
  // time in ms.
  int launches = 0;
  auto launch = [&](const Contender& contender) {
    if (o.cold_l2) WA_BENCH_CUDA(cudaMemsetAsync(flush, launches & 0xFF, flush_bytes, stream));
    ++launches;
    WA_BENCH_CUDA(cudaEventRecord(start, stream));
    if (o.precision == cuda::Precision::kInt8) {
      cuda::detail::sparse_attention_int8_parts(args, workspace, stream, contender.quantize, contender.attend);
    } else if (contender.variant == nullptr) {
      cuda::sparse_attention(args, workspace, stream);
    } else {
      cuda::detail::sparse_attention_with(args, workspace, stream, contender.variant->launch);
    }
    WA_BENCH_CUDA(cudaEventRecord(stop, stream));
    WA_BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    WA_BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return ms;
  };
  // Loaded before the warm-up, so opening NVML leaves no idle gap between the warm-up and the timed runs.
  bench::GpuClockSampler sampler;
  char pci_bus_id[32] = "";
  if (cudaDeviceGetPCIBusId(pci_bus_id, sizeof(pci_bus_id), device) != cudaSuccess) pci_bus_id[0] = '\0';
  // O and LSE of the first contender that computes the default's bits, for the others to equal.
  std::vector<char> first_o, first_lse;
  const size_t o_bytes = elements * 2, lse_bytes = size_t(o.heads) * o.tokens * sizeof(float);
  for (int round = 1; round <= o.rounds; ++round) {
    for (size_t visit = 0; visit < runs.size(); ++visit) {
      const Contender& contender = runs[(visit + size_t(round) - 1) % runs.size()];
      double warmup_spent_ms = 0;
      for (int i = 0; i < o.warmup || warmup_spent_ms < o.warmup_ms; ++i) warmup_spent_ms += launch(contender);
      std::vector<float> times;
      sampler.start(unsigned(device), pci_bus_id);
      for (int i = 0; i < o.iters; ++i) times.push_back(launch(contender));
      const bench::GpuClockStats clocks = sampler.stop();
      std::vector<float> sorted = times;
      std::sort(sorted.begin(), sorted.end());
      const float median = sorted[sorted.size() / 2];
      const double flops = 4.0 * o.block * o.block * o.head_dim * double(nnz);
      const double density = double(nnz) / (double(o.heads) * q_blocks * kv_blocks);
      // A statistic NVML could not give (NaN) prints as `missing`: n/a in the text line, null in the JSON line.
      auto format_stat = [](double value, int decimals, const char* missing) {
        if (std::isnan(value)) return std::string(missing);
        char text[32];
        std::snprintf(text, sizeof(text), "%.*f", decimals, value);
        return std::string(text);
      };
      const double clock_mhz = clocks.mean_sm_clock_mhz, power_w = clocks.mean_power_w;
      const double power_capped = clocks.power_capped_fraction;
      char variant_text[160] = "", variant_json[160] = "";
      if (!o.variants.empty()) {
        std::snprintf(variant_text, sizeof(variant_text), "variant=%s round=%d ", contender.name.c_str(), round);
        std::snprintf(variant_json, sizeof(variant_json), "\"variant\": \"%s\", \"round\": %d, ",
                      contender.name.c_str(), round);
      }
      if (o.precision == cuda::Precision::kInt8) {
        std::snprintf(variant_text, sizeof(variant_text), "precision=int8 part=%s ", contender.name.c_str());
        std::snprintf(variant_json, sizeof(variant_json),
                      "\"precision\": \"int8\", \"part\": \"%s\", \"includes_quantization\": %s, ",
                      contender.name.c_str(), contender.quantize ? "true" : "false");
      }
      if (!o.json) std::printf(
          "%skernel=%s dtype=%s heads=%d tokens=%lld d=%d block=%d density=%.4f nnz_blocks=%lld order=%s "
          "traversal=%s l2=%s median_ms=%.3f min_ms=%.3f max_ms=%.3f tflops=%.1f sm_clock_mhz=%s power_w=%s "
          "power_capped=%s warmup_ms=%.1f\n",
          variant_text, support.kernel.c_str(), std::string(to_string(o.type)).c_str(), o.heads,
          static_cast<long long>(o.tokens), o.head_dim, o.block, density, static_cast<long long>(nnz),
          o.dense ? "dense" : o.order.c_str(), std::string(to_string(o.traversal)).c_str(),
          o.cold_l2 ? "cold" : "warm", median, sorted.front(), sorted.back(), flops / (median * 1e-3) / 1e12,
          format_stat(clock_mhz, 0, "n/a").c_str(), format_stat(power_w, 1, "n/a").c_str(),
          format_stat(power_capped, 3, "n/a").c_str(), warmup_spent_ms);

      if (o.json) {
        const std::string order = o.dense ? "dense" : o.order == "concurrent" ? "concurrent-heads" : o.order;
        std::printf(
            "{%s\"impl\": \"wavealign-kernel\", \"kernel\": \"%s\", \"mode\": \"%s\", \"mask\": \"%s\", \"order\": "
            "\"%s%s\", \"tokens\": %lld, \"heads\": %d, \"head_dim\": %d, \"block\": %d, \"dtype\": \"%s\", "
            "\"density\": %.6f, \"nnz_blocks\": %lld, \"l2\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f, "
            "\"sm_clock_mhz\": %s, \"power_w\": %s, \"power_capped\": %s, \"warmup_ms\": %.1f}\n",
            variant_json, support.kernel.c_str(), o.dense ? "dense" : "sparse", o.dense ? "dense" : o.mask.c_str(),
            order.c_str(), o.traversal == Traversal::kSawtooth ? "+sawtooth" : "", static_cast<long long>(o.tokens),
            o.heads, o.head_dim, o.block, std::string(to_string(o.type)).c_str(), density,
            static_cast<long long>(nnz), o.cold_l2 ? "cold" : "warm", median, flops / (median * 1e-3) / 1e12,
            format_stat(clock_mhz, 1, "null").c_str(), format_stat(power_w, 1, "null").c_str(),
            format_stat(power_capped, 3, "null").c_str(), warmup_spent_ms);
      }
      std::fflush(stdout);
      const bool computes_output = contender.attend && (contender.variant == nullptr || contender.variant->same_bits);
      if (runs.size() > 1 && computes_output) {
        std::vector<char> o_host(o_bytes), lse_host(lse_bytes);
        WA_BENCH_CUDA(cudaMemcpy(o_host.data(), out, o_bytes, cudaMemcpyDeviceToHost));
        WA_BENCH_CUDA(cudaMemcpy(lse_host.data(), lse, lse_bytes, cudaMemcpyDeviceToHost));
        if (first_o.empty()) {
          first_o = std::move(o_host);
          first_lse = std::move(lse_host);
        } else if (o_host != first_o || lse_host != first_lse) {
          std::fprintf(stderr, "error: variant %s's O or LSE differs from the default's bits\n",
                       contender.name.c_str());
          return 3;
        }
      }
    }
  }
  // A NaN in the output would make the timing meaningless: check a sample of LSE.
  std::vector<float> lse_host(std::min<size_t>(size_t(o.heads) * o.tokens, 1 << 20));
  WA_BENCH_CUDA(cudaMemcpy(lse_host.data(), lse, lse_host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const size_t nan_count = std::count_if(lse_host.begin(), lse_host.end(), [](float x) { return std::isnan(x); });
  if (nan_count > 0) {
    std::fprintf(stderr, "error: %zu NaN LSE values\n", nan_count);
    return 3;
  }
  for (void* p : {q, k, v, out, static_cast<void*>(lse), workspace, items, d_row_ptr, d_col_idx, flush})
    if (p != nullptr) cudaFree(p);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_attention: %s\n", error.what());
    return 1;
  }
}
