#include "bench/runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "bench/validate.h"
#include "kbn/allocator.h"
#include "kbn/compare.h"
#include "kbn/error.h"
#include "kbn/format.h"
#include "kbn/rng.h"

namespace kbn::bench {

using nlohmann::json;

const char* call_kind_name(CallKind k) {
  switch (k) {
    case CallKind::checked:
      return "checked";
    case CallKind::rewrite:
      return "rewrite";
    case CallKind::plain:
      return "plain";
  }
  return "?";
}

uint64_t refresh_seed(uint64_t value_seed, int set, int64_t call) {
  return hash_seed(value_seed ^ (uint64_t(uint32_t(set)) << 40) ^ uint64_t(call + 3), "timing.refresh");
}

// ---- the op in this process ----

namespace {

std::vector<Tensor> clone_all(const std::vector<Tensor>& v) {
  std::vector<Tensor> out;
  for (const Tensor& t : v) out.push_back(t.defined() ? t.clone() : Tensor());
  return out;
}

// Audited copies: the op's own inputs get guard zones too, so writes past an in-place input's end are caught.
std::vector<Tensor> audited_clones(const std::vector<Tensor>& v) {
  AllocationAudit audit;
  return clone_all(v);
}

bool same_memory(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() && b.storage() && a.storage()->data() == b.storage()->data();
}

bool aliases_any(const Tensor& t, const std::vector<Tensor>& v) {
  return std::any_of(v.begin(), v.end(), [&](const Tensor& u) { return same_memory(t, u); });
}

std::string describe_output(size_t j) { return "output " + std::to_string(j); }

bool declared_mutable(const OpEntry& e, size_t k) {
  return k < e.args.size() && std::find(e.mutates.begin(), e.mutates.end(), e.args[k]) != e.mutates.end();
}

}  // namespace

struct InProcessRunner::State {
  const BenchCase& c;
  const OpEntry& entry;
  AnyOp& op;
  Device device;
  // The previous checked call: its outputs (held, as a caller would), their snapshots, which were allocated by
  // the call, and the input buffers it ran on (a rewrite call reuses them).
  std::vector<Tensor> prev_outputs, prev_snapshots, prev_inputs;
  std::vector<bool> prev_fresh;
  // The pristine values of the last checked call (never handed to the op, which gets audited copies).
  InputSpec held_spec;
  std::vector<Tensor> held;

  std::vector<Tensor> inputs(const InputSpec& spec) const {
    return apply_distribution(c.make_inputs(device, spec.seed), spec.distribution, spec.seed, fixed_input_mask(entry));
  }

  void fail(CallResult& r, std::string check, std::string reason) const {
    r.check = std::move(check);
    r.reason = std::move(reason);
  }

  // Guard zones broken by anything since the last look.
  bool guards_broken(CallResult& r) const {
    const auto violations = take_guard_violations();
    if (violations.empty()) return false;
    fail(r, "guards",
         violations[0].describe() +
             (violations.size() > 1 ? " (and " + std::to_string(violations.size() - 1) + " more)" : std::string()));
    return true;
  }

