// MaskGenerator: host checks, the workspace layout (measured by the same carving sequence that run() uses),
// the cuBLAS handle, and the run: clear the mask, the method (or all ones for force_dense), the record of the
// NaN and inf check, then the CSR.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "methods/reference.h"
#include "methods/rules.h"
#include "common/cuda_check.h"
#include "cuda/masks/mask_kernels.h"
#include "wavealign/error.h"
#include "wavealign/methods.h"

namespace wavealign::cuda {

namespace {

masks::QkLayout resolve(const DeviceQk& qk) {
  masks::QkLayout layout;
  layout.q = static_cast<const uint16_t*>(qk.q);
  layout.k = static_cast<const uint16_t*>(qk.k);
  layout.element_type = qk.element_type;
  layout.batch = qk.batch;
  layout.heads = qk.heads;
  layout.tokens = qk.tokens;
  layout.head_dim = qk.head_dim;
  auto stride_or = [](int64_t stride, int64_t contiguous) { return stride ? stride : contiguous; };
  layout.q_token_stride = stride_or(qk.q_token_stride, qk.head_dim);
  layout.q_head_stride = stride_or(qk.q_head_stride, qk.tokens * layout.q_token_stride);
  layout.q_batch_stride = stride_or(qk.q_batch_stride, qk.heads * layout.q_head_stride);
  layout.k_token_stride = stride_or(qk.k_token_stride, qk.head_dim);
  layout.k_head_stride = stride_or(qk.k_head_stride, qk.tokens * layout.k_token_stride);
  layout.k_batch_stride = stride_or(qk.k_batch_stride, qk.heads * layout.k_head_stride);
  return layout;
}

void run_method(masks::RunContext& context) {
  switch (context.config.method) {
    case MaskMethod::kXAttention: return masks::run_xattention(context);
    case MaskMethod::kSparge: return masks::run_sparge(context);
    case MaskMethod::kMInference: return masks::run_minference(context);
    case MaskMethod::kFlexPrefill: return masks::run_flexprefill(context);
  }
}

// The workspace in carving order: cuBLAS's own region, the CSR scratch, the key of the NaN and inf check,
// then the method's regions.
struct Regions {
  void* blas = nullptr;
  masks::CsrScratch csr;
  unsigned long long* non_finite = nullptr;
};

// The streams and events of MaskGenerator::run. `work` has the device's greatest priority and `side` its
// least, so that the block scheduler dispatches a waiting block of `work` before one of `side`: side work
// (FlexPrefill's K pooling, bound by HBM) then only fills the SM resources that the scoring passes (bound by
// the tensor cores and the exp2s) leave free, and never delays them. Both are non-blocking: a caller on the
// legacy default stream is ordered by the events alone.
struct RunStreams {
  cudaStream_t work = nullptr, side = nullptr;
  cudaEvent_t entry = nullptr, exit = nullptr, fork = nullptr, join = nullptr;
  RunStreams() {
    try {
      int least = 0, greatest = 0;
      WA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      WA_CUDA_CHECK(cudaStreamCreateWithPriority(&work, cudaStreamNonBlocking, greatest));
      WA_CUDA_CHECK(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, least));
      for (cudaEvent_t* event : {&entry, &exit, &fork, &join})
        WA_CUDA_CHECK(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
    } catch (...) {
      release();
      throw;
    }
  }
  RunStreams(const RunStreams&) = delete;
  RunStreams& operator=(const RunStreams&) = delete;
  ~RunStreams() { release(); }

