#pragma once
// The validation contract of `kb_nano kernels` (DESIGN.md, "Validation contract"): what a candidate must
// survive before its time means anything. Under `kb_nano kernels` the op under test runs in a worker process of
// the same binary (bench/runner.h) that holds only its own inputs, drawn there from seeds; outputs come back by
// value and are compared here, where the baseline and the oracle run. Every seed is mixed with the run's secret
// seed. Every check runs on the case's device (CPU ops too, which is how CI tests the harness without a GPU) and
// names what failed:
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
//   determinism   two calls on identical inputs give bit-identical outputs;
//   worker        the worker process answered every request in time (--worker-timeout) and did not crash or
//                 exit: otherwise the case FAILs with what happened (exit status, signal, time limit).
//
// Timing (bench/timing.h) writes new values into each input set before every timed call, and kernels.cpp then
// checks, outside this file:
//   timed outputs       a uniform sample of the timed calls (every call of small cases) and one call made after
//                       timing on fresh values in a buffer the timing used, each against the baseline on the values
//                       it ran on;
//   above the roofline  the median is not faster than the roofline of the case's own shape measured in the same run
//                       (the fastest cuBLASLt algorithm on a GEMM shape, the faster of the copy and read rates for
//                       the bytes, never above the baseline's own fastest run);
//   streams             no device work runs past the timed stream's end (more than the empty iteration's round
//                       trip and 10% of the call).
//
// What PASS cannot mean (known limits, each with the reason):
//   - The candidate's code is linked into the harness's binary. Its static initialisers run in the parent too, and a
//     candidate written to patch the harness's own code or data in memory (at load time, in either process) is not
//     caught: the worker keeps the expected values out of reach, not a determined attack on the harness. Review
//     the candidate's diff for anything that is not a kernel.
//   - Within the worker, the candidate shares the process with the harness code that draws its inputs and picks
//     the sampled timed calls; the expected outputs are never there, but the sample choice and the public input
//     generator are.
//   - Timed calls are verified by sample: a candidate wrong on a few unsampled timed calls out of many is not
//     caught (it gains at most those calls' share of the time). Small cases verify every timed call.
//   - Correctness is checked on the value distributions above and the case's shapes, plus random shapes: an op
//     wrong only on inputs none of them produce (e.g. specific values, denormals, inf) passes.
//   - Tolerances allow two ulps of the output type against the baseline: a kernel that is consistently within
//     them but less accurate than the baseline is caught by the precision check only where the oracle runs
//     (cases that fit the CPU oracle).
//   - Host-side work is not timed on the GPU: work the candidate does on CPU threads between calls is invisible to
//     the GPU clock (fresh values before every call make it useless for precomputing outputs, not impossible).
//   - A block with a router inside (OpEntry::router_inside) is not compared on the rows of tokens whose oracle routing
//     is a near-tie, in a comparison that failed otherwise (the count is in the result): a candidate wrong only on
//     those rows passes that comparison. They are rows of rounding-ambiguous routing, a few in a hundred on random
//     inputs, drawn from secret seeds; every other row, and those rows in comparisons that pass without the exemption,
//     are compared.
//   - A GEMM that beats every cuBLASLt algorithm on its shape by more than the baseline's run-to-run spread is
//     reported "above the roofline" even if honest: a time alone cannot tell it from skipped work. `kb_nano
//     profile` (tensor-pipe utilisation and DRAM bytes from Nsight Compute) is the evidence such a result needs.
//
// What FAIL can mean without a bug (known, rare):
//   - A block with a MoE router (L2 and up: the gate's GEMM inside) decides each token's experts from rounded logits.
//     Where two experts tie within that rounding, two correct implementations can route a token differently and its
//     whole output row disagrees with the oracle's. DeepSeek's routers take f32 logits (router_gemm), and the one
//     FAIL of this kind seen so far (tiny-deepseek-v3 under x64 inputs, session 23) passes since; bf16-logit routers
//     (Mixtral, Qwen3-MoE, gpt-oss, as HF and vLLM route) keep the possibility. A FAIL confined to one token's row of
//     such a block, that the L1 ops pass, is the sign. For blocks that route through topk_softmax (OpEntry::
//     router_inside: Mixtral's, Qwen3-MoE's and gpt-oss's blocks and layers) a comparison that fails asks the oracle
//     for the near-tied tokens of the run's inputs (reference::RoutingTieLog: top_k-th and next logits within 4 ulps)
//     and passes if it passes with those rows exempt; the result says how many rows that took. DeepSeek's
//     grouped_topk (f32 logits) has no such exemption, and nothing below L2 needs one (the L1 routers are given the
//     logits). Without an oracle (cases too large for the CPU) there is no exemption either.
#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/runner.h"
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
  // OpEntry::router_inside: token rows a comparison passed only with exempt (near-tied routing), summed over the
  // comparisons, and the comparisons that needed it.
  int64_t routing_tie_rows = 0;
  int routing_tie_comparisons = 0;
  std::string summary() const;    // "PASS (12 runs, oracle 4)" / "FAIL unwritten: ..."
};

// NOTE: the CPU oracle accumulates in double and is single-threaded, so oracle checks stop at 2^20 output
// elements, 3e8 FLOPs and 1.1 GiB of inputs (about a second of CPU per call at most).
bool fits_cpu_oracle(const BenchCase& c);

// Two ulps of the output type, relative to each element and to the output's rms (kbn/compare.h): two correct kernels
// that round once differently stay inside; a lower-precision computation does not.
Tolerance default_tolerance(DType dtype);
// The declared tolerance of `entry`'s outputs in `dtype`: exact, the op's own, or default_tolerance.
Tolerance tolerance_for(const OpEntry& entry, DType dtype);

// `baseline` is built from the same OpArgs and weights as the op behind `candidate` (in a worker process under
// `kb_nano kernels`, bench/runner.h), on the case's device; `oracle` (may be null) is the baseline op on the CPU
// with the same weights. The candidate is asked first on every input set, so nothing the baseline computes for
// those values exists when it runs.
Validation validate_candidate(const BenchCase& c, const OpEntry& entry, AnyOp& baseline, CandidateRunner& candidate,
                              AnyOp* oracle, Device device, uint64_t seed, const ValidationOptions& options);
// The same with the candidate op in this process (tests).
Validation validate_candidate(const BenchCase& c, const OpEntry& entry, AnyOp& baseline, AnyOp& candidate,
                              AnyOp* oracle, Device device, uint64_t seed, const ValidationOptions& options);

// The sampled timed calls (and the call made after timing) against the baseline on the values each ran on:
// "" or the failure, naming the call.
// `oracle` (null: none) serves the near-tie exemption of ops with a router inside.
std::string verify_timed_samples(const BenchCase& c, const OpEntry& entry, AnyOp& baseline,
                                 const std::vector<TimedSample>& samples, Device device, AnyOp* oracle = nullptr);

// Value distributions applied to an input set's floating tensors (integer tensors are left alone).
const std::vector<std::string>& distributions();  // {"normal", "large", "outliers", "sparse"}
// Inputs k with fixed[k] (OpEntry::fixed_inputs) are passed through unchanged.
std::vector<Tensor> apply_distribution(const std::vector<Tensor>& inputs, const std::string& name, uint64_t seed,
                                       const std::vector<bool>& fixed = {});
// fixed[k]: argument k of `entry` is one of its fixed_inputs.
std::vector<bool> fixed_input_mask(const OpEntry& entry);

}  // namespace kbn::bench