  CallResult checked(const InputSpec& spec) {
    CallResult r;
    held.clear();
    const std::vector<Tensor> pristine = inputs(spec);
    std::vector<Tensor> in = audited_clones(pristine);
    std::vector<Tensor> outputs;
    {
      AllocationAudit audit;
      outputs = op.call(in);
    }
    // NOTE: the snapshots are stream-ordered right after the call: they hold what a consumer on the op's stream
    // would read, so work left running on another stream or thread shows up as unwritten.
    std::vector<Tensor> snapshots;
    for (const Tensor& t : outputs) snapshots.push_back(t.defined() ? t.clone() : Tensor());
    synchronize(device);
    std::vector<bool> fresh;
    for (size_t j = 0; j < outputs.size(); ++j) {
      const bool f = outputs[j].defined() && !aliases_any(outputs[j], in);
      fresh.push_back(f);
      if (!f) continue;
      int64_t first = -1;
      const int64_t n = count_poisoned(snapshots[j], kAuditPoisonByte, &first);
      if (n > 0) {
        fail(r, "unwritten",
             describe_output(j) + ": " + std::to_string(n) + " of " + std::to_string(snapshots[j].numel()) +
                 " elements still hold the poison (first at " + unravel_index(snapshots[j].shape(), first) +
                 ") when the call's stream finished: skipped work, or work left on another stream or thread");
        return r;
      }
    }
    for (size_t k = 0; k < in.size(); ++k) {
      if (!in[k].defined() || declared_mutable(entry, k)) continue;
      const std::string& name = k < entry.args.size() ? entry.args[k] : std::to_string(k);
      int64_t first = -1;
      const int64_t n = count_bitwise_mismatches(in[k], pristine[k], &first);
      if (n > 0) {
        fail(r, "immutable",
             "input '" + name + "' changed in " + std::to_string(n) + " elements (first at " +
                 unravel_index(in[k].shape(), first) + ") but " + entry.name + " does not declare it mutable");
        return r;
      }
    }
    if (guards_broken(r)) return r;
    // Fresh output: the previous call's outputs, still held here, are untouched and not handed out again.
    for (size_t j = 0; j < prev_outputs.size(); ++j) {
      if (j >= prev_fresh.size() || !prev_fresh[j]) continue;
      for (size_t i = 0; i < outputs.size(); ++i)
        if (fresh[i] && same_memory(outputs[i], prev_outputs[j])) {
          fail(r, "fresh output",
               describe_output(i) + " is the buffer of the previous call's " + describe_output(j) +
                   ", which the caller still holds (a cached or reused output)");
          return r;
        }
      if (count_bitwise_mismatches(prev_outputs[j], prev_snapshots[j]) > 0) {
        fail(r, "fresh output",
             "this call overwrote the previous call's " + describe_output(j) + ", which the caller still holds");
        return r;
      }
    }
    r.outputs = snapshots;
    for (size_t k = 0; k < in.size(); ++k) r.inputs_after.push_back(declared_mutable(entry, k) ? in[k] : Tensor());
    prev_outputs = std::move(outputs);
    prev_snapshots = std::move(snapshots);
    prev_fresh = std::move(fresh);
    prev_inputs = std::move(in);
    held_spec = spec;
    held = pristine;
    return r;
  }

  // New values written into the same input buffers (and the old outputs scrambled) must give new, correct
  // outputs: a cache keyed on pointers or shapes returns the old result.
  CallResult rewrite(const InputSpec& spec) {
    CallResult r;
    KBN_CHECK(!prev_inputs.empty(), "bench: a rewrite call needs a checked call before it");
    const std::vector<Tensor> values = inputs(spec);
    for (size_t k = 0; k < prev_inputs.size(); ++k)
      if (prev_inputs[k].defined()) prev_inputs[k].copy_(values[k]);
    for (size_t j = 0; j < prev_outputs.size(); ++j)
      if (j < prev_fresh.size() && prev_fresh[j])
        prev_outputs[j].fill_(is_floating(prev_outputs[j].dtype()) ? NAN : -1.0);
    const std::vector<Tensor> got = op.call(prev_inputs);
    for (const Tensor& t : got) r.outputs.push_back(t.defined() ? t.clone() : Tensor());
    synchronize(device);
    // Its outputs were scrambled on purpose: they are not held against the next call.
    prev_outputs.clear();
    prev_snapshots.clear();
    prev_fresh.clear();
    prev_inputs.clear();
    guards_broken(r);
    return r;
  }