 private:
  void release() {
    for (cudaEvent_t event : {entry, exit, fork, join})
      if (event) cudaEventDestroy(event);
    for (cudaStream_t stream : {work, side})
      if (stream) cudaStreamDestroy(stream);
  }
};

Regions carve_common(masks::WorkspaceCarver& carver, int mask_heads, int blocks) {
  Regions regions;
  regions.blas = carver.take<uint8_t>(masks::kBlasWorkspaceBytes);
  regions.csr = masks::carve_csr_scratch(carver, mask_heads, blocks);
  regions.non_finite = carver.take<unsigned long long>(1);
  return regions;
}

}  // namespace

MaskGenerator::MaskGenerator(const MethodConfig& config, int batch, int heads, int64_t tokens, int head_dim)
    : config_(config), batch_(batch), heads_(heads), tokens_(tokens), head_dim_(head_dim) {
  WA_CHECK_ARG(batch > 0, "batch", "must be > 0, got ", batch);
  WA_CHECK_ARG(heads > 0 && int64_t(batch) * heads <= (int64_t(1) << 30), "heads",
               "must be > 0 (and batch x heads < 2^30), got ", heads);
  check_method_config(config, batch * heads, tokens, head_dim);
  WA_CHECK_ARG(head_dim % 8 == 0 && head_dim <= 256, "head_dim",
               "must be a multiple of 8, at most 256, on the GPU, got ", head_dim);
}

MaskGenerator::~MaskGenerator() {
  if (blas_) cublasDestroy(static_cast<cublasHandle_t>(blas_));
  delete static_cast<RunStreams*>(streams_);
}

int MaskGenerator::q_blocks() const { return blocks_for(tokens_, config_.block); }
int MaskGenerator::kv_blocks() const { return blocks_for(tokens_, config_.block); }

size_t MaskGenerator::workspace_bytes() const {
  masks::WorkspaceCarver carver(nullptr);
  carve_common(carver, mask_heads(), q_blocks());
  if (!config_.force_dense) {
    masks::RunContext context{config_};
    context.qk.batch = batch_;
    context.qk.heads = heads_;
    context.qk.tokens = tokens_;
    context.qk.head_dim = head_dim_;
    context.mask_heads = mask_heads();
    context.blocks = q_blocks();
    context.workspace = &carver;
    context.measuring = true;
    run_method(context);
  }
  return carver.used();
}

void MaskGenerator::run(const DeviceQk& qk, const MaskOutputs& outputs, void* workspace, size_t workspace_size,
                        Stream stream) {
  WA_CHECK_ARG(qk.q != nullptr, "q", "is null");
  WA_CHECK_ARG(qk.k != nullptr, "k", "is null");
  WA_CHECK_ARG(qk.batch == batch_, "batch", "is ", qk.batch, ", the generator was made for ", batch_);
  WA_CHECK_ARG(qk.heads == heads_, "heads", "is ", qk.heads, ", the generator was made for ", heads_);
  WA_CHECK_ARG(qk.tokens == tokens_, "tokens", "is ", qk.tokens, ", the generator was made for ", tokens_);
  WA_CHECK_ARG(qk.head_dim == head_dim_, "head_dim", "is ", qk.head_dim, ", the generator was made for ", head_dim_);
  const masks::QkLayout layout = resolve(qk);
  WA_CHECK_ARG(layout.q_token_stride >= head_dim_, "q", "token stride ", layout.q_token_stride, " < head_dim ",
               head_dim_);
  WA_CHECK_ARG(layout.k_token_stride >= head_dim_, "k", "token stride ", layout.k_token_stride, " < head_dim ",
               head_dim_);
  WA_CHECK_ARG(outputs.dense != nullptr, "dense", "is null (the dense mask is required)");
  WA_CHECK_ARG(outputs.error != nullptr, "error", "is null (the record of the inputs' NaN and inf check is required)");
  WA_CHECK_ARG((outputs.row_ptr == nullptr) == (outputs.col_idx == nullptr), outputs.row_ptr ? "col_idx" : "row_ptr",
               "row_ptr and col_idx are set together or not at all");
  WA_CHECK_ARG(outputs.row_ptr == nullptr || outputs.col_capacity > 0, "col_capacity", "must be > 0, got ",
               outputs.col_capacity);
  const size_t needed = workspace_bytes();
  WA_CHECK_ARG(workspace != nullptr && workspace_size >= needed, "workspace", "has ", workspace_size,
               " bytes, the generator needs ", needed);

  const cudaStream_t caller_stream = reinterpret_cast<cudaStream_t>(stream);
  if (!blas_) {
    cublasHandle_t handle = nullptr;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate failed");
    blas_ = handle;
  }
  const auto blas = static_cast<cublasHandle_t>(blas_);
  if (!streams_) streams_ = new RunStreams();
  const RunStreams& streams = *static_cast<RunStreams*>(streams_);
  // The caller's earlier work first; everything below on the run's own stream, joined back at the end.
  WA_CUDA_CHECK(cudaEventRecord(streams.entry, caller_stream));
  WA_CUDA_CHECK(cudaStreamWaitEvent(streams.work, streams.entry, 0));
  const cudaStream_t cuda_stream = streams.work;
  masks::WorkspaceCarver carver(workspace);
  const Regions regions = carve_common(carver, mask_heads(), q_blocks());
  if (cublasSetStream(blas, cuda_stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(blas, regions.blas, masks::kBlasWorkspaceBytes) != CUBLAS_STATUS_SUCCESS)
    throw Error("cublasSetStream / cublasSetWorkspace failed");

  const int blocks = q_blocks();
  const int64_t entries = int64_t(mask_heads()) * blocks * blocks;
  static_assert(sizeof(unsigned long long) == sizeof(methods::kAllFinite));
  WA_CUDA_CHECK(cudaMemsetAsync(regions.non_finite, 0xFF, sizeof(unsigned long long), cuda_stream));
  if (config_.force_dense) {
    masks::launch_fill_ones(outputs.dense, entries, cuda_stream);
  } else {
    WA_CUDA_CHECK(cudaMemsetAsync(outputs.dense, 0, size_t(entries), cuda_stream));
    masks::RunContext context{config_};
    context.qk = layout;
    context.mask_heads = mask_heads();
    context.blocks = blocks;
    context.scale = methods::softmax_scale(config_, head_dim_);
    context.dense = outputs.dense;
    context.blas = blas;
    context.stream = cuda_stream;
    context.side_stream = streams.side;
    context.fork_event = streams.fork;
    context.join_event = streams.join;
    context.workspace = &carver;
    context.non_finite = regions.non_finite;
    run_method(context);
  }
  masks::launch_finite_record(layout, mask_heads(), regions.non_finite, outputs.dense, entries, outputs.error,
                              cuda_stream);
  if (outputs.row_ptr) {
    masks::check_csr_scratch(regions.csr, mask_heads(), blocks);
    masks::launch_csr(outputs.dense, mask_heads(), blocks, regions.csr, outputs.row_ptr, outputs.col_idx,
                      outputs.col_capacity, cuda_stream);
  }
  WA_CUDA_CHECK(cudaEventRecord(streams.exit, cuda_stream));
  WA_CUDA_CHECK(cudaStreamWaitEvent(caller_stream, streams.exit, 0));
}

namespace masks {

void side_fork(const RunContext& context) {
  WA_CUDA_CHECK(cudaEventRecord(context.fork_event, context.stream));
  WA_CUDA_CHECK(cudaStreamWaitEvent(context.side_stream, context.fork_event, 0));
}

void side_join(const RunContext& context) {
  WA_CUDA_CHECK(cudaEventRecord(context.join_event, context.side_stream));
  WA_CUDA_CHECK(cudaStreamWaitEvent(context.stream, context.join_event, 0));
}

}  // namespace masks

bool has_device() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" / "no device" error
    return false;
  }
  return devices > 0;
}

