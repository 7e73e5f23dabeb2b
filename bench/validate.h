#pragma once
// The validation contract of `kb_nano kernels` (DESIGN.md, "Validation contract"): what a candidate must
// survive before its time means anything. Every check runs on the case's device (CPU ops too, which is how
// CI tests the harness without a GPU) and names what failed:
//
//   tolerance     outputs within the op's tolerance of the baseline's (per dtype; exact for copies and
//                 integer results), and of the reference oracle's on the first seed's inputs when the case
//                 fits the CPU oracle;
//   precision     mean error against the oracle at most 2x the baseline's (or a quarter of the tolerance),
//                 so a kernel that quietly computes in lower precision fails even inside the tolerance;
//   inputs        several seeds and value distributions: normal, large (x64), outliers, sparse (zero rows);
//   unwritten     outputs come from poisoned memory (NaN / -1) and every element must be written by the
//                 time the op's stream reaches the end of the call;
//   guards        canaries around every buffer allocated during the call and around the inputs intact;
//   immutable     inputs the op does not declare mutable are bit-identical after the call;
//   fresh output  a second call may not reuse or overwrite the first call's output (the caller holds it),
//                 and new values written into the same input buffers must give new, correct outputs;
//   determinism   two calls on identical inputs give bit-identical outputs.
//
// After timing, `verify_timed_call` re-checks one more call made exactly like the timed ones.
#include <string>
#include <vector>

#include "bench/cases.h"
#include "kbn/compare.h"
#include "kbn/registry.h"

namespace kbn::bench {

struct ValidationOptions {
  int seeds = 3;
  // Inputs larger than this get only the normal distribution (the others are drawn on the host).
  int64_t max_distribution_bytes = int64_t(64) << 20;
  bool check_oracle = true;
};

struct Validation {
  bool pass = true;
  std::string check;   // the first failed check ("tolerance", "unwritten", ...) or "" when passing
  std::string reason;  // what was seen, with numbers
  int runs = 0;        // candidate calls made
  int oracle_runs = 0;
  double worst_mean_rel_err = 0;  // candidate vs baseline over all runs
  std::string summary() const;    // "PASS (12 runs, oracle 4)" / "FAIL unwritten: ..."
};

// NOTE: the CPU oracle accumulates in double and is single-threaded, so oracle checks stop at 2^20 output
// elements, 3e8 FLOPs and 1.1 GiB of inputs (about a second of CPU per call at most).
bool fits_cpu_oracle(const BenchCase& c);

// The declared tolerance of `entry`'s outputs in `dtype`.
Tolerance tolerance_for(const OpEntry& entry, DType dtype);

// `baseline` and `candidate` are built from the same OpArgs and weights on the case's device; `oracle`
// (may be null) is the baseline op on the CPU with the same weights.
Validation validate_candidate(const BenchCase& c, const OpEntry& entry, AnyOp& baseline, AnyOp& candidate,
                              AnyOp* oracle, Device device, uint64_t seed, const ValidationOptions& options);

// One more call on `inputs` exactly as the timed loop makes it (no audit, the same buffers), then its
// outputs against the baseline on a copy of the same pre-call inputs. Returns "" or the failure.
std::string verify_timed_call(const OpEntry& entry, AnyOp& baseline, AnyOp& candidate,
                              const std::vector<Tensor>& inputs, DType dtype);

// Value distributions applied to an input set's floating tensors (integer tensors are left alone).
const std::vector<std::string>& distributions();  // {"normal", "large", "outliers", "sparse"}
std::vector<Tensor> apply_distribution(const std::vector<Tensor>& inputs, const std::string& name, uint64_t seed);

}  // namespace kbn::bench
