// The op under test seen through bench/runner.h on CPU tensors: timed calls see fresh values and sampled ones
// are verified (an address-keyed cache is caught), and a worker process that ends early, hangs or talks
// nonsense fails with what happened instead of hanging or crashing the harness.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "bench/cases.h"
#include "bench/runner.h"
#include "bench/validate.h"
#include "kbn/config.h"
#include "kbn/module.h"
#include "kbn/registry.h"

using namespace kbn;

namespace {

class HookedOp : public AnyOp {
 public:
  using Hook = std::function<std::vector<Tensor>(AnyOp&, const std::vector<Tensor>&)>;
  HookedOp(std::unique_ptr<AnyOp> inner, Hook hook) : inner_(std::move(inner)), hook_(std::move(hook)) {}
  Module& module() override { return inner_->module(); }
  std::vector<Tensor> call(const std::vector<Tensor>& args) override { return hook_(*inner_, args); }

 private:
  std::unique_ptr<AnyOp> inner_;
  Hook hook_;
};

struct Linear {
  bench::BenchCase c;
  const OpEntry* entry = &registry(Variant::baseline).get("linear");
  Linear() {
    const ModelConfig cfg = ModelConfig::load(std::string(KBN_SOURCE_DIR) + "/models/tiny-llama.json");
    bench::CaseOptions o;
    o.tokens = {9};
    o.small = true;
    c = bench::cases_for("linear", bench::model_view("tiny-llama", cfg, 1), o).at(0);
  }
  std::unique_ptr<AnyOp> make() { return bench::build_case_op(*entry, c, Device::cpu(), 5); }
};

bench::TimingRequest host_timing(int sets) {
  bench::TimingRequest r;
  r.options.host = true;
  r.options.warmup_calls = 1;
  r.options.min_iterations = 12;
  r.options.min_measured_ms = 0;
  r.options.max_iterations = 12;
  r.input_sets = sets;
  r.value_seed = 77;
  r.max_samples = 16;
  r.sample_seed = 1;
  return r;
}

TEST(Runner, TimedCallsSeeFreshValuesAndTheSamplesMatchTheBaseline) {
  Linear f;
  auto base = f.make();
  auto op = f.make();
  bench::InProcessRunner runner(f.c, *f.entry, *op, Device::cpu());
  const bench::TimingResult r = runner.time(host_timing(2));
  ASSERT_FALSE(r.failed()) << r.reason;
  EXPECT_EQ(r.timing.iterations, 12);
  // 12 timed calls, all kept (16 allowed), plus the call after timing.
  ASSERT_EQ(r.samples.size(), 13u);
  std::set<uint64_t> seeds;
  for (const auto& s : r.samples) seeds.insert(s.value_seed);
  EXPECT_EQ(seeds.size(), 13u) << "every timed call ran on values no other call saw";
  EXPECT_EQ(r.samples.back().call, -2);
  EXPECT_EQ(bench::verify_timed_samples(f.c, *f.entry, *base, r.samples, Device::cpu()), "");
}

TEST(Runner, AnAddressKeyedCacheIsCaughtByTheTimedSamples) {
  Linear f;
  auto base = f.make();
  // Remembers its output per input address and, from the third sighting on, serves the remembered rows.
  std::map<const void*, std::pair<int, Tensor>> seen;
  HookedOp cheat(f.make(), [&](AnyOp& inner, const std::vector<Tensor>& in) {
    auto& [count, out] = seen[in[0].data_ptr()];
    if (++count >= 3 && out.defined()) return std::vector<Tensor>{out.clone()};
    std::vector<Tensor> r = inner.call(in);
    out = r[0].clone();
    return r;
  });
  bench::InProcessRunner runner(f.c, *f.entry, cheat, Device::cpu());
  const bench::TimingResult r = runner.time(host_timing(2));
  ASSERT_FALSE(r.failed());
  const std::string why = bench::verify_timed_samples(f.c, *f.entry, *base, r.samples, Device::cpu());
  EXPECT_NE(why.find("timed call"), std::string::npos) << why;
  EXPECT_NE(why.find("new values written into it just before"), std::string::npos) << why;
}

TEST(Runner, TheSampleIsUniformAndBoundedForManyCalls) {
  Linear f;
  auto op = f.make();
  bench::InProcessRunner runner(f.c, *f.entry, *op, Device::cpu());
  bench::TimingRequest req = host_timing(3);
  req.options.min_iterations = req.options.max_iterations = 200;
  req.max_samples = 5;
  const bench::TimingResult r = runner.time(req);
  ASSERT_EQ(r.samples.size(), 6u);  // 5 sampled + the call after timing
  int late = 0;
  for (size_t i = 0; i + 1 < r.samples.size(); ++i) late += r.samples[i].call >= 100;
  EXPECT_GT(late, 0) << "a reservoir sample keeps late calls too, not just the first ones";
}

// Workers that misbehave: the argv runs bash instead of kb_nano (the pipe flags are appended after "--").
bench::WorkerRunner shell_worker(const std::string& script, double timeout_s) {
  return bench::WorkerRunner({"/bin/bash", "-c", script, "worker"}, timeout_s);
}

bench::CaseKey any_key() {
  bench::CaseKey k;
  k.op = "linear";
  k.model = "tiny-llama";
  k.label = "x";
  return k;
}

TEST(Worker, ExitingBeforeAnsweringFailsWithTheExitStatus) {
  auto w = shell_worker("exit 0", 20);
  const std::string why = w.open(any_key(), Variant::candidate, 1, Device::cpu());
  EXPECT_NE(why.find("ended before answering its 'open' request"), std::string::npos) << why;
  EXPECT_NE(why.find("exited with status 0"), std::string::npos) << why;
  // Everything after that fails the same way, without waiting.
  const bench::CallResult r = w.call(bench::CallKind::checked, {1, "normal"});
  EXPECT_EQ(r.check, "worker");
  EXPECT_EQ(r.reason, why);
}

// A worker that closes its input first (the pipes are fds 200 and 201 in the worker): the parent's write meets EPIPE or its read meets the end, by timing; both
// are the worker ending before it answered, with its exit status.
TEST(Worker, ClosingTheInputAndExitingFailsWithTheExitStatus) {
  auto w = shell_worker("exec 200<&-; sleep 0.2; exit 3", 20);
  const std::string why = w.open(any_key(), Variant::candidate, 1, Device::cpu());
  EXPECT_NE(why.find("ended before answering its 'open' request"), std::string::npos) << why;
  EXPECT_NE(why.find("exited with status 3"), std::string::npos) << why;
}

// One that closes both pipes and goes on running is killed after a grace period, not waited for.
TEST(Worker, ClosingThePipesAndRunningOnIsKilled) {
  auto w = shell_worker("exec 200<&- 201>&-; sleep 60", 20);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string why = w.open(any_key(), Variant::candidate, 1, Device::cpu());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8)) << why;
  EXPECT_NE(why.find("closed the pipe without answering its 'open' request and was killed"), std::string::npos)
      << why;
  EXPECT_NE(why.find("signal 9"), std::string::npos) << why;
}

