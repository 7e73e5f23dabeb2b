#pragma once
// The op under test, seen from the harness (DESIGN.md, "Validation contract"): every request names its inputs by
// seeds, and every answer carries outputs and times by value. `kb_nano kernels` runs the candidate behind a
// WorkerRunner, in a worker process of the same binary that holds only the candidate and its own inputs (drawn there
// from the seeds it is given); the baseline's and the oracle's outputs, the expected values and the run's secret
// seed stay in the parent, which compares. An InProcessRunner runs the same requests in this process (tests, and
// the worker's own side).
//
// A worker that crashes, hangs (no answer within the request's time limit) or exits early is a failure of check
// "worker" naming what happened, never a hang or a crash of the harness.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "kbn/device.h"
#include "kbn/op_case.h"
#include "kbn/registry.h"

namespace kbn::bench {

// One input set: the case's seeded inputs, then a value distribution (bench/validate.h: distributions()).
struct InputSpec {
  uint64_t seed = 0;
  std::string distribution = "normal";
};

enum class CallKind {
  checked,  // on fresh audited copies: new allocations poisoned and guarded, non-mutable inputs must stay intact,
            // and the previous checked call's outputs must be neither handed out again nor overwritten
  rewrite,  // the spec's values written into the input buffers of the previous checked call (its outputs scrambled)
  plain,    // on fresh copies, nothing checked here (the determinism re-run)
};
const char* call_kind_name(CallKind k);

struct CallResult {
  std::string check, reason;         // a failure seen where the op ran ("unwritten", "immutable", "guards", ...)
  std::vector<Tensor> outputs;       // what the op's stream held right after the call
  std::vector<Tensor> inputs_after;  // the declared-mutable inputs after the call (undefined for the others)
  bool failed() const { return !check.empty(); }
};

struct TimingRequest {
  TimingOptions options;
  int input_sets = 1;
  uint64_t value_seed = 0;  // input values: refresh_seed(value_seed, set, call) (bench/timing.h: fresh values)
  int max_samples = 4;      // timed calls kept for verification (a uniform sample of all of them); 0: time only,
                            // with no samples and no call after timing (the trusted baseline's own timing)
  uint64_t sample_seed = 0;
  bool capturable = true;
};

// The values input set `set` holds before timed call `call` (-1: the initial values; -2: the call made after
// timing).
uint64_t refresh_seed(uint64_t value_seed, int set, int64_t call);

struct TimedSample {
  int set = 0;
  int64_t call = 0;  // the timed call's index; -2 for the call made after timing on fresh values in set 0
  uint64_t value_seed = 0;
  std::vector<Tensor> outputs;
};

struct TimingResult {
  Timing timing;
  std::vector<TimedSample> samples;
  std::string check, reason;  // a failure of the runner itself ("worker")
  bool failed() const { return !check.empty(); }
};

class CandidateRunner {
 public:
  virtual ~CandidateRunner() = default;
  virtual CallResult call(CallKind kind, const InputSpec& spec) = 0;
  virtual TimingResult time(const TimingRequest& request) = 0;
  // The input values of the last checked call when they live in this process and match `spec` (the harness then
  // need not draw them again), else null.
  virtual const std::vector<Tensor>* inputs_held(const InputSpec& spec) const { return nullptr; }
};

// The op in this process.
class InProcessRunner : public CandidateRunner {
 public:
  InProcessRunner(const BenchCase& c, const OpEntry& entry, AnyOp& op, Device device);
  ~InProcessRunner() override;
  CallResult call(CallKind kind, const InputSpec& spec) override;
  TimingResult time(const TimingRequest& request) override;
  const std::vector<Tensor>* inputs_held(const InputSpec& spec) const override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// How a worker rebuilds a case: enough of the `kb_nano kernels` selection to find it again by label.
struct CaseKey {
  std::string op, model, label;
  int64_t tp = 1, tokens = 0;
  bool random = false;       // a property-based random shape (label "random#i ...")
  int random_count = 0;      // how many random shapes the run drew (the same draw finds the same one)
  uint64_t shape_seed = 0;   // the seed the random shapes were drawn from
  bool small = false;        // CPU-sized cases
  DType dtype = DType::bf16;
  std::optional<DType> kv_cache_dtype;  // kernels --kv-cache-dtype, when not auto
};

// The op under test in a worker process: `argv` runs this binary's worker (e.g. {"/proc/self/exe",
// "kernels-worker"}; the pipe descriptors are appended as --in-fd N --out-fd M). Started by open(); after any
// failure the worker is gone and the next open() starts a new one.
class WorkerRunner : public CandidateRunner {
 public:
  WorkerRunner(std::vector<std::string> argv, double timeout_s);
  ~WorkerRunner() override;
  WorkerRunner(const WorkerRunner&) = delete;
  WorkerRunner& operator=(const WorkerRunner&) = delete;
  // Builds `variant`'s op for the case in the worker (weights from `weight_seed`). Returns "" or the failure.
  std::string open(const CaseKey& key, Variant variant, uint64_t weight_seed, Device device);
  // Ends the case: the worker frees its memory. Returns "" or the failure.
  std::string close();
  CallResult call(CallKind kind, const InputSpec& spec) override;
  TimingResult time(const TimingRequest& request) override;
  int started() const { return started_; }  // workers started so far

  struct Process;  // the worker's pid and pipes (runner.cpp)

 private:
  std::vector<std::string> argv_;
  double timeout_s_;
  std::unique_ptr<Process> p_;
  std::string dead_;  // why the current worker is gone ("" while it answers)
  int started_ = 0;
};

// The worker's side: answers requests on in_fd / out_fd until the parent says goodbye or closes the pipe. Returns
// the process's exit status.
int serve_worker(int in_fd, int out_fd, const std::function<BenchCase(const CaseKey&)>& rebuild,
                 const std::function<std::unique_ptr<AnyOp>(const OpEntry&, const BenchCase&, Device, uint64_t)>& build);

}  // namespace kbn::bench