  CallResult plain(const InputSpec& spec) {
    CallResult r;
    std::vector<Tensor> in = inputs(spec);
    const std::vector<Tensor> got = op.call(in);
    for (const Tensor& t : got) r.outputs.push_back(t.defined() ? t.clone() : Tensor());
    synchronize(device);
    guards_broken(r);
    return r;
  }
};

InProcessRunner::InProcessRunner(const BenchCase& c, const OpEntry& entry, AnyOp& op, Device device)
    : s_(new State{c, entry, op, device, {}, {}, {}, {}, {}, {}}) {}

InProcessRunner::~InProcessRunner() = default;

const std::vector<Tensor>* InProcessRunner::inputs_held(const InputSpec& spec) const {
  const bool same = !s_->held.empty() && s_->held_spec.seed == spec.seed &&
                    s_->held_spec.distribution == spec.distribution;
  return same ? &s_->held : nullptr;
}

CallResult InProcessRunner::call(CallKind kind, const InputSpec& spec) {
  switch (kind) {
    case CallKind::checked:
      return s_->checked(spec);
    case CallKind::rewrite:
      return s_->rewrite(spec);
    case CallKind::plain:
      return s_->plain(spec);
  }
  KBN_FAIL("bench: unknown call kind");
}

TimingResult InProcessRunner::time(const TimingRequest& req) {
  KBN_CHECK(req.input_sets >= 1, "bench: timing needs at least one input set, got ", req.input_sets);
  const BenchCase& c = s_->c;
  const Device device = s_->device;
  TimingResult result;
  std::vector<std::vector<Tensor>> sets;
  std::vector<uint64_t> held(size_t(req.input_sets));  // the value seed each set holds now
  for (int s = 0; s < req.input_sets; ++s) {
    held[size_t(s)] = refresh_seed(req.value_seed, s, -1);
    sets.push_back(c.make_inputs(device, held[size_t(s)]));
  }
  auto refresh = [&](int s, int64_t n) {
    held[size_t(s)] = refresh_seed(req.value_seed, s, n);
    const std::vector<Tensor> values = c.make_inputs(device, held[size_t(s)]);
    for (size_t k = 0; k < values.size(); ++k)
      if (sets[size_t(s)][k].defined()) sets[size_t(s)][k].copy_(values[k]);
  };
  // A uniform sample of the timed calls (reservoir sampling), each with the values it ran on.
  std::mt19937_64 pick(req.sample_seed);
  int64_t seen = 0;
  const size_t keep = size_t(std::max(0, req.max_samples));
  auto observe = [&](int s, int64_t n, const std::vector<Tensor>& outputs) {
    seen++;
    size_t slot = result.samples.size();
    if (slot >= keep) {
      slot = size_t(pick() % uint64_t(seen));
      if (slot >= keep) return;
    }
    TimedSample sample{s, n, held[size_t(s)], clone_all(outputs)};
    if (slot == result.samples.size())
      result.samples.push_back(std::move(sample));
    else
      result.samples[slot] = std::move(sample);
  };
  TimedOp op;
  op.input_sets = req.input_sets;
  op.capturable = req.capturable;
  op.call = [&](int s) { return s_->op.call(sets[size_t(s)]); };
  op.refresh = refresh;
  if (keep > 0) op.observe = observe;
  result.timing = time_op(op, req.options);
  synchronize(device);
  // One more call made like the timed ones, after fresh values were written into a buffer the timing used.
  if (result.timing.ok && keep > 0) {
    refresh(0, -2);
    const std::vector<Tensor> outputs = s_->op.call(sets[0]);
    result.samples.push_back({0, -2, held[0], clone_all(outputs)});
    synchronize(device);
  }
  return result;
}

// ---- the wire: a JSON head and the tensors it lists, by value ----

namespace {

constexpr uint64_t kMagic = 0x6b626e2d776b7231ULL;  // "kbn-wkr1"

struct Frame {
  json head;
  std::vector<Tensor> tensors;
};

struct WireError {
  std::string what;
  bool timeout = false;
  bool eof = false;
};

void write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      // EPIPE: the worker closed its end (it is ending, or has ended) before reading what we sent.
      if (errno == EPIPE) throw WireError{"it closed its input", false, true};
      throw WireError{std::string("write failed: ") + std::strerror(errno)};
    }
    p += w;
    n -= size_t(w);
  }
}

using Clock = std::chrono::steady_clock;

// Reads exactly n bytes before `deadline` (no deadline when it is the epoch).
void read_all(int fd, void* data, size_t n, Clock::time_point deadline, bool first) {
  char* p = static_cast<char*>(data);
  const bool timed = deadline != Clock::time_point{};
  while (n > 0) {
    if (timed) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) throw WireError{"no answer in time", true};
      pollfd pfd{fd, POLLIN, 0};
      const int r = ::poll(&pfd, 1, int(std::min<long long>(left, 1000)));
      if (r < 0 && errno != EINTR) throw WireError{std::string("poll failed: ") + std::strerror(errno)};
      if (r <= 0) continue;
    }
    const ssize_t got = ::read(fd, p, n);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw WireError{std::string("read failed: ") + std::strerror(errno)};
    }
    if (got == 0) throw WireError{first ? "closed" : "closed in the middle of an answer", false, true};
    first = false;
    p += got;
    n -= size_t(got);
  }
}