namespace {

// Owning device allocation of the convenience path.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) { WA_CUDA_CHECK(cudaMalloc(&pointer_, bytes > 0 ? bytes : 1)); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { cudaFree(pointer_); }
  void* get() const { return pointer_; }

 private:
  void* pointer_ = nullptr;
};

std::vector<uint16_t> to_16bit(std::span<const float> values, ElementType type) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (type == ElementType::kBf16) {
      const __nv_bfloat16 value = __float2bfloat16_rn(values[i]);
      std::memcpy(&bits[i], &value, 2);
    } else {
      const __half value = __float2half_rn(values[i]);
      std::memcpy(&bits[i], &value, 2);
    }
  }
  return bits;
}

}  // namespace

BlockMask generate_mask(const MethodConfig& config, const HostQk& qk, ElementType element_type) {
  WA_CHECK(has_device(), "no CUDA device is usable");
  MaskGenerator generator(config, 1, qk.heads, qk.tokens, qk.head_dim);
  const size_t values = size_t(qk.heads) * size_t(qk.tokens) * size_t(qk.head_dim);
  WA_CHECK_ARG(qk.q.size() == values, "q", "has ", qk.q.size(), " values, expected heads*tokens*head_dim = ", values);
  WA_CHECK_ARG(qk.k.size() == values, "k", "has ", qk.k.size(), " values, expected heads*tokens*head_dim = ", values);
  const int blocks = generator.q_blocks();
  const size_t entries = size_t(qk.heads) * blocks * blocks;
  DeviceBytes q(values * 2), k(values * 2), dense(entries), error(sizeof(MaskError)),
      workspace(generator.workspace_bytes());
  WA_CUDA_CHECK(cudaMemcpy(q.get(), to_16bit(qk.q, element_type).data(), values * 2, cudaMemcpyHostToDevice));
  WA_CUDA_CHECK(cudaMemcpy(k.get(), to_16bit(qk.k, element_type).data(), values * 2, cudaMemcpyHostToDevice));
  DeviceQk device;
  device.q = q.get();
  device.k = k.get();
  device.element_type = element_type;
  device.heads = qk.heads;
  device.tokens = qk.tokens;
  device.head_dim = qk.head_dim;
  MaskOutputs outputs;
  outputs.dense = static_cast<uint8_t*>(dense.get());
  outputs.error = static_cast<MaskError*>(error.get());
  generator.run(device, outputs, workspace.get(), generator.workspace_bytes(), nullptr);
  MaskError record;
  WA_CUDA_CHECK(cudaMemcpy(&record, error.get(), sizeof(record), cudaMemcpyDeviceToHost));
  if (record.code != int32_t(MaskErrorCode::kNone)) throw_mask_error(record);
  std::vector<uint8_t> host(entries);
  WA_CUDA_CHECK(cudaMemcpy(host.data(), dense.get(), entries, cudaMemcpyDeviceToHost));
  return BlockMask::from_dense(host, qk.heads, blocks, blocks);
}

}  // namespace wavealign::cuda
