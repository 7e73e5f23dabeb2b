#include "kbn/cublaslt_linear.h"

#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "kbn/allocator.h"
#include "kbn/cuda_dispatch.cuh"
#include "kbn/error.h"

namespace kbn {
namespace {

// cuBLAS is column-major. Row-major out[M, N] is column-major out^T (N x M, ld N); row-major x[M, K] with
// row stride lda is column-major x^T (K x M, ld lda); row-major weight[N, K] is column-major W^T (K x N,
// ld K). So out^T = op(A) * B with A = weight^T stored (K x N), op(A) = transpose, B = x^T: one GEMM,
// no copies. The bias epilogue adds bias[N] along the rows of out^T, i.e. along each output row.

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// The shape in words, for error messages.
std::string shape_words(const CublasLtLinear& s) {
  return detail::concat("out[", s.m, ", ", s.n, "] = x[", s.m, ", ", s.k, "] (row stride ", s.lda, ") @ weight[", s.n,
                        ", ", s.k, "]^T", s.has_bias ? " + bias" : "", " in ", dtype_name(s.dtype),
                        s.out_dtype != s.dtype ? detail::concat(" to ", dtype_name(s.out_dtype)) : std::string());
}

void check_cublas(cublasStatus_t status, const char* call, const CublasLtLinear& s) {
  KBN_CHECK(status == CUBLAS_STATUS_SUCCESS, s.op, ": ", call, " failed with ", cublasLtGetStatusName(status), " (",
            cublasLtGetStatusString(status), ") for ", shape_words(s));
}

// Largest power of two (<= 256) dividing the address: the heuristic needs the real alignment of every
// operand, since its default assumes 256 bytes and views into wider tensors may be less aligned.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align >>= 1;
  return align;
}

thread_local int tls_sm_count_target = 0;

struct PlanKey {
  int device;
  int sm_target;  // 0: the whole device
  DType dtype, out_dtype;
  int64_t m, n, k, lda;
  bool has_bias;
  uint32_t align_weight, align_x, align_out, align_bias;
  auto operator<=>(const PlanKey&) const = default;
};

cudaDataType_t cuda_type(DType dtype) {
  cudaDataType_t type = CUDA_R_32F;
  dispatch_float16_32(dtype, "cublaslt_linear", "dtype", [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, __half>)
      type = CUDA_R_16F;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
      type = CUDA_R_16BF;
    else
      type = CUDA_R_32F;
  });
  return type;
}

// Everything cuBLASLt needs for one (device, dtype, shape, alignment): descriptors and the heuristic's
// best algorithm. Plans live as long as the process.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t weight_layout = nullptr, x_layout = nullptr, out_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // The bias pointer is an attribute of the shared descriptor: set and launch happen under this lock.
  std::mutex launch_mutex;
};

// NOTE: handles, plans and workspaces are created once and deliberately never destroyed: destroying them
// from static destructors would race the CUDA runtime's own teardown at exit. Every call pays three map
// searches under one mutex (well under a microsecond); the heuristic runs only on a key's first call.
class LinearContext {
 public:
  static LinearContext& get() {
    static auto* ctx = new LinearContext();
    return *ctx;
  }

  struct Launch {
    cublasLtHandle_t handle;
    GemmPlan* plan;
    void* workspace;
  };

  // The handle of the device, the plan of the key (built on first use) and the workspace of the stream.
  // NOTE: one 32 MiB workspace per (device, stream), as PyTorch keeps one per (handle, stream): GEMMs on
  // two streams of one device may run concurrently and must not share scratch memory.
  Launch prepare(const PlanKey& key, const CublasLtLinear& s, const void* bias, Stream stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    cublasLtHandle_t& handle = handles_[key.device];
    if (handle == nullptr) check_cublas(cublasLtCreate(&handle), "cublasLtCreate", s);
    void*& workspace = workspaces_[{key.device, stream}];
    if (workspace == nullptr) workspace = cuda_alloc(kWorkspaceBytes, key.device, stream);
    std::unique_ptr<GemmPlan>& plan = plans_[key];
    if (!plan) plan = make_plan(handle, key, s, bias);
    return {handle, plan.get(), workspace};
  }