json tensor_head(const Tensor& t) {
  if (!t.defined()) return nullptr;
  return json{{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}};
}

void send_frame(int fd, json head, const std::vector<Tensor>& tensors) {
  std::vector<Tensor> host;
  head["tensors"] = json::array();
  for (const Tensor& t : tensors) {
    head["tensors"].push_back(tensor_head(t));
    host.push_back(t.defined() ? (t.is_cpu() ? t : t.to(Device::cpu())).contiguous() : Tensor());
  }
  const std::string text = head.dump();
  const uint64_t sizes[2] = {kMagic, uint64_t(text.size())};
  write_all(fd, sizes, sizeof sizes);
  write_all(fd, text.data(), text.size());
  for (const Tensor& t : host)
    if (t.defined()) write_all(fd, t.data_ptr(), t.nbytes());
}

Frame receive_frame(int fd, Clock::time_point deadline) {
  uint64_t sizes[2] = {0, 0};
  read_all(fd, sizes, sizeof sizes, deadline, true);
  if (sizes[0] != kMagic || sizes[1] > (uint64_t(64) << 20)) throw WireError{"answer is not a worker frame"};
  std::string text(sizes[1], '\0');
  read_all(fd, text.data(), text.size(), deadline, false);
  Frame f;
  f.head = json::parse(text, nullptr, false);
  if (f.head.is_discarded() || !f.head.is_object()) throw WireError{"answer's head is not JSON"};
  for (const json& th : f.head.value("tensors", json::array())) {
    if (th.is_null()) {
      f.tensors.emplace_back();
      continue;
    }
    Tensor t = Tensor::empty(th.at("shape").get<Shape>(), parse_dtype(th.at("dtype").get<std::string>()),
                             Device::cpu());
    read_all(fd, t.data_ptr(), t.nbytes(), deadline, false);
    f.tensors.push_back(std::move(t));
  }
  return f;
}

json timing_options_json(const TimingOptions& o) {
  return {{"mode", timing_mode_name(o.mode)}, {"warmup_calls", o.warmup_calls}, {"min_measured_ms", o.min_measured_ms},
          {"max_iterations", o.max_iterations}, {"min_iterations", o.min_iterations}, {"graph_calls", o.graph_calls},
          {"host", o.host}};
}

TimingOptions timing_options_from(const json& j) {
  TimingOptions o;
  o.mode = parse_timing_mode(j.at("mode").get<std::string>());
  o.warmup_calls = j.at("warmup_calls");
  o.min_measured_ms = j.at("min_measured_ms");
  o.max_iterations = j.at("max_iterations");
  o.min_iterations = j.at("min_iterations");
  o.graph_calls = j.at("graph_calls");
  o.host = j.at("host");
  return o;
}

json timing_json(const Timing& t) {
  return {{"ok", t.ok},
          {"skipped", t.skipped},
          {"median_ms", t.median_ms},
          {"p10_ms", t.p10_ms},
          {"p90_ms", t.p90_ms},
          {"min_ms", t.min_ms},
          {"host_wall_median_ms", t.host_wall_median_ms},
          {"outside_stream_ms", t.outside_stream_ms},
          {"empty_round_trip_ms", t.empty_round_trip_ms},
          {"iterations", t.iterations},
          {"input_sets", t.input_sets}};
}

Timing timing_from(const json& j) {
  Timing t;
  t.ok = j.at("ok");
  t.skipped = j.at("skipped");
  t.median_ms = j.at("median_ms");
  t.p10_ms = j.at("p10_ms");
  t.p90_ms = j.at("p90_ms");
  t.min_ms = j.at("min_ms");
  t.host_wall_median_ms = j.at("host_wall_median_ms");
  t.outside_stream_ms = j.at("outside_stream_ms");
  t.empty_round_trip_ms = j.at("empty_round_trip_ms");
  t.iterations = j.at("iterations");
  t.input_sets = j.at("input_sets");
  return t;
}

