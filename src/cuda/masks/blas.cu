// The scoring products on cuBLAS: 16-bit inputs with fp32 accumulation and output on the tensor cores, and
// plain fp32 products of pooled rows (cuBLAS's default math mode: no TF32). Row-major C = A B^T is the
// column-major product C^T = B A^T, so A and B swap places in the call.
#include <cublas_v2.h>

#include "cuda/masks/mask_kernels.h"
#include "wavealign/error.h"

namespace wavealign::cuda::masks {
namespace {

void check_blas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(detail::concat(call, " failed: ", cublasGetStatusString(status)));
}

}  // namespace

void gemm_16bit_nt(BlasHandle blas, ElementType type, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, int64_t lda, int64_t a_batch, const uint16_t* b, int64_t ldb, int64_t b_batch,
                   float* c, int64_t ldc, int64_t c_batch, int batch) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
  const cudaDataType_t input = type == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
  const float beta = 0;
  check_blas(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, input,
                                        int(ldb), b_batch, a, input, int(lda), a_batch, &beta, c, CUDA_R_32F,
                                        int(ldc), c_batch, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx");
}

void gemm_fp32_nt(BlasHandle blas, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  int64_t a_batch, const float* b, int64_t ldb, int64_t b_batch, float* c, int64_t ldc,
                  int64_t c_batch, int batch) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
  const float beta = 0;
  check_blas(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, int(ldb),
                                       b_batch, a, int(lda), a_batch, &beta, c, int(ldc), c_batch, batch),
             "cublasSgemmStridedBatched");
}

}  // namespace wavealign::cuda::masks
