#include "bench/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "kbn/allocator.h"
#include "kbn/error.h"
#include "kbn/rng.h"

namespace kbn::bench {

std::string Validation::summary() const {
  if (pass) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "PASS (%d runs, %d vs oracle)", runs, oracle_runs);
    return buf;
  }
  return "FAIL " + check + ": " + reason;
}

bool fits_cpu_oracle(const BenchCase& c) {
  constexpr int64_t kMaxOutputs = int64_t(1) << 20;
  constexpr int64_t kMaxFlops = 300'000'000;
  constexpr int64_t kMaxInputBytes = int64_t(1126) << 20;
  return c.output_numel <= kMaxOutputs && c.flops <= kMaxFlops && c.input_bytes <= kMaxInputBytes;
}

Tolerance tolerance_for(const OpEntry& entry, DType dtype) {
  if (entry.exact_outputs) return {};
  // Two ulps of the output type, relative to each element and to the output's rms (kbn/compare.h): two
  // correct kernels that round once differently stay inside; a lower-precision computation does not.
  switch (dtype) {
    case DType::bf16:
      return {1.6e-2, 1.6e-2, 0};
    case DType::f16:
      return {2e-3, 2e-3, 0};
    default:
      return {1e-4, 1e-4, 0};
  }
}

const std::vector<std::string>& distributions() {
  static const std::vector<std::string> d = {"normal", "large", "outliers", "sparse"};
  return d;
}

std::vector<Tensor> apply_distribution(const std::vector<Tensor>& inputs, const std::string& name, uint64_t seed) {
  const auto& all = distributions();
  KBN_CHECK(std::find(all.begin(), all.end(), name) != all.end(), "bench: unknown input distribution '", name,
            "'; known: normal, large, outliers, sparse");
  if (name == "normal") return inputs;
  std::vector<Tensor> out;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& t = inputs[k];
    if (!t.defined() || !is_floating(t.dtype())) {
      out.push_back(t);
      continue;
    }
    std::vector<float> v = t.to_floats();
    if (name == "large") {
      // A power of two keeps every value's mantissa: only the range changes (f16 tops out at 65504).
      const float scale = t.dtype() == DType::f16 ? 8.0f : 64.0f;
      for (float& x : v) x *= scale;
    } else if (name == "outliers") {
      // About one element in 500 becomes +-(30..100): the tails that break a kernel reducing in 16 bits.
      const uint64_t key = hash_seed(seed, "outliers") + k;
      for (size_t i = 0; i < v.size(); ++i) {
        const Philox4x32 r = philox4x32_10(i, key);
        const float u = u32_to_unit(r.v[0]), w = u32_to_unit(r.v[1]);
        if (u < 0.002f) v[i] = (w < 0.5f ? -1.0f : 1.0f) * (30.0f + 140.0f * std::abs(w - 0.5f));
      }
    } else {  // sparse: every even row of the leading dimension is zero, so rows 0, 2, ... are all zeros
      const int64_t rows = t.dim() >= 2 ? t.size(0) : t.numel();
      const int64_t row = rows ? int64_t(v.size()) / rows : 0;
      for (int64_t r = 0; r < rows; r += 2) std::fill_n(v.begin() + r * row, row, 0.0f);
    }
    out.push_back(Tensor::from_floats(v, t.shape(), t.dtype()).to(t.device()));
  }
  return out;
}