json case_key_json(const CaseKey& k) {
  return {{"op", k.op},         {"model", k.model},
          {"label", k.label},   {"tp", k.tp},
          {"tokens", k.tokens}, {"random", k.random},
          {"random_count", k.random_count},
          {"shape_seed", k.shape_seed},
          {"small", k.small},   {"dtype", dtype_name(k.dtype)},
          {"kv_cache_dtype", k.kv_cache_dtype ? dtype_name(*k.kv_cache_dtype) : ""}};
}

CaseKey case_key_from(const json& j) {
  CaseKey k;
  k.op = j.at("op");
  k.model = j.at("model");
  k.label = j.at("label");
  k.tp = j.at("tp");
  k.tokens = j.at("tokens");
  k.random = j.at("random");
  k.random_count = j.at("random_count");
  k.shape_seed = j.at("shape_seed");
  k.small = j.at("small");
  k.dtype = parse_dtype(j.at("dtype").get<std::string>());
  const std::string kv = j.at("kv_cache_dtype");
  if (!kv.empty()) k.kv_cache_dtype = parse_dtype(kv);
  return k;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : std::string());
  }
  return "ended (wait status " + std::to_string(status) + ")";
}

}  // namespace

// ---- the parent's side ----

struct WorkerRunner::Process {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;

  ~Process() {
    if (to_child >= 0) ::close(to_child);
    if (from_child >= 0) ::close(from_child);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      reap();
    }
  }

  // The worker's end, waited for up to 10 s (a process stuck in the driver may take a while to go).
  std::string reap() { return wait_for_end(1000).value_or("did not end within 10 s of being killed"); }

  // The worker's end when it ends on its own within `polls` x 10 ms; nothing while it still runs.
  std::optional<std::string> wait_for_end(int polls) {
    if (pid <= 0) return "was already gone";
    int status = 0;
    for (int i = 0; i < polls; ++i) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;
        return describe_status(status);
      }
      if (r < 0) {
        pid = -1;
        return "could not be waited for";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }
};

WorkerRunner::WorkerRunner(std::vector<std::string> argv, double timeout_s)
    : argv_(std::move(argv)), timeout_s_(timeout_s) {
  KBN_CHECK(!argv_.empty(), "bench: a worker needs a command");
  KBN_CHECK(timeout_s > 0, "--worker-timeout: expected a positive number of seconds, got ", timeout_s);
}

WorkerRunner::~WorkerRunner() {
  if (p_ && p_->pid > 0 && dead_.empty()) {
    try {
      send_frame(p_->to_child, {{"request", "bye"}}, {});
    } catch (const WireError&) {
    }
  }
}

namespace {

// Starts the worker: two pipes, fork, exec of this binary. Only async-signal-safe calls run between fork and exec.
std::unique_ptr<WorkerRunner::Process> spawn(const std::vector<std::string>& argv_in) {
  // A parent writing to a worker that died gets EPIPE instead of being killed by SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  int to_child[2], from_child[2];
  KBN_CHECK(::pipe2(to_child, O_CLOEXEC) == 0, "bench: cannot create the worker's pipe: ", std::strerror(errno));
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    ::close(to_child[0]);
    ::close(to_child[1]);
    KBN_FAIL("bench: cannot create the worker's pipe: ", std::strerror(errno));
  }
  // Larger pipes move outputs in fewer system calls (the kernel may refuse; then the default serves).
  ::fcntl(from_child[0], F_SETPIPE_SZ, 1 << 20);
  // The child's descriptors for its requests and answers: fixed numbers above the usual range.
  constexpr int kChildIn = 200, kChildOut = 201;
  std::vector<std::string> args = argv_in;
  args.insert(args.end(), {"--in-fd", std::to_string(kChildIn), "--out-fd", std::to_string(kChildOut)});
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
    KBN_FAIL("bench: cannot start a worker process: ", std::strerror(errno));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the harness
    // dup2 clears close-on-exec on the new numbers; the originals close at exec.
    if (::dup2(to_child[0], kChildIn) < 0 || ::dup2(from_child[1], kChildOut) < 0) ::_exit(127);
    ::dup2(2, 1);  // what the op prints goes to the harness's stderr, never into its tables
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  auto p = std::make_unique<WorkerRunner::Process>();
  p->pid = pid;
  p->to_child = to_child[1];
  p->from_child = from_child[0];
  return p;
}