 private:
  static std::unique_ptr<GemmPlan> make_plan(cublasLtHandle_t handle, const PlanKey& key, const CublasLtLinear& s,
                                             const void* bias) {
    const cudaDataType_t type = cuda_type(s.dtype), out_type = cuda_type(s.out_dtype);
    auto plan = std::make_unique<GemmPlan>();
    // fp32 accumulation and fp32 alpha/beta for every dtype (no TF32 for f32 inputs).
    check_cublas(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", s);
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
                 "cublasLtMatmulDescSetAttribute(TRANSA)", s);
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
                 "cublasLtMatmulDescSetAttribute(TRANSB)", s);
    if (key.sm_target > 0) {
      const int32_t sms = key.sm_target;
      check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)),
                   "cublasLtMatmulDescSetAttribute(SM_COUNT_TARGET)", s);
    }
    if (s.has_bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      check_cublas(
          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
          "cublasLtMatmulDescSetAttribute(EPILOGUE)", s);
      // The heuristic reads the bias pointer's value to learn its alignment.
      check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                   "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", s);
    }
    check_cublas(cublasLtMatrixLayoutCreate(&plan->weight_layout, type, uint64_t(s.k), uint64_t(s.n), s.k),
                 "cublasLtMatrixLayoutCreate(weight)", s);
    check_cublas(cublasLtMatrixLayoutCreate(&plan->x_layout, type, uint64_t(s.k), uint64_t(s.m), s.lda),
                 "cublasLtMatrixLayoutCreate(x)", s);
    check_cublas(cublasLtMatrixLayoutCreate(&plan->out_layout, out_type, uint64_t(s.n), uint64_t(s.m), s.n),
                 "cublasLtMatrixLayoutCreate(out)", s);

    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", s);
    const uint64_t ws_bytes = kWorkspaceBytes;
    const cublasLtMatmulPreferenceAttributes_t align_attrs[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t align_values[] = {key.align_weight, key.align_x, key.align_out, key.align_out};
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                             sizeof(ws_bytes));
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i)
      st = cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &align_values[i], sizeof(uint32_t));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->weight_layout, plan->x_layout, plan->out_layout,
                                          plan->out_layout, pref, 1, &result, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    check_cublas(st, "cublasLtMatmulAlgoGetHeuristic", s);
    KBN_CHECK(returned > 0, s.op, ": cublasLtMatmulAlgoGetHeuristic found no algorithm for ", shape_words(s),
              " (operand alignments: weight ", key.align_weight, " B, x ", key.align_x, " B, out ", key.align_out,
              " B)");
    plan->algo = result.algo;
    return plan;
  }

  std::mutex mutex_;
  std::map<int, cublasLtHandle_t> handles_;
  std::map<std::pair<int, Stream>, void*> workspaces_;
  std::map<PlanKey, std::unique_ptr<GemmPlan>> plans_;
};

}  // namespace

int cublaslt_sm_count_target() { return tls_sm_count_target; }

CublasLtSmCountTarget::CublasLtSmCountTarget(int sms) : prev_(tls_sm_count_target) {
  KBN_CHECK(sms >= 0, "cuBLASLt SM count target: expected >= 0 (0: the whole device), got ", sms);
  tls_sm_count_target = sms;
}

CublasLtSmCountTarget::~CublasLtSmCountTarget() { tls_sm_count_target = prev_; }

void cublaslt_linear(void* out, const void* x, const void* weight, const void* bias, const CublasLtLinear& s,
                     int device, Stream stream) {
  const PlanKey key{.device = device,
                    .sm_target = tls_sm_count_target,
                    .dtype = s.dtype,
                    .out_dtype = s.out_dtype,
                    .m = s.m,
                    .n = s.n,
                    .k = s.k,
                    .lda = s.lda,
                    .has_bias = s.has_bias,
                    .align_weight = alignment_of(weight),
                    .align_x = alignment_of(x),
                    .align_out = alignment_of(out),
                    .align_bias = s.has_bias ? alignment_of(bias) : 0};
  const LinearContext::Launch l = LinearContext::get().prepare(key, s, bias, stream);
  GemmPlan& plan = *l.plan;
  const float alpha = 1.f, beta = 0.f;
  std::lock_guard<std::mutex> lock(plan.launch_mutex);
  if (s.has_bias)
    check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                 "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", s);
  check_cublas(cublasLtMatmul(l.handle, plan.desc, &alpha, weight, plan.weight_layout, x, plan.x_layout, &beta, out,
                              plan.out_layout, out, plan.out_layout, &plan.algo, l.workspace, kWorkspaceBytes, stream),
               "cublasLtMatmul", s);
}

}  // namespace kbn
