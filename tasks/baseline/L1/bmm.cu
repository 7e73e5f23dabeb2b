#include "L1/bmm.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "kbn/checks.h"
#include "reference/reference.h"
#ifdef KBN_WITH_CUDA
#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "kbn/allocator.h"
#include "kbn/cuda_check.h"
#include "kbn/cuda_dispatch.cuh"
#endif

namespace kbn::KBN_VARIANT {

#ifdef KBN_WITH_CUDA
namespace {

// ---- kernel layer: one cuBLASLt strided-batched GEMM with per-shape plans ----
//
// cuBLAS is column-major. For each batch b, row-major out_b[M, N] with row stride ldo is column-major out_b^T
// (N x M, ld ldo); row-major x_b[M, K] with row stride ldx is column-major x_b^T (K x M, ld ldx); row-major
// weight_b[N, K] (contiguous) is column-major weight_b^T (K x N, ld K). So out_b^T = op(A_b) * B_b with
// A_b = weight_b^T stored (K x N), op(A) = transpose, B_b = x_b^T: Linear's GEMM per batch. The batch walks each
// operand by its own element stride: weight N * K, x sx0, out so0 (the per-head views of MLA interleave heads
// within a token's row, so a batch stride may be smaller than a matrix; cuBLASLt only needs the batches' elements
// to be where the strides say).

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct BmmShape {
  int64_t batch, m, n, k;
  int64_t ldx, sx;  // x: row stride, batch stride (elements)
  int64_t ldo, so;  // out: row stride, batch stride (elements)
  DType dtype;
};

// The shape in words, for error messages.
std::string shape_words(const BmmShape& s) {
  return detail::concat("out[", s.batch, ", ", s.m, ", ", s.n, "] (batch stride ", s.so, ", row stride ", s.ldo,
                        ") = x[", s.batch, ", ", s.m, ", ", s.k, "] (batch stride ", s.sx, ", row stride ", s.ldx,
                        ") @ weight[", s.batch, ", ", s.n, ", ", s.k, "]^T in ", dtype_name(s.dtype));
}

void check_cublas(cublasStatus_t status, const char* call, const BmmShape& s) {
  KBN_CHECK(status == CUBLAS_STATUS_SUCCESS, "bmm: ", call, " failed with ", cublasLtGetStatusName(status), " (",
            cublasLtGetStatusString(status), ") for ", shape_words(s));
}

// Largest power of two (<= 256) dividing v.
uint32_t pow2_divisor(uint64_t v) {
  uint32_t align = 256;
  while (align > 1 && v % align != 0) align >>= 1;
  return align;
}

// The alignment every matrix of a strided-batched operand starts at, and every column of it: the heuristic needs
// the real alignment of each operand (its default assumes 256 bytes; views into wider tensors may be less aligned),
// and batch b's matrix and its columns start at ptr + b * batch_stride + j * ld. A stride that is never stepped
// (one column, one batch) does not count.
uint32_t operand_alignment(const void* p, int64_t ld, int64_t cols, int64_t batch_stride, int64_t batch, size_t elem) {
  uint32_t a = pow2_divisor(reinterpret_cast<uintptr_t>(p));
  if (cols > 1) a = std::min(a, pow2_divisor(uint64_t(ld) * elem));
  if (batch > 1) a = std::min(a, pow2_divisor(uint64_t(batch_stride) * elem));
  return a;
}

struct PlanKey {
  int device;
  DType dtype;
  int64_t batch, m, n, k, ldx, sx, ldo, so;
  uint32_t align_weight, align_x, align_out;
  auto operator<=>(const PlanKey&) const = default;
};

// Everything cuBLASLt needs for one (device, dtype, shape, strides, alignment): descriptors and the heuristic's
// best algorithm. Plans live as long as the process; nothing in them changes per call, so concurrent launches
// share them without a lock.
struct BmmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t weight_layout = nullptr, x_layout = nullptr, out_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// NOTE: handles, plans and workspaces are created once and deliberately never destroyed: destroying them
// from static destructors would race the CUDA runtime's own teardown at exit. Every call pays three map
// searches under one mutex; the heuristic runs only on a key's first call.
class BmmContext {
 public:
  static BmmContext& get() {
    static auto* ctx = new BmmContext();
    return *ctx;
  }

  struct Launch {
    cublasLtHandle_t handle;
    const BmmPlan* plan;
    void* workspace;
  };

