// The scoring GEMM of the mask generators on cuBLAS, shape by shape: row-major C[m, n] = A[m, k] B[n, k]^T,
// bf16 inputs, fp32 (or bf16) output, the call src/cuda/masks/blas.cu makes (cublasGemmStridedBatchedEx, one
// batch), then every algorithm cuBLASLt's heuristic offers for the same problem. Why it exists: cuBLAS derives
// the operand alignment from the dimensions, and XAttention's key count at 363,600 tokens (45,450 at S = 8:
// even, not a multiple of 4) sent it to sm_80 mma.sync kernels at a third of the sm_90 kernels' speed
// (docs/methods.md, "The third H200 run"). One JSON line per timing:
//
//   wa_bench_scoring_gemm [--shape M,N,K,LDC]... [--iters 5]
//   (default: XAttention's chunk at 363,600 tokens, S = 8 with 45,450 and with 45,568 keys, and S = 16)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_cuda_check.h"

namespace {

struct Shape {
  long m, n, k, ldc;
};

void check_blas(int status, const char* call) {
  if (status != 0) {
    std::fprintf(stderr, "%s failed with status %d\n", call, status);
    std::exit(1);
  }
}

template <class Call>
float median_ms(Call&& call, int iters) {
  cudaEvent_t start, stop;
  WA_BENCH_CUDA(cudaEventCreate(&start));
  WA_BENCH_CUDA(cudaEventCreate(&stop));
  call();
  std::vector<float> runs;
  for (int i = 0; i < iters; ++i) {
    WA_BENCH_CUDA(cudaEventRecord(start));
    call();
    WA_BENCH_CUDA(cudaEventRecord(stop));
    WA_BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    WA_BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    runs.push_back(ms);
  }
  std::sort(runs.begin(), runs.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return runs[runs.size() / 2];
}

void print_row(const Shape& s, bool fp32_out, const char* api, int algo, int tile, float ms) {
  const double tflop = 2.0 * s.m * s.n * s.k / 1e12;
  std::printf("{\"bench\": \"scoring_gemm\", \"m\": %ld, \"n\": %ld, \"k\": %ld, \"ldc\": %ld, \"out\": \"%s\", "
              "\"api\": \"%s\", \"algo\": %d, \"tile\": %d, \"ms\": %.4f, \"tflops\": %.1f}\n",
              s.m, s.n, s.k, s.ldc, fp32_out ? "fp32" : "bf16", api, algo, tile, ms, tflop / (ms / 1e3));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  int iters = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) {
      Shape s{};
      if (std::sscanf(argv[++i], "%ld,%ld,%ld,%ld", &s.m, &s.n, &s.k, &s.ldc) != 4 || s.m < 1 || s.n < 1 ||
          s.k < 1 || s.ldc < s.n) {
        std::fprintf(stderr, "--shape: expected M,N,K,LDC with LDC >= N >= 1, got '%s'\n", argv[i]);
        return 2;
      }
      shapes.push_back(s);
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
      if (iters < 1) {
        std::fprintf(stderr, "--iters: expected a count >= 1, got '%s'\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: wa_bench_scoring_gemm [--shape M,N,K,LDC]... [--iters N]\n");
      return 2;
    }
  }
  if (shapes.empty()) shapes = {{2944, 45450, 1024, 45452}, {2944, 45568, 1024, 45568}, {5904, 22725, 2048, 22728}};
  size_t a_bytes = 0, b_bytes = 0, c_bytes = 0;
  for (const Shape& s : shapes) {
    a_bytes = std::max(a_bytes, size_t(s.m) * s.k * 2);
    b_bytes = std::max(b_bytes, size_t(s.n) * s.k * 2);
    c_bytes = std::max(c_bytes, size_t(s.m) * s.ldc * 4);
  }
  const size_t workspace_bytes = size_t(32) << 20;  // what the mask generators give cuBLAS
  void *a, *b, *c, *workspace;
  WA_BENCH_CUDA(cudaMalloc(&a, a_bytes));
  WA_BENCH_CUDA(cudaMalloc(&b, b_bytes));
  WA_BENCH_CUDA(cudaMalloc(&c, c_bytes));
  WA_BENCH_CUDA(cudaMalloc(&workspace, workspace_bytes));
  WA_BENCH_CUDA(cudaMemset(a, 0x3c, a_bytes));  // 0x3c3c: a small bf16 value, so no overflow in any shape
  WA_BENCH_CUDA(cudaMemset(b, 0x3c, b_bytes));
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  check_blas(cublasCreate(&blas), "cublasCreate");
  check_blas(cublasSetWorkspace(blas, workspace, workspace_bytes), "cublasSetWorkspace");
  check_blas(cublasLtCreate(&lt), "cublasLtCreate");
  const float alpha = 0.01f, beta = 0.0f;
  for (const Shape& s : shapes) {
    for (const bool fp32_out : {true, false}) {
      const cudaDataType_t out = fp32_out ? CUDA_R_32F : CUDA_R_16BF;
      // Row-major C = A B^T is the column-major C^T = B A^T: B first, transposed.
      print_row(s, fp32_out, "cublasGemmStridedBatchedEx", -1, -1, median_ms([&] {
        check_blas(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), &alpha, b,
                                              CUDA_R_16BF, int(s.k), 0, a, CUDA_R_16BF, int(s.k), 0, &beta, c, out,
                                              int(s.ldc), 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmStridedBatchedEx");
      }, iters));
      cublasLtMatmulDesc_t op;
      check_blas(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
      const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose);
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep);
      cublasLtMatrixLayout_t layout_b, layout_a, layout_c;
      check_blas(cublasLtMatrixLayoutCreate(&layout_b, CUDA_R_16BF, s.k, s.n, s.k), "cublasLtMatrixLayoutCreate");
      check_blas(cublasLtMatrixLayoutCreate(&layout_a, CUDA_R_16BF, s.k, s.m, s.k), "cublasLtMatrixLayoutCreate");
      check_blas(cublasLtMatrixLayoutCreate(&layout_c, out, s.n, s.m, s.ldc), "cublasLtMatrixLayoutCreate");
      cublasLtMatmulPreference_t preference;
      check_blas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                           sizeof workspace_bytes);
      cublasLtMatmulHeuristicResult_t results[8];
      int found = 0;
      check_blas(cublasLtMatmulAlgoGetHeuristic(lt, op, layout_b, layout_a, layout_c, layout_c, preference, 8, results,
                                                &found),
                 "cublasLtMatmulAlgoGetHeuristic");
      for (int i = 0; i < found; ++i) {
        int algo = 0, tile = 0;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_ID, &algo, sizeof algo, &written);
        cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile,
                                             &written);
        print_row(s, fp32_out, "cublasLtMatmul", algo, tile, median_ms([&] {
          check_blas(cublasLtMatmul(lt, op, &alpha, b, layout_b, a, layout_a, &beta, c, layout_c, c, layout_c,
                                    &results[i].algo, workspace, workspace_bytes, nullptr),
                     "cublasLtMatmul");
        }, iters));
      }
      cublasLtMatmulPreferenceDestroy(preference);
      cublasLtMatrixLayoutDestroy(layout_a);
      cublasLtMatrixLayoutDestroy(layout_b);
      cublasLtMatrixLayoutDestroy(layout_c);
      cublasLtMatmulDescDestroy(op);
    }
  }
  cublasLtDestroy(lt);
  cublasDestroy(blas);
  return 0;
}
