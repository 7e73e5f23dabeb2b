#include "bench/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <set>

#include "kbn/allocator.h"
#include "kbn/error.h"
#include "kbn/rng.h"
#include "reference/reference.h"

namespace kbn::bench {

std::string Validation::summary() const {
  if (pass) {
    char buf[160];
    const int n = std::snprintf(buf, sizeof buf, "PASS (%d runs, %d vs oracle", runs, oracle_runs);
    if (routing_tie_rows > 0)
      std::snprintf(buf + n, sizeof buf - size_t(n), "; %lld near-tied routing rows exempt in %d comparisons)",
                    (long long)routing_tie_rows, routing_tie_comparisons);
    else
      std::snprintf(buf + n, sizeof buf - size_t(n), ")");
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
  if (entry.tolerance) return entry.tolerance(dtype);
  return default_tolerance(dtype);
}

Tolerance default_tolerance(DType dtype) { return dtype_tolerance(dtype); }

const std::vector<std::string>& distributions() {
  static const std::vector<std::string> d = {"normal", "large", "outliers", "sparse"};
  return d;
}

std::vector<bool> fixed_input_mask(const OpEntry& entry) {
  std::vector<bool> m(entry.args.size(), false);
  for (size_t k = 0; k < entry.args.size(); ++k)
    m[k] = std::find(entry.fixed_inputs.begin(), entry.fixed_inputs.end(), entry.args[k]) != entry.fixed_inputs.end();
  return m;
}

std::vector<Tensor> apply_distribution(const std::vector<Tensor>& inputs, const std::string& name, uint64_t seed,
                                       const std::vector<bool>& fixed) {
  const auto& all = distributions();
  KBN_CHECK(std::find(all.begin(), all.end(), name) != all.end(), "bench: unknown input distribution '", name,
            "'; known: normal, large, outliers, sparse");
  if (name == "normal") return inputs;
  std::vector<Tensor> out;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& t = inputs[k];
    if (!t.defined() || !is_floating(t.dtype()) || (k < fixed.size() && fixed[k])) {
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

std::string describe_output(size_t j) { return "output " + std::to_string(j); }

struct Failure {
  std::string check, reason;
  explicit operator bool() const { return !check.empty(); }
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

// The tokens whose routing the oracle finds near-tied on `inputs` (reference::RoutingTieLog), run on CPU copies.
struct TieRows {
  std::set<int64_t> rows;
  int64_t num_rows = 0;  // the routed token count: outputs with this many rows are masked
};

// The oracle's own copies of `inputs` on the CPU (Tensor::to returns the tensor itself when it is already there).
std::vector<Tensor> cpu_copies(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) out.push_back(!t.defined() ? Tensor() : t.is_cpu() ? t.clone() : t.to(Device::cpu()));
  return out;
}

TieRows routing_ties(AnyOp& oracle, const std::vector<Tensor>& inputs) {
  const reference::RoutingTieLog log;
  (void)oracle.call(cpu_copies(inputs));
  return {log.rows(), log.num_rows()};
}

// `got` with the near-tied tokens' rows taken from `want`, in each output whose leading dimension is the token count.
std::vector<Tensor> with_tie_rows(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                                  const TieRows& ties) {
  std::vector<Tensor> out;
  for (size_t j = 0; j < got.size(); ++j) {
    const Tensor& g = got[j];
    if (j >= want.size() || g.shape() != want[j].shape() || g.dtype() != want[j].dtype() || g.dim() < 1 ||
        g.size(0) != ties.num_rows) {
      out.push_back(g);
      continue;
    }
    Tensor m = g.clone();
    const Tensor w = want[j].device() == m.device() ? want[j] : want[j].to(m.device());
    for (int64_t r : ties.rows) m.slice(0, r, r + 1).copy_(w.slice(0, r, r + 1));
    out.push_back(m);
  }
  return out;
}

// The near-tied tokens of one input set, asked of the oracle once and only when a comparison needs them.
class LazyTies {
 public:
  // No oracle, or an op without a router inside: never any.
  LazyTies(AnyOp* oracle, const OpEntry& e, std::vector<Tensor> inputs)
      : oracle_(e.router_inside ? oracle : nullptr), inputs_(std::move(inputs)) {}
  bool possible() const { return oracle_ != nullptr; }
  const TieRows& get() {
    if (!rows_) rows_ = routing_ties(*oracle_, inputs_);
    return *rows_;
  }
  const TieRows* known() const { return rows_ ? &*rows_ : nullptr; }

 private:
  AnyOp* oracle_ = nullptr;
  std::vector<Tensor> inputs_;
  std::optional<TieRows> rows_;
};

// compare_outputs; when it fails for an op with a router inside, again with the near-tied tokens' rows exempt, which
// passes only if every disagreement lies in those rows. worst_rel takes the comparison that decided; `v` counts the
// exemptions.
Failure compare_with_ties(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const Tolerance& tol,
                          const std::string& against, const OpEntry& e, double* worst_rel, LazyTies& ties,
                          Validation& v) {
  double rel = 0;
  Failure f = compare_outputs(got, want, tol, against, e, &rel);
  if (f && ties.possible() && !ties.get().rows.empty()) {
    double masked_rel = 0;
    if (!compare_outputs(with_tie_rows(got, want, ties.get()), want, tol, against, e, &masked_rel)) {
      f = {};
      rel = masked_rel;
      v.routing_tie_rows += int64_t(ties.get().rows.size());
      v.routing_tie_comparisons++;
    }
  }
  if (!f && worst_rel) *worst_rel = std::max(*worst_rel, rel);
  return f;
}

}  // namespace

Validation validate_candidate(const BenchCase& c, const OpEntry& entry, AnyOp& baseline, CandidateRunner& candidate,
                              AnyOp* oracle, Device device, uint64_t seed, const ValidationOptions& o) {
  Validation v;
  const Tolerance tol = tolerance_for(entry, c.dtype);
  auto fail = [&](const Failure& f, const std::string& context) {
    v.pass = false;
    v.check = f.check;
    v.reason = f.reason + (context.empty() ? "" : " [" + context + "]");
    return v;
  };

  for (int s = 0; s < std::max(1, o.seeds); ++s) {
    const uint64_t run_seed = seed + uint64_t(s) * 1000003u;
    const bool all_dists = s == 0 && c.input_bytes <= o.max_distribution_bytes;
    for (const std::string& dist : distributions()) {
      if (dist != "normal" && !all_dists) continue;
      const std::string context = "seed " + std::to_string(run_seed) + ", " + dist + " inputs";
      const InputSpec spec{run_seed, dist};
      // NOTE: the candidate runs first: nothing the baseline computes for these values exists anywhere yet.
      const CallResult rec = candidate.call(CallKind::checked, spec);
      if (rec.failed()) return fail({rec.check, rec.reason}, context);
      v.runs++;
      const std::vector<Tensor>* held = candidate.inputs_held(spec);
      const std::vector<Tensor> pristine =
          held ? *held : apply_distribution(c.make_inputs(device, run_seed), dist, run_seed, fixed_input_mask(entry));
      std::vector<Tensor> base_in = clone_all(pristine);
      const std::vector<Tensor> want = baseline.call(base_in);
      synchronize(device);
      LazyTies ties(oracle, entry, pristine);
      if (auto f = compare_with_ties(rec.outputs, want, tol, "baseline", entry, &v.worst_mean_rel_err, ties, v))
        return fail(f, context);
      // Declared in-place inputs must end as the baseline leaves them.
      for (size_t k = 0; k < rec.inputs_after.size() && k < base_in.size(); ++k) {
        if (!rec.inputs_after[k].defined()) continue;
        const std::string& name = k < entry.args.size() ? entry.args[k] : "";
        if (auto f = compare_with_ties({rec.inputs_after[k]}, {base_in[k]}, tol, "baseline", entry, nullptr, ties, v))
          return fail({"tolerance", "in-place input '" + name + "': " + f.reason}, context);
      }

      // NOTE: the oracle runs on the first seed's inputs (every distribution): it is single-threaded double
      // precision on the host, and the other seeds are already held to the baseline.
      if (oracle && o.check_oracle && s == 0) {
        const std::vector<Tensor> truth = oracle->call(cpu_copies(pristine));
        double cand_rel = 0, base_rel = 0;
        if (auto f = compare_with_ties(rec.outputs, truth, tol, "oracle", entry, &cand_rel, ties, v))
          return fail(f, context);
        // The baseline's error against the oracle, without the rows of near-tied tokens when the candidate needed
        // them exempt (the baseline may route those differently from the oracle too).
        (void)compare_outputs(ties.known() ? with_tie_rows(want, truth, *ties.known()) : want, truth,
                              Tolerance{1e30, 1e30, 0}, "oracle", entry, &base_rel);
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
        // New values written into the same input buffers (and the old outputs scrambled) must give new,
        // correct outputs: a cache keyed on pointers or shapes returns the old result.
        const InputSpec fresh{run_seed ^ 0x5eedf00dULL, "normal"};
        const CallResult got = candidate.call(CallKind::rewrite, fresh);
        if (got.failed()) return fail({got.check, got.reason}, context);
        v.runs++;
        std::vector<Tensor> fresh_base_in = c.make_inputs(device, fresh.seed);
        LazyTies fresh_ties(oracle, entry, entry.router_inside ? clone_all(fresh_base_in) : std::vector<Tensor>{});
        const std::vector<Tensor> fresh_want = baseline.call(fresh_base_in);
        synchronize(device);
        if (auto f = compare_with_ties(got.outputs, fresh_want, tol, "baseline", entry, nullptr, fresh_ties, v))
          return fail({"fresh output", "after new values were written into the same input buffers: " + f.reason},
                      context);
        // Determinism: identical inputs, bit-identical outputs.
        const CallResult again = candidate.call(CallKind::plain, spec);
        if (again.failed()) return fail({again.check, again.reason}, context);
        v.runs++;
        for (size_t j = 0; j < again.outputs.size() && j < rec.outputs.size(); ++j) {
          int64_t first = -1;
          const int64_t n = count_bitwise_mismatches(again.outputs[j], rec.outputs[j], &first);
          if (n > 0)
            return fail({"determinism", describe_output(j) + " differs between two calls on identical inputs in " +
                                            std::to_string(n) + " elements (first at " +
                                            unravel_index(again.outputs[j].shape(), first) + ")"},
                        context);
        }
      }
    }
  }
  return v;
}

Validation validate_candidate(const BenchCase& c, const OpEntry& entry, AnyOp& baseline, AnyOp& candidate,
                              AnyOp* oracle, Device device, uint64_t seed, const ValidationOptions& o) {
  (void)take_guard_violations();  // start clean: nothing from earlier cases is blamed on this one
  InProcessRunner runner(c, entry, candidate, device);
  Validation v = validate_candidate(c, entry, baseline, runner, oracle, device, seed, o);
  const auto late = take_guard_violations();
  if (v.pass && !late.empty()) {
    v.pass = false;
    v.check = "guards";
    v.reason = late[0].describe() + " [found after the runs]";
  }
  return v;
}

std::string verify_timed_samples(const BenchCase& c, const OpEntry& entry, AnyOp& baseline,
                                 const std::vector<TimedSample>& samples, Device device, AnyOp* oracle) {
  const Tolerance tol = tolerance_for(entry, c.dtype);
  Validation counts;  // exemptions here are not reported
  for (const TimedSample& s : samples) {
    std::vector<Tensor> in = c.make_inputs(device, s.value_seed);
    LazyTies ties(oracle, entry, entry.router_inside ? clone_all(in) : std::vector<Tensor>{});
    const std::vector<Tensor> want = baseline.call(in);
    synchronize(device);
    if (auto f = compare_with_ties(s.outputs, want, tol, "baseline", entry, nullptr, ties, counts)) {
      const std::string which = s.call == -2 ? "the call made after timing, on fresh values written into input set 0"
                                             : "timed call " + std::to_string(s.call) + " (input set " +
                                                   std::to_string(s.set) + ", new values written into it just before)";
      return which + ": " + f.reason;
    }
  }
  return "";
}

}  // namespace kbn::bench