  // The handle of the device, the plan of the key (built on first use) and the workspace of the stream.
  // NOTE: one workspace per (device, stream), as PyTorch keeps one per (handle, stream): GEMMs on two streams
  // of one device may run concurrently and must not share scratch memory.
  Launch prepare(const PlanKey& key, const BmmShape& s, Stream stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    cublasLtHandle_t& handle = handles_[key.device];
    if (handle == nullptr) check_cublas(cublasLtCreate(&handle), "cublasLtCreate", s);
    void*& workspace = workspaces_[{key.device, stream}];
    if (workspace == nullptr) workspace = cuda_alloc(kWorkspaceBytes, key.device, stream);
    std::unique_ptr<BmmPlan>& plan = plans_[key];
    if (!plan) plan = make_plan(handle, key, s);
    return {handle, plan.get(), workspace};
  }

 private:
  // A column-major rows x cols layout with leading dimension ld, `batch` of them `batch_stride` elements apart.
  static void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                          int64_t batch, int64_t batch_stride, const char* what, const BmmShape& s) {
    check_cublas(cublasLtMatrixLayoutCreate(layout, type, uint64_t(rows), uint64_t(cols), ld),
                 detail::concat("cublasLtMatrixLayoutCreate(", what, ")").c_str(), s);
    const int32_t count = int32_t(batch);
    check_cublas(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                 detail::concat("cublasLtMatrixLayoutSetAttribute(", what, ", BATCH_COUNT)").c_str(), s);
    const int64_t stride = batch_stride;
    check_cublas(
        cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
        detail::concat("cublasLtMatrixLayoutSetAttribute(", what, ", STRIDED_BATCH_OFFSET)").c_str(), s);
  }

  static std::unique_ptr<BmmPlan> make_plan(cublasLtHandle_t handle, const PlanKey& key, const BmmShape& s) {
    cudaDataType_t type = CUDA_R_32F;
    dispatch_float16_32(s.dtype, "bmm", "x", [&](auto t) {
      using T = decltype(t);
      if constexpr (std::is_same_v<T, __half>)
        type = CUDA_R_16F;
      else if constexpr (std::is_same_v<T, __nv_bfloat16>)
        type = CUDA_R_16BF;
      else
        type = CUDA_R_32F;
    });
    auto plan = std::make_unique<BmmPlan>();
    // fp32 accumulation and fp32 alpha/beta for every dtype (no TF32 for f32 inputs).
    check_cublas(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", s);
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
                 "cublasLtMatmulDescSetAttribute(TRANSA)", s);
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
                 "cublasLtMatmulDescSetAttribute(TRANSB)", s);
    // A = weight^T: K x N, ld K, N * K apart; B = x^T: K x M, ld ldx, sx apart; C = D = out^T: N x M, ld ldo, so apart.
    make_layout(&plan->weight_layout, type, s.k, s.n, s.k, s.batch, s.n * s.k, "weight", s);
    make_layout(&plan->x_layout, type, s.k, s.m, s.ldx, s.batch, s.sx, "x", s);
    make_layout(&plan->out_layout, type, s.n, s.m, s.ldo, s.batch, s.so, "out", s);

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
    KBN_CHECK(returned > 0, "bmm: cublasLtMatmulAlgoGetHeuristic found no algorithm for ", shape_words(s),
              " (operand alignments: weight ", key.align_weight, " B, x ", key.align_x, " B, out ", key.align_out,
              " B)");
    plan->algo = result.algo;
    return plan;
  }

  std::mutex mutex_;
  std::map<int, cublasLtHandle_t> handles_;
  std::map<std::pair<int, Stream>, void*> workspaces_;
  std::map<PlanKey, std::unique_ptr<BmmPlan>> plans_;
};

// out[b] = x[b] @ weight[b]^T for every batch on the current stream. batch, M, N, K > 0.
void launch_bmm(void* out, const void* x, const void* weight, const BmmShape& s, int device, Stream stream) {
  const size_t es = dtype_size(s.dtype);
  const PlanKey key{.device = device,
                    .dtype = s.dtype,
                    .batch = s.batch,
                    .m = s.m,
                    .n = s.n,
                    .k = s.k,
                    .ldx = s.ldx,
                    .sx = s.sx,
                    .ldo = s.ldo,
                    .so = s.so,
                    .align_weight = operand_alignment(weight, s.k, s.n, s.n * s.k, s.batch, es),
                    .align_x = operand_alignment(x, s.ldx, s.m, s.sx, s.batch, es),
                    .align_out = operand_alignment(out, s.ldo, s.m, s.so, s.batch, es)};
  const BmmContext::Launch l = BmmContext::get().prepare(key, s, stream);
  const BmmPlan& plan = *l.plan;
  const float alpha = 1.f, beta = 0.f;
  check_cublas(cublasLtMatmul(l.handle, plan.desc, &alpha, weight, plan.weight_layout, x, plan.x_layout, &beta, out,
                              plan.out_layout, out, plan.out_layout, &plan.algo, l.workspace, kWorkspaceBytes, stream),
               "cublasLtMatmul", s);
}

}  // namespace
#endif  // KBN_WITH_CUDA