// One request and its answer, or the reason there is none (the worker is then killed and gone).
struct Exchange {
  Frame reply;
  std::string failure;
};

}  // namespace

static Exchange exchange(std::unique_ptr<WorkerRunner::Process>& p, std::string& dead, double timeout_s,
                         const json& head) {
  Exchange x;
  const std::string what = head.value("request", std::string("request"));
  if (!p || !dead.empty()) {
    x.failure = dead.empty() ? "no worker is running" : dead;
    return x;
  }
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(int64_t(std::llround(timeout_s * 1000.0)));
  try {
    send_frame(p->to_child, head, {});
    x.reply = receive_frame(p->from_child, deadline);
    if (x.reply.head.contains("error")) {
      // The op threw where it ran: an error of the case, as in one process (the worker goes on).
      throw Error(x.reply.head.at("error").get<std::string>());
    }
    return x;
  } catch (const WireError& e) {
    std::string how;
    if (e.timeout) {
      ::kill(p->pid, SIGKILL);
      how = "gave no answer to its '" + what + "' request within " + fmt("%.0f", timeout_s) +
            " s (--worker-timeout) and was killed; it " + p->reap();
    } else if (e.eof) {
      // A worker that closed the pipe normally exits at once; one still running after 2 s is killed.
      if (auto end = p->wait_for_end(200)) {
        how = "ended before answering its '" + what + "' request: it " + *end;
      } else {
        ::kill(p->pid, SIGKILL);
        how = "closed the pipe without answering its '" + what + "' request and was killed; it " + p->reap();
      }
    } else {
      ::kill(p->pid, SIGKILL);
      how = "broke the protocol on its '" + what + "' request (" + e.what + ") and was killed; it " + p->reap();
    }
    dead = "the worker process " + how;
    x.failure = dead;
    p.reset();
    return x;
  }
}

std::string WorkerRunner::open(const CaseKey& key, Variant variant, uint64_t weight_seed, Device device) {
  if (!p_ || !dead_.empty()) {
    p_.reset();
    dead_.clear();
    p_ = spawn(argv_);
    started_++;
  }
  json head = {{"request", "open"},
               {"case", case_key_json(key)},
               {"variant", variant_name(variant)},
               {"weight_seed", weight_seed},
               {"device", device.str()}};
  return exchange(p_, dead_, timeout_s_, head).failure;
}

std::string WorkerRunner::close() {
  if (!p_ || !dead_.empty()) return dead_;
  return exchange(p_, dead_, timeout_s_, {{"request", "close"}}).failure;
}

CallResult WorkerRunner::call(CallKind kind, const InputSpec& spec) {
  CallResult r;
  Exchange x = exchange(p_, dead_, timeout_s_,
                        {{"request", "call"},
                         {"kind", call_kind_name(kind)},
                         {"seed", spec.seed},
                         {"distribution", spec.distribution}});
  if (!x.failure.empty()) {
    r.check = "worker";
    r.reason = x.failure;
    return r;
  }
  r.check = x.reply.head.value("check", std::string());
  r.reason = x.reply.head.value("reason", std::string());
  const size_t n_out = x.reply.head.value("outputs", size_t(0));
  for (size_t i = 0; i < x.reply.tensors.size(); ++i)
    (i < n_out ? r.outputs : r.inputs_after).push_back(std::move(x.reply.tensors[i]));
  return r;
}

TimingResult WorkerRunner::time(const TimingRequest& req) {
  TimingResult r;
  Exchange x = exchange(p_, dead_, timeout_s_,
                        {{"request", "time"},
                         {"options", timing_options_json(req.options)},
                         {"input_sets", req.input_sets},
                         {"value_seed", req.value_seed},
                         {"max_samples", req.max_samples},
                         {"sample_seed", req.sample_seed},
                         {"capturable", req.capturable}});
  if (!x.failure.empty()) {
    r.check = "worker";
    r.reason = x.failure;
    return r;
  }
  r.timing = timing_from(x.reply.head.at("timing"));
  size_t next = 0;
  for (const json& s : x.reply.head.at("samples")) {
    TimedSample sample{s.at("set"), s.at("call"), s.at("value_seed"), {}};
    const size_t n = s.at("outputs");
    for (size_t i = 0; i < n && next < x.reply.tensors.size(); ++i) sample.outputs.push_back(x.reply.tensors[next++]);
    r.samples.push_back(std::move(sample));
  }
  return r;
}