namespace {

std::vector<Tensor> clone_all(const std::vector<Tensor>& v) {
  std::vector<Tensor> out;
  for (const Tensor& t : v) out.push_back(t.defined() ? t.clone() : Tensor());
  return out;
}

bool same_memory(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() && b.storage() && a.storage()->data() == b.storage()->data();
}

bool aliases_any(const Tensor& t, const std::vector<Tensor>& v) {
  return std::any_of(v.begin(), v.end(), [&](const Tensor& u) { return same_memory(t, u); });
}

std::string describe_output(size_t j) { return "output " + std::to_string(j); }

struct Failure {
  std::string check, reason;
  explicit operator bool() const { return !check.empty(); }
};

// The candidate's outputs of one checked call, with a copy of each taken on the op's stream right after it.
struct CheckedCall {
  std::vector<Tensor> outputs;
  std::vector<Tensor> snapshots;
  std::vector<bool> fresh;  // allocated by the call (not an in-place input)
};

Failure compare_outputs(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const Tolerance& tol,
                        const std::string& against, const OpEntry& e, double* worst_rel) {
  if (got.size() != want.size())
    return {"tolerance",
            "returned " + std::to_string(got.size()) + " outputs, the " + against + " " + std::to_string(want.size())};
  for (size_t j = 0; j < got.size(); ++j) {
    if (got[j].shape() != want[j].shape() || got[j].dtype() != want[j].dtype())
      return {"tolerance", describe_output(j) + " is " + got[j].str() + ", the " + against + "'s is " + want[j].str()};
    const Tensor g = got[j].device() == want[j].device() ? got[j] : got[j].to(want[j].device());
    const CompareStats s = compare_close(g, want[j], tol);
    if (worst_rel) *worst_rel = std::max(*worst_rel, s.mean_rel_err());
    if (s.bad) {
      std::string where = s.first_bad >= 0 ? " at " + unravel_index(want[j].shape(), s.first_bad) : "";
      return {"tolerance", describe_output(j) + " vs " + against + ": " + std::to_string(s.bad) + " of " +
                               std::to_string(s.numel) + " elements outside tolerance" + where + " (" +
                               std::to_string(s.actual_at_first_bad) + " vs " +
                               std::to_string(s.expected_at_first_bad) + "; max |err| " +
                               std::to_string(s.max_abs_err) + ", rms " + std::to_string(s.rms_expected()) + ")"};
    }
  }
  return {};
}

// Runs `op` on `inputs` (the candidate's own copies, allocated under an audit) with new allocations
// poisoned and guarded, then checks what the call left behind.
Failure checked_call(const OpEntry& e, AnyOp& op, std::vector<Tensor>& inputs, const std::vector<Tensor>& pristine,
                     Device device, CheckedCall& rec) {
  {
    AllocationAudit audit;
    rec.outputs = op.call(inputs);
  }
  // NOTE: the snapshots are stream-ordered right after the call: they hold what a consumer on the op's
  // stream would read, so work left running on another stream or thread shows up as unwritten.
  for (const Tensor& t : rec.outputs) rec.snapshots.push_back(t.defined() ? t.clone() : Tensor());
  synchronize(device);
  for (size_t j = 0; j < rec.outputs.size(); ++j) {
    const bool fresh = rec.outputs[j].defined() && !aliases_any(rec.outputs[j], inputs);
    rec.fresh.push_back(fresh);
    if (!fresh) continue;
    int64_t first = -1;
    const int64_t n = count_poisoned(rec.snapshots[j], kAuditPoisonByte, &first);
    if (n > 0)
      return {"unwritten", describe_output(j) + ": " + std::to_string(n) + " of " +
                               std::to_string(rec.snapshots[j].numel()) + " elements still hold the poison (first at " +
                               unravel_index(rec.snapshots[j].shape(), first) +
                               ") when the call's stream finished: skipped work, or work left on another stream or "
                               "thread"};
  }
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined()) continue;
    const std::string& name = k < e.args.size() ? e.args[k] : std::to_string(k);
    if (std::find(e.mutates.begin(), e.mutates.end(), name) != e.mutates.end()) continue;
    int64_t first = -1;
    const int64_t n = count_bitwise_mismatches(inputs[k], pristine[k], &first);
    if (n > 0)
      return {"immutable", "input '" + name + "' changed in " + std::to_string(n) + " elements (first at " +
                               unravel_index(inputs[k].shape(), first) + ") but " + e.name +
                               " does not declare it mutable"};
  }
  const auto violations = take_guard_violations();
  if (!violations.empty())
    return {"guards",
            violations[0].describe() +
                (violations.size() > 1 ? " (and " + std::to_string(violations.size() - 1) + " more)" : std::string())};
  return {};
}