// ---- op layer ----

namespace {

// Whether no two elements of t share an address. Sufficient test: taking the dimensions of size > 1 by increasing
// stride, each stride reaches past every element the smaller ones span (a row-major tensor, a per-head view that
// interleaves heads within a token's row, and a slice of columns of a wider tensor all pass).
bool elements_distinct(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // largest offset reached so far, plus one
  for (const auto& [stride, size] : dims) {
    if (stride < span) return false;
    span += (size - 1) * stride;
  }
  return true;
}

}  // namespace

void Bmm::forward(const Tensor& x, const Tensor& weight, const Tensor& out) {
  constexpr const char* op = "bmm";
  check_rank(x, op, "x", 3, "[batch, M, K]");
  check_rank(weight, op, "weight", 3, "[batch, N, K]");
  check_rank(out, op, "out", 3, "[batch, M, N]");
  check_dtype(x, op, "x", {DType::f32, DType::f16, DType::bf16});
  check_same_dtype(x, weight, op, "x", "weight");
  check_same_dtype(x, out, op, "x", "out");
  check_same_device(x, weight, op, "x", "weight");
  check_same_device(x, out, op, "x", "out");
  const int64_t batch = x.size(0), m = x.size(1), k = x.size(2), n = weight.size(1);
  check_size(weight, op, "weight", 0, batch, "batch = x.size(0)");
  check_size(weight, op, "weight", 2, k, "K = x.size(2)");
  check_size(out, op, "out", 0, batch, "batch = x.size(0)");
  check_size(out, op, "out", 1, m, "M = x.size(1)");
  check_size(out, op, "out", 2, n, "N = weight.size(1)");
  check_last_dim_contiguous(x, op, "x");
  check_contiguous(weight, op, "weight");
  check_last_dim_contiguous(out, op, "out");
  KBN_CHECK(k > 0, op, ": argument 'weight' must have K > 0 (dimension 2), got ", weight.str());
  KBN_CHECK(m <= 1 || x.stride(1) >= k, op, ": argument 'x' rows overlap (row stride ", x.stride(1), " below K = ", k,
            "), got ", x.str());
  KBN_CHECK(elements_distinct(out), op,
            ": argument 'out' must not overlap itself (every [b, m, n] its own element), got ", out.str(),
            " with strides [", out.stride(0), ", ", out.stride(1), ", ", out.stride(2), "]");
  KBN_CHECK(batch <= std::numeric_limits<int32_t>::max(), op, ": argument 'x' has more than 2^31 - 1 batches, got ",
            x.str());
  if (batch == 0 || m == 0 || n == 0) return;
  if (x.is_cpu()) {
    // The oracle per batch: Linear's GEMM on each [M, K] x [N, K] pair, its result copied into out's view.
    for (int64_t b = 0; b < batch; ++b) {
      Tensor o = Tensor::empty({m, n}, x.dtype(), x.device());
      reference::linear(o, x.select(0, b).contiguous(), weight.select(0, b), Tensor());
      out.select(0, b).copy_(o);
    }
    return;
  }
#ifdef KBN_WITH_CUDA
  // A stride never stepped (one row, one batch) has no meaningful value; give cuBLAS the tightest legal one, so that
  // such calls share a plan whatever their views say.
  const BmmShape shape{.batch = batch,
                       .m = m,
                       .n = n,
                       .k = k,
                       .ldx = m == 1 ? k : x.stride(1),
                       .sx = batch == 1 ? 0 : x.stride(0),
                       .ldo = m == 1 ? n : out.stride(1),
                       .so = batch == 1 ? 0 : out.stride(0),
                       .dtype = x.dtype()};
  launch_bmm(out.data_ptr(), x.data_ptr(), weight.data_ptr(), shape, x.device().index, current_stream());
#endif
}

}  // namespace kbn::KBN_VARIANT
