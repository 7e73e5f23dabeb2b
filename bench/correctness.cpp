#include "bench/correctness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kbn/error.h"

namespace kbn::bench {

const char* check_status_name(CheckStatus s) {
  switch (s) {
    case CheckStatus::pass:
      return "PASS";
    case CheckStatus::fail:
      return "FAIL";
    case CheckStatus::not_checked:
      return "-";
  }
  return "?";
}

bool fits_cpu_oracle(const BenchCase& c) {
  constexpr int64_t kMaxOutputs = int64_t(1) << 20;
  constexpr int64_t kMaxFlops = 300'000'000;
  constexpr int64_t kMaxInputBytes = int64_t(1126) << 20;
  return c.output_numel <= kMaxOutputs && c.flops <= kMaxFlops && c.input_bytes <= kMaxInputBytes;
}

double relative_tolerance(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return 2e-2;
    case DType::f16:
      return 2e-3;
    default:
      return 1e-4;
  }
}

namespace {

std::string format_error(size_t index, double err, double ref_max, double tol) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "output %zu: max |gpu - cpu| = %.3g, max |cpu| = %.3g, tolerance %.3g", index, err,
                ref_max, tol * ref_max);
  return buf;
}

// Fills `result` from one output pair; returns false on failure.
bool compare_output(size_t index, const Tensor& gpu, const Tensor& cpu, CheckResult& result) {
  if (gpu.shape() != cpu.shape() || gpu.dtype() != cpu.dtype()) {
    result.detail = "output " + std::to_string(index) + ": GPU gave " + gpu.str() + ", CPU gave " + cpu.str();
    return false;
  }
  if (!is_floating(gpu.dtype())) {
    const auto g = gpu.to_ints(), r = cpu.to_ints();
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] != r[i]) {
        result.detail = "output " + std::to_string(index) + ": element " + std::to_string(i) + " is " +
                        std::to_string(g[i]) + " on the GPU, " + std::to_string(r[i]) + " on the CPU";
        return false;
      }
    }
    result.detail = "output " + std::to_string(index) + ": exact";
    return true;
  }
  const auto g = gpu.to_doubles(), r = cpu.to_doubles();
  double err = 0, ref_max = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) || std::isnan(r[i])) {
      result.detail = "output " + std::to_string(index) + ": NaN at element " + std::to_string(i);
      return false;
    }
    err = std::max(err, std::abs(g[i] - r[i]));
    ref_max = std::max(ref_max, std::abs(r[i]));
  }
  const double tol = relative_tolerance(gpu.dtype());
  result.detail = format_error(index, err, ref_max, tol);
  return err <= tol * ref_max;
}

}  // namespace

CheckResult check_against_cpu(AnyOp& gpu_op, AnyOp& cpu_op, const std::vector<Tensor>& gpu_inputs) {
  std::vector<Tensor> cpu_inputs;
  for (const Tensor& t : gpu_inputs) cpu_inputs.push_back(t.defined() ? t.to(Device::cpu()) : Tensor());
  const std::vector<Tensor> gpu_out = gpu_op.call(gpu_inputs);
  const std::vector<Tensor> cpu_out = cpu_op.call(cpu_inputs);
  CheckResult result;
  result.status = CheckStatus::fail;
  if (gpu_out.size() != cpu_out.size()) {
    result.detail =
        "GPU returned " + std::to_string(gpu_out.size()) + " outputs, CPU " + std::to_string(cpu_out.size());
    return result;
  }
  std::string worst;
  for (size_t i = 0; i < gpu_out.size(); ++i) {
    if (!compare_output(i, gpu_out[i], cpu_out[i], result)) return result;
    worst += (worst.empty() ? "" : "; ") + result.detail;
  }
  result.status = CheckStatus::pass;
  result.detail = worst;
  return result;
}

}  // namespace kbn::bench