TEST(Worker, ACrashNamesTheSignal) {
  auto w = shell_worker("kill -SEGV $$", 20);
  const std::string why = w.open(any_key(), Variant::candidate, 1, Device::cpu());
  EXPECT_NE(why.find("killed by signal 11"), std::string::npos) << why;
}

TEST(Worker, AHangIsKilledAfterTheTimeLimit) {
  auto w = shell_worker("sleep 60", 1);
  const auto start = std::chrono::steady_clock::now();
  const std::string why = w.open(any_key(), Variant::candidate, 1, Device::cpu());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(why.find("gave no answer to its 'open' request within 1 s"), std::string::npos) << why;
  EXPECT_NE(why.find("killed by signal 9"), std::string::npos) << why;
  EXPECT_LT(s, 15.0);
  // The next open starts a new worker (which hangs again).
  EXPECT_FALSE(w.open(any_key(), Variant::candidate, 1, Device::cpu()).empty());
  EXPECT_EQ(w.started(), 2);
}

TEST(Worker, GarbageOnThePipeIsAProtocolFailure) {
  auto w = shell_worker("echo this-is-not-a-frame-at-all >&201; sleep 60", 20);
  const std::string why = w.open(any_key(), Variant::candidate, 1, Device::cpu());
  EXPECT_NE(why.find("broke the protocol"), std::string::npos) << why;
}

TEST(Worker, RefusesANonPositiveTimeLimit) {
  EXPECT_THROW(shell_worker("true", 0), Error);
}

}  // namespace