// ---- the worker's side ----

int serve_worker(int in_fd, int out_fd, const std::function<BenchCase(const CaseKey&)>& rebuild,
                 const std::function<std::unique_ptr<AnyOp>(const OpEntry&, const BenchCase&, Device, uint64_t)>& build) {
  ::signal(SIGPIPE, SIG_IGN);
  struct Open {
    BenchCase c;
    Device device;
    std::unique_ptr<OwnedStream> stream;
    std::unique_ptr<StreamGuard> guard;
    std::unique_ptr<AnyOp> op;
    std::unique_ptr<InProcessRunner> runner;
    ~Open() {
      runner.reset();
      op.reset();
      guard.reset();
      stream.reset();
    }
  };
  std::unique_ptr<Open> open;
  for (;;) {
    Frame req;
    try {
      req = receive_frame(in_fd, Clock::time_point{});
    } catch (const WireError& e) {
      return e.eof ? 0 : 3;  // the parent went away
    }
    const std::string what = req.head.value("request", std::string());
    json reply = json::object();
    std::vector<Tensor> tensors;
    try {
      if (what == "bye") return 0;
      if (what == "open") {
        open.reset();
        auto o = std::make_unique<Open>();
        o->c = rebuild(case_key_from(req.head.at("case")));
        o->device = parse_device(req.head.at("device").get<std::string>());
        const std::string variant = req.head.at("variant");
        const OpEntry& entry =
            registry(variant == "candidate" ? Variant::candidate : Variant::baseline).get(o->c.op);
        o->stream = std::make_unique<OwnedStream>(o->device);
        o->guard = std::make_unique<StreamGuard>(o->stream->get());
        o->op = build(entry, o->c, o->device, req.head.at("weight_seed").get<uint64_t>());
        o->runner = std::make_unique<InProcessRunner>(o->c, entry, *o->op, o->device);
        (void)take_guard_violations();  // start clean
        open = std::move(o);
        reply["ok"] = true;
      } else if (what == "close") {
        const Device d = open ? open->device : Device::cpu();
        open.reset();
        if (d.is_cuda()) cuda_empty_cache();
        reply["ok"] = true;
      } else if (what == "call" || what == "time") {
        KBN_CHECK(open != nullptr, "worker: '", what, "' before a case was opened");
        if (what == "call") {
          const std::string kind = req.head.at("kind");
          const CallKind k = kind == "checked" ? CallKind::checked
                             : kind == "rewrite" ? CallKind::rewrite
                                                 : CallKind::plain;
          const CallResult r = open->runner->call(
              k, {req.head.at("seed").get<uint64_t>(), req.head.at("distribution").get<std::string>()});
          reply["check"] = r.check;
          reply["reason"] = r.reason;
          reply["outputs"] = r.outputs.size();
          tensors = r.outputs;
          tensors.insert(tensors.end(), r.inputs_after.begin(), r.inputs_after.end());
        } else {
          TimingRequest t;
          t.options = timing_options_from(req.head.at("options"));
          t.input_sets = req.head.at("input_sets");
          t.value_seed = req.head.at("value_seed");
          t.max_samples = req.head.at("max_samples");
          t.sample_seed = req.head.at("sample_seed");
          t.capturable = req.head.at("capturable");
          const TimingResult r = open->runner->time(t);
          reply["timing"] = timing_json(r.timing);
          reply["samples"] = json::array();
          for (const TimedSample& s : r.samples) {
            reply["samples"].push_back(
                {{"set", s.set}, {"call", s.call}, {"value_seed", s.value_seed}, {"outputs", s.outputs.size()}});
            tensors.insert(tensors.end(), s.outputs.begin(), s.outputs.end());
          }
        }
      } else {
        KBN_FAIL("worker: unknown request '", what, "'");
      }
    } catch (const std::exception& e) {
      reply = json{{"error", e.what()}};
      tensors.clear();
    }
    try {
      send_frame(out_fd, reply, tensors);
    } catch (const WireError&) {
      return 3;
    }
  }
}

}  // namespace kbn::bench
