#pragma once
// The output check run before timing: the op on the GPU against the same registry op on the CPU (which runs
// the kbn::reference oracle), on the same inputs and weights. Only cases small enough for the CPU oracle
// are checked; a FAILing case is not timed.
#include <string>
#include <vector>

#include "bench/cases.h"
#include "kbn/registry.h"

namespace kbn::bench {

enum class CheckStatus { pass, fail, not_checked };
const char* check_status_name(CheckStatus s);  // "PASS", "FAIL", "-"

struct CheckResult {
  CheckStatus status = CheckStatus::not_checked;
  std::string detail;  // the worst output's error, or why the case was not checked
};

// NOTE: the CPU oracle accumulates in double and is single-threaded, so checks stop at 2^20 output
// elements, 3e8 FLOPs and 1.1 GiB of inputs (about a second of CPU per case at most).
bool fits_cpu_oracle(const BenchCase& c);

// Per-dtype tolerance on max |gpu - cpu| relative to max |cpu| (bf16 2e-2, f16 2e-3, f32 1e-4); integer
// outputs must match exactly; a NaN in either output fails.
double relative_tolerance(DType dtype);

// Copies `gpu_inputs` to the CPU, runs `gpu_op` (mutating `gpu_inputs` where the op declares it) and
// `cpu_op`, and compares every output.
CheckResult check_against_cpu(AnyOp& gpu_op, AnyOp& cpu_op, const std::vector<Tensor>& gpu_inputs);

}  // namespace kbn::bench
