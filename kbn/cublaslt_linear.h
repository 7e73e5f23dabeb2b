#pragma once
// out = x @ weight^T (+ bias) through cuBLASLt, the GEMM of the linear ops (tasks/baseline/L1/linear.cu and
// router_gemm.cu): row-major operands as PyTorch holds them, fp32 accumulation (no TF32 for f32 inputs), the output in
// the operands' dtype or in f32, the heuristic's algorithm cached per (device, dtypes, shape, alignments). It lives in
// the core library, outside the task files a candidate replaces, so that replacing one linear op leaves the others
// their GEMM.
#include <cstdint>

#include "kbn/device.h"
#include "kbn/dtype.h"

namespace kbn {

struct CublasLtLinear {
  int64_t m, n, k, lda;  // out [m, n] contiguous; x [m, k] with row stride lda; weight [n, k] contiguous
  DType dtype;           // x and weight: f32, f16 or bf16
  DType out_dtype;       // out and bias: dtype, or f32
  bool has_bias;
  const char* op;  // the caller, named in errors
};

// The SMs the calling thread's GEMMs aim at (0, the default: the whole device): cuBLASLt's
// CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, which tunes the algorithm choice, and a persistent kernel's grid, for a device
// that concurrent work on another stream shares (the engine's overlapped nano-batches: engine/nano_batch.h). Plans are
// cached per target. The RAII guard sets it for its scope and restores the previous value.
int cublaslt_sm_count_target();
class CublasLtSmCountTarget {
 public:
  explicit CublasLtSmCountTarget(int sms);
  ~CublasLtSmCountTarget();
  CublasLtSmCountTarget(const CublasLtSmCountTarget&) = delete;
  CublasLtSmCountTarget& operator=(const CublasLtSmCountTarget&) = delete;

 private:
  int prev_;
};

// On `stream` (the device's current context); m, n, k > 0; bias: [n] or nullptr.
void cublaslt_linear(void* out, const void* x, const void* weight, const void* bias, const CublasLtLinear& shape,
                     int device, Stream stream);

}  // namespace kbn