// Audited copies of `v`: the harness's inputs get guard zones too, so writes past an in-place input's end
// are caught.
std::vector<Tensor> audited_clones(const std::vector<Tensor>& v) {
  AllocationAudit audit;
  return clone_all(v);
}

}  // namespace

Validation validate_candidate(const BenchCase& c, const OpEntry& entry, AnyOp& baseline, AnyOp& candidate,
                              AnyOp* oracle, Device device, uint64_t seed, const ValidationOptions& o) {
  Validation v;
  const Tolerance tol = tolerance_for(entry, c.dtype);
  auto fail = [&](const Failure& f, const std::string& context) {
    v.pass = false;
    v.check = f.check;
    v.reason = f.reason + (context.empty() ? "" : " [" + context + "]");
    return v;
  };
  (void)take_guard_violations();  // start clean: nothing from earlier cases is blamed on this one

  CheckedCall previous;
  for (int s = 0; s < std::max(1, o.seeds); ++s) {
    const uint64_t run_seed = seed + uint64_t(s) * 1000003u;
    const std::vector<Tensor> base_inputs = c.make_inputs(device, run_seed);
    const bool all_dists = s == 0 && c.input_bytes <= o.max_distribution_bytes;
    for (const std::string& dist : distributions()) {
      if (dist != "normal" && !all_dists) continue;
      const std::string context = "seed " + std::to_string(run_seed) + ", " + dist + " inputs";
      const std::vector<Tensor> pristine = apply_distribution(base_inputs, dist, run_seed);

      std::vector<Tensor> base_in = clone_all(pristine);
      const std::vector<Tensor> want = baseline.call(base_in);
      synchronize(device);

      std::vector<Tensor> cand_in = audited_clones(pristine);
      CheckedCall rec;
      if (auto f = checked_call(entry, candidate, cand_in, pristine, device, rec)) return fail(f, context);
      v.runs++;
      if (auto f = compare_outputs(rec.snapshots, want, tol, "baseline", entry, &v.worst_mean_rel_err))
        return fail(f, context);
      // Declared in-place inputs must end as the baseline leaves them.
      for (size_t k = 0; k < cand_in.size(); ++k) {
        const std::string& name = k < entry.args.size() ? entry.args[k] : "";
        if (!cand_in[k].defined() || std::find(entry.mutates.begin(), entry.mutates.end(), name) == entry.mutates.end())
          continue;
        if (auto f = compare_outputs({cand_in[k]}, {base_in[k]}, tol, "baseline", entry, nullptr))
          return fail({"tolerance", "in-place input '" + name + "': " + f.reason}, context);
      }

      // Fresh output: the previous run's outputs, still held here, are untouched and not handed out again.
      for (size_t j = 0; j < previous.outputs.size(); ++j) {
        if (j >= previous.fresh.size() || !previous.fresh[j]) continue;
        for (size_t i = 0; i < rec.outputs.size(); ++i)
          if (rec.fresh[i] && same_memory(rec.outputs[i], previous.outputs[j]))
            return fail(
                {"fresh output", describe_output(i) + " is the buffer of the previous call's " + describe_output(j) +
                                     ", which the caller still holds (a cached or reused output)"},
                context);
        if (count_bitwise_mismatches(previous.outputs[j], previous.snapshots[j]) > 0)
          return fail({"fresh output", "this call overwrote the previous call's " + describe_output(j) +
                                           ", which the caller still holds"},
                      context);
      }

      // NOTE: the oracle runs on the first seed's inputs (every distribution): it is single-threaded double
      // precision on the host, and the other seeds are already held to the baseline.
      if (oracle && o.check_oracle && s == 0) {
        std::vector<Tensor> cpu_in;
        // The oracle gets its own copies (Tensor::to returns the tensor itself when it is already on the CPU).
        for (const Tensor& t : pristine)
          cpu_in.push_back(!t.defined() ? Tensor() : t.is_cpu() ? t.clone() : t.to(Device::cpu()));
        const std::vector<Tensor> truth = oracle->call(cpu_in);
        double cand_rel = 0, base_rel = 0;
        if (auto f = compare_outputs(rec.snapshots, truth, tol, "oracle", entry, &cand_rel)) return fail(f, context);
        (void)compare_outputs(want, truth, Tolerance{1e30, 1e30, 0}, "oracle", entry, &base_rel);
        v.oracle_runs++;
        const double budget = std::max(2.0 * base_rel, 0.25 * tol.rtol);
        if (!tol.exact() && cand_rel > budget) {
          char buf[200];
          std::snprintf(buf, sizeof buf,
                        "mean relative error vs the oracle %.3g, the baseline's %.3g (allowed: %.3g): computed in "
                        "lower precision than the baseline",
                        cand_rel, base_rel, budget);
          return fail({"precision", buf}, context);
        }
      }

      if (s == 0 && dist == "normal") {
        const std::vector<Tensor> first_snapshots = rec.snapshots;
        // New values written into the same input buffers (and the old outputs scrambled) must give new,
        // correct outputs: a cache keyed on pointers or shapes returns the old result.
        const std::vector<Tensor> fresh_values = c.make_inputs(device, run_seed ^ 0x5eedf00dULL);
        for (size_t k = 0; k < cand_in.size(); ++k)
          if (cand_in[k].defined()) cand_in[k].copy_(fresh_values[k]);
        for (size_t j = 0; j < rec.outputs.size(); ++j)
          if (rec.fresh[j]) rec.outputs[j].fill_(is_floating(rec.outputs[j].dtype()) ? NAN : -1.0);
        std::vector<Tensor> fresh_base_in = clone_all(fresh_values);
        const std::vector<Tensor> fresh_want = baseline.call(fresh_base_in);
        const std::vector<Tensor> fresh_got = candidate.call(cand_in);
        synchronize(device);
        v.runs++;
        if (auto f = compare_outputs(fresh_got, fresh_want, tol, "baseline", entry, nullptr))
          return fail({"fresh output", "after new values were written into the same input buffers: " + f.reason},
                      context);
        rec = CheckedCall{};  // its outputs were scrambled on purpose; do not hold them against the next run
        // Determinism: identical inputs, bit-identical outputs.
        std::vector<Tensor> again_in = clone_all(pristine);
        const std::vector<Tensor> again = candidate.call(again_in);
        synchronize(device);
        v.runs++;
        for (size_t j = 0; j < again.size() && j < first_snapshots.size(); ++j) {
          int64_t first = -1;
          const int64_t n = count_bitwise_mismatches(again[j], first_snapshots[j], &first);
          if (n > 0)
            return fail({"determinism", describe_output(j) + " differs between two calls on identical inputs in " +
                                            std::to_string(n) + " elements (first at " +
                                            unravel_index(again[j].shape(), first) + ")"},
                        context);
        }
      }
      previous = std::move(rec);
    }
  }
  const auto late = take_guard_violations();
  if (!late.empty()) return fail({"guards", late[0].describe()}, "found after the runs");
  return v;
}

std::string verify_timed_call(const OpEntry& entry, AnyOp& baseline, AnyOp& candidate,
                              const std::vector<Tensor>& inputs, DType dtype) {
  const Tolerance tol = tolerance_for(entry, dtype);
  std::vector<Tensor> pre = clone_all(inputs);
  std::vector<Tensor> got = candidate.call(inputs);
  std::vector<Tensor> snap;
  for (const Tensor& t : got) snap.push_back(t.defined() ? t.clone() : Tensor());
  const Device device = inputs.empty() ? Device::cpu() : inputs[0].device();
  synchronize(device);
  const std::vector<Tensor> want = baseline.call(pre);
  synchronize(device);
  if (auto f = compare_outputs(snap, want, tol, "baseline", entry, nullptr))
    return "after timing, a call made like the timed ones: " + f.reason;
  return "";
}

}  // namespace kbn::bench
