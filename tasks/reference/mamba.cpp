// Oracle: Mamba-2's ops (vLLM MambaMixer2): the causal depthwise convolution for prefill and decode, the SSM scan
// (the recurrence, and the chunked SSD form the kernels use), its one-token update, and the gated group RMSNorm.
#include <algorithm>
#include <cmath>

#include "kbn/checks.h"
#include "kbn/parallel.h"
#include "reference/reference.h"

namespace kbn::reference {
namespace {

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// A [num_seqs + 1] boundary list: non-decreasing from 0 to num_tokens.
std::vector<int64_t> sequence_starts(const Tensor& query_start_loc, int64_t num_tokens, const char* op) {
  check_defined(query_start_loc, op, "query_start_loc");
  check_rank(query_start_loc, op, "query_start_loc", 1, "[num_seqs + 1]");
  const std::vector<int64_t> q = query_start_loc.to_ints();
  KBN_CHECK(q.size() >= 2 && q.front() == 0 && q.back() == num_tokens, op,
            ": 'query_start_loc' must run from 0 to num_tokens (", num_tokens, ") with at least one sequence, got ",
            query_start_loc.str());
  for (size_t i = 1; i < q.size(); ++i)
    KBN_CHECK(q[i] >= q[i - 1], op, ": 'query_start_loc' must not decrease (entry ", i, ")");
  return q;
}

// Per-sequence flags or slot indices: [num_seqs], each slot in [0, num_slots).
std::vector<int64_t> per_sequence(const Tensor& t, size_t num_seqs, const char* op, const char* arg,
                                  int64_t num_slots = -1) {
  check_defined(t, op, arg);
  check_rank(t, op, arg, 1, "[num_seqs]");
  KBN_CHECK(size_t(t.size(0)) == num_seqs, op, ": '", arg, "' has ", t.size(0), " entries for ", num_seqs,
            " sequences");
  std::vector<int64_t> v = t.to_ints();
  if (num_slots >= 0)
    for (size_t i = 0; i < v.size(); ++i)
      KBN_CHECK(v[i] >= 0 && v[i] < num_slots, op, ": '", arg, "'[", i, "] = ", v[i], " is not a slot in [0, ",
                num_slots, ")");
  return v;
}

std::vector<double> optional_per_head(const Tensor& t, int64_t num_heads, const char* op, const char* arg) {
  if (!t.defined()) return std::vector<double>(size_t(num_heads), 0.0);
  check_cpu(t, op, arg);
  check_rank(t, op, arg, 1, "[num_heads]");
  check_size(t, op, arg, 0, num_heads, "num_heads");
  return t.to_doubles();
}

void write(Tensor& dst, const std::vector<double>& v) {
  dst.copy_(Tensor::from_floats(std::vector<float>(v.begin(), v.end()), dst.shape(), DType::f32));
}

struct ConvArgs {
  int64_t dim, width;
  std::vector<double> w, b;
};

ConvArgs conv_args(const Tensor& weight, const Tensor& bias, int64_t dim, const char* op) {
  check_cpu(weight, op, "weight");
  check_rank(weight, op, "weight", 2, "[dim, width]");
  check_size(weight, op, "weight", 0, dim, "dim");
  ConvArgs a{dim, weight.size(1), weight.to_doubles(), std::vector<double>(size_t(dim), 0.0)};
  KBN_CHECK(a.width >= 2, op, ": the convolution's width (weight.size(1)) must be >= 2, got ", a.width);
  if (bias.defined()) {
    check_cpu(bias, op, "bias");
    check_rank(bias, op, "bias", 1, "[dim]");
    check_size(bias, op, "bias", 0, dim, "dim");
    a.b = bias.to_doubles();
  }
  return a;
}

void check_conv_states(const Tensor& conv_states, const ConvArgs& a, const char* op) {
  check_cpu(conv_states, op, "conv_states");
  check_rank(conv_states, op, "conv_states", 3, "[num_slots, width - 1, dim]");
  check_size(conv_states, op, "conv_states", 1, a.width - 1, "width - 1");
  check_size(conv_states, op, "conv_states", 2, a.dim, "dim");
}

// The shapes the scan and the update share.
struct ScanShape {
  int64_t num_heads, head_dim, n_groups, state_size;
  std::vector<double> A, D, dt_bias;
};

ScanShape scan_shape(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C,
                     const Tensor& D, const Tensor& dt_bias, const char* op) {
  for (const auto& [t, name] : {std::pair{&x, "x"}, {&dt, "dt"}, {&A, "A"}, {&B, "B"}, {&C, "C"}}) {
    check_defined(*t, op, name);
    check_cpu(*t, op, name);
  }
  check_rank(x, op, "x", 3, "[num_tokens, num_heads, head_dim]");
  check_rank(dt, op, "dt", 2, "[num_tokens, num_heads]");
  check_rank(B, op, "B", 3, "[num_tokens, n_groups, state_size]");
  check_rank(C, op, "C", 3, "[num_tokens, n_groups, state_size]");
  ScanShape s{x.size(1), x.size(2), B.size(1), B.size(2), {}, {}, {}};
  check_size(dt, op, "dt", 0, x.size(0), "num_tokens");
  check_size(dt, op, "dt", 1, s.num_heads, "num_heads");
  check_size(B, op, "B", 0, x.size(0), "num_tokens");
  KBN_CHECK(C.shape() == B.shape(), op, ": 'C' ", C.str(), " must match 'B' ", B.str());
  KBN_CHECK(s.n_groups >= 1 && s.num_heads % s.n_groups == 0, op, ": num_heads (", s.num_heads,
            ") must be a multiple of n_groups (", s.n_groups, ")");
  check_rank(A, op, "A", 1, "[num_heads]");
  check_size(A, op, "A", 0, s.num_heads, "num_heads");
  s.A = A.to_doubles();
  s.D = optional_per_head(D, s.num_heads, op, "D");
  s.dt_bias = optional_per_head(dt_bias, s.num_heads, op, "dt_bias");
  return s;
}

double time_step(double dt, double bias, const MambaTimeStep& step) {
  double v = dt + bias;
  if (step.softplus) v = v > 20.0 ? v : std::log1p(std::exp(v));  // torch's softplus (threshold 20)
  return std::min(std::max(v, step.min), step.max);
}

void check_states(const Tensor& states, int64_t num_seqs, const ScanShape& s, const char* op, const char* arg) {
  check_cpu(states, op, arg);
  check_rank(states, op, arg, 4, "[num_seqs, num_heads, head_dim, state_size]");
  check_size(states, op, arg, 0, num_seqs, "num_seqs");
  check_size(states, op, arg, 1, s.num_heads, "num_heads");
  check_size(states, op, arg, 2, s.head_dim, "head_dim");
  check_size(states, op, arg, 3, s.state_size, "state_size");
}

// Everything the two scans read, validated once.
struct ScanInputs {
  ScanShape s;
  std::vector<int64_t> q, has_init;
  std::vector<double> x, dt, B, C, init;
};

ScanInputs scan_inputs(const Tensor& out, const Tensor& final_states, const Tensor& x, const Tensor& dt,
                       const Tensor& A, const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& dt_bias,
                       const Tensor& initial_states, const Tensor& has_initial_state, const Tensor& query_start_loc,
                       int64_t chunk_size, const char* op) {
  ScanInputs in;
  in.s = scan_shape(x, dt, A, B, C, D, dt_bias, op);
  KBN_CHECK(chunk_size >= 1 && (chunk_size & (chunk_size - 1)) == 0, op, ": chunk_size must be a power of two, got ",
            chunk_size);
  KBN_CHECK(out.shape() == x.shape(), op, ": 'out' ", out.str(), " must match 'x' ", x.str());
  in.q = sequence_starts(query_start_loc, x.size(0), op);
  const int64_t num_seqs = int64_t(in.q.size()) - 1;
  check_states(final_states, num_seqs, in.s, op, "final_states");
  in.has_init = per_sequence(has_initial_state, size_t(num_seqs), op, "has_initial_state");
  bool any = false;
  for (int64_t h : in.has_init) any = any || h != 0;
  if (any) {
    check_defined(initial_states, op, "initial_states");
    check_states(initial_states, num_seqs, in.s, op, "initial_states");
    in.init = initial_states.to_doubles();
  }
  in.x = x.to_doubles();
  in.dt = dt.to_doubles();
  in.B = B.to_doubles();
  in.C = C.to_doubles();
  return in;
}

}  // namespace

void causal_conv1d_fn(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& conv_states,
                      const Tensor& has_initial_state, const Tensor& cache_indices, const Tensor& query_start_loc,
                      bool silu_act) {
  const char* op = "causal_conv1d_fn";
  check_defined(x, op, "x");
  check_cpu(x, op, "x");
  check_rank(x, op, "x", 2, "[num_tokens, dim]");
  KBN_CHECK(out.shape() == x.shape(), op, ": 'out' ", out.str(), " must match 'x' ", x.str());
  const int64_t T = x.size(0), dim = x.size(1);
  const ConvArgs a = conv_args(weight, bias, dim, op);
  check_conv_states(conv_states, a, op);
  const std::vector<int64_t> q = sequence_starts(query_start_loc, T, op);
  const size_t num_seqs = q.size() - 1;
  const std::vector<int64_t> has_init = per_sequence(has_initial_state, num_seqs, op, "has_initial_state");
  const std::vector<int64_t> slot = per_sequence(cache_indices, num_seqs, op, "cache_indices", conv_states.size(0));
  const std::vector<double> xv = x.to_doubles();
  std::vector<double> st = conv_states.to_doubles(), o(size_t(T * dim));
  const int64_t W = a.width, H = W - 1;
  std::vector<double> buf;
  for (size_t s = 0; s < num_seqs; ++s) {
    const int64_t begin = q[s], len = q[s + 1] - q[s];
    for (int64_t c = 0; c < dim; ++c) {
      // The sequence's inputs on this channel, after the width - 1 before them.
      buf.assign(size_t(H + len), 0.0);
      for (int64_t k = 0; k < H; ++k) buf[size_t(k)] = has_init[s] ? st[size_t((slot[s] * H + k) * dim + c)] : 0.0;
      for (int64_t t = 0; t < len; ++t) buf[size_t(H + t)] = xv[size_t((begin + t) * dim + c)];
      for (int64_t t = 0; t < len; ++t) {
        double acc = a.b[size_t(c)];
        for (int64_t k = 0; k < W; ++k) acc += a.w[size_t(c * W + k)] * buf[size_t(t + k)];
        o[size_t((begin + t) * dim + c)] = silu_act ? silu(acc) : acc;
      }
      for (int64_t k = 0; k < H; ++k) st[size_t((slot[s] * H + k) * dim + c)] = buf[size_t(len + k)];
    }
  }
  write(out, o);
  write(conv_states, st);
}

void causal_conv1d_update(Tensor& out, const Tensor& x, Tensor& conv_states, const Tensor& weight, const Tensor& bias,
                          const Tensor& conv_state_indices, bool silu_act) {
  const char* op = "causal_conv1d_update";
  check_defined(x, op, "x");
  check_cpu(x, op, "x");
  check_rank(x, op, "x", 2, "[batch, dim]");
  KBN_CHECK(out.shape() == x.shape(), op, ": 'out' ", out.str(), " must match 'x' ", x.str());
  const int64_t batch = x.size(0), dim = x.size(1);
  const ConvArgs a = conv_args(weight, bias, dim, op);
  check_conv_states(conv_states, a, op);
  const std::vector<int64_t> slot =
      per_sequence(conv_state_indices, size_t(batch), op, "conv_state_indices", conv_states.size(0));
  const std::vector<double> xv = x.to_doubles();
  std::vector<double> st = conv_states.to_doubles(), o(size_t(batch * dim));
  const int64_t W = a.width, H = W - 1;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t c = 0; c < dim; ++c) {
      double* state = &st[size_t(slot[size_t(b)] * H * dim + c)];  // entry k at state[k * dim]
      double acc = a.b[size_t(c)];
      for (int64_t k = 0; k < H; ++k) acc += a.w[size_t(c * W + k)] * state[k * dim];
      const double xn = xv[size_t(b * dim + c)];
      acc += a.w[size_t(c * W + H)] * xn;
      for (int64_t k = 0; k + 1 < H; ++k) state[k * dim] = state[(k + 1) * dim];
      state[(H - 1) * dim] = xn;
      o[size_t(b * dim + c)] = silu_act ? silu(acc) : acc;
    }
  write(out, o);
  write(conv_states, st);
}

void mamba_chunk_scan_combined(Tensor& out, Tensor& final_states, const Tensor& x, const Tensor& dt, const Tensor& A,
                               const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& dt_bias,
                               const MambaTimeStep& step, const Tensor& initial_states, const Tensor& has_initial_state,
                               const Tensor& query_start_loc, int64_t chunk_size) {
  const char* op = "mamba_chunk_scan_combined";
  const ScanInputs in = scan_inputs(out, final_states, x, dt, A, B, C, D, dt_bias, initial_states, has_initial_state,
                                    query_start_loc, chunk_size, op);
  const ScanShape& s = in.s;
  const int64_t nh = s.num_heads, P = s.head_dim, G = s.n_groups, N = s.state_size, heads_per_group = nh / G;
  const int64_t num_seqs = int64_t(in.q.size()) - 1;
  std::vector<double> y(in.x.size()), fin(size_t(num_seqs * nh * P * N));
  // Every (sequence, head) is its own recurrence, writing its own rows: threads take ranges of them.
  const int64_t work = (in.q.back() / std::max<int64_t>(num_seqs, 1) + 1) * P * N * 3;
  parallel_for(num_seqs * nh, grain_for(work), [&](int64_t begin, int64_t end) {
    std::vector<double> S(size_t(P * N));
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t q = pair / nh, h = pair % nh, g = h / heads_per_group;
      for (int64_t i = 0; i < P * N; ++i)
        S[size_t(i)] = in.has_init[size_t(q)] ? in.init[size_t((q * nh + h) * P * N + i)] : 0.0;
      for (int64_t t = in.q[size_t(q)]; t < in.q[size_t(q) + 1]; ++t) {
        const double d = time_step(in.dt[size_t(t * nh + h)], s.dt_bias[size_t(h)], step);
        const double decay = std::exp(d * s.A[size_t(h)]);
        const double* xt = &in.x[size_t((t * nh + h) * P)];
        const double* Bt = &in.B[size_t((t * G + g) * N)];
        const double* Ct = &in.C[size_t((t * G + g) * N)];
        for (int64_t p = 0; p < P; ++p) {
          double acc = 0;
          for (int64_t n = 0; n < N; ++n) {
            double& v = S[size_t(p * N + n)];
            v = decay * v + d * xt[p] * Bt[n];
            acc += v * Ct[n];
          }
          y[size_t((t * nh + h) * P + p)] = acc + s.D[size_t(h)] * xt[p];
        }
      }
      std::copy(S.begin(), S.end(), fin.begin() + (q * nh + h) * P * N);
    }
  });
  write(out, y);
  write(final_states, fin);
}

void ssd_chunked_scan(Tensor& out, Tensor& final_states, const Tensor& x, const Tensor& dt, const Tensor& A,
                      const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& dt_bias,
                      const MambaTimeStep& step, const Tensor& initial_states, const Tensor& has_initial_state,
                      const Tensor& query_start_loc, int64_t chunk_size) {
  const char* op = "ssd_chunked_scan";
  const ScanInputs in = scan_inputs(out, final_states, x, dt, A, B, C, D, dt_bias, initial_states, has_initial_state,
                                    query_start_loc, chunk_size, op);
  const ScanShape& s = in.s;
  const int64_t nh = s.num_heads, P = s.head_dim, G = s.n_groups, N = s.state_size, heads_per_group = nh / G;
  const int64_t num_seqs = int64_t(in.q.size()) - 1, L = chunk_size;
  std::vector<double> y(in.x.size()), fin(size_t(num_seqs * nh * P * N));
  // Every (sequence, head) is its own scan, writing its own rows: threads take ranges of them.
  const int64_t work = (in.q.back() / std::max<int64_t>(num_seqs, 1) + 1) * (P * N * 3 + L * (N + P));
  parallel_for(num_seqs * nh, grain_for(work), [&](int64_t begin, int64_t end) {
    std::vector<double> S(size_t(P * N)), next(size_t(P * N));
    std::vector<double> cs, dts;  // per token of the piece: inclusive cumulative sum of dt' A, and dt'
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t q = pair / nh, h = pair % nh, g = h / heads_per_group;
      const double Ah = s.A[size_t(h)];
      for (int64_t i = 0; i < P * N; ++i)
        S[size_t(i)] = in.has_init[size_t(q)] ? in.init[size_t((q * nh + h) * P * N + i)] : 0.0;
      // Chunks lie on the packed token index (as vLLM's seq_idx / chunk_offsets): a sequence covers pieces of them.
      for (int64_t a = in.q[size_t(q)]; a < in.q[size_t(q) + 1];) {
        const int64_t b = std::min(in.q[size_t(q) + 1], (a / L + 1) * L), n_tok = b - a;
        cs.assign(size_t(n_tok), 0.0);
        dts.assign(size_t(n_tok), 0.0);
        double run = 0;
        for (int64_t i = 0; i < n_tok; ++i) {
          dts[size_t(i)] = time_step(in.dt[size_t((a + i) * nh + h)], s.dt_bias[size_t(h)], step);
          run += dts[size_t(i)] * Ah;
          cs[size_t(i)] = run;
        }
        for (int64_t i = 0; i < n_tok; ++i) {
          const int64_t t = a + i;
          const double* Ct = &in.C[size_t((t * G + g) * N)];
          // Inter-chunk: the entering state, decayed to t, read by C_t.
          const double in_decay = std::exp(cs[size_t(i)]);
          for (int64_t p = 0; p < P; ++p) {
            double acc = 0;
            for (int64_t n = 0; n < N; ++n) acc += S[size_t(p * N + n)] * Ct[n];
            y[size_t((t * nh + h) * P + p)] = in_decay * acc + s.D[size_t(h)] * in.x[size_t((t * nh + h) * P + p)];
          }
          // Intra-chunk: (C_t . B_u) exp(cs_t - cs_u) dt'_u x_u for u <= t.
          for (int64_t j = 0; j <= i; ++j) {
            const int64_t u = a + j;
            const double* Bu = &in.B[size_t((u * G + g) * N)];
            double cb = 0;
            for (int64_t n = 0; n < N; ++n) cb += Ct[n] * Bu[n];
            const double wgt = cb * std::exp(cs[size_t(i)] - cs[size_t(j)]) * dts[size_t(j)];
            for (int64_t p = 0; p < P; ++p) y[size_t((t * nh + h) * P + p)] += wgt * in.x[size_t((u * nh + h) * P + p)];
          }
        }
        // The state leaving the piece.
        const double total = std::exp(cs.back());
        for (int64_t i = 0; i < P * N; ++i) next[size_t(i)] = total * S[size_t(i)];
        for (int64_t j = 0; j < n_tok; ++j) {
          const int64_t u = a + j;
          const double wgt = std::exp(cs.back() - cs[size_t(j)]) * dts[size_t(j)];
          const double* Bu = &in.B[size_t((u * G + g) * N)];
          for (int64_t p = 0; p < P; ++p) {
            const double xp = wgt * in.x[size_t((u * nh + h) * P + p)];
            for (int64_t n = 0; n < N; ++n) next[size_t(p * N + n)] += xp * Bu[n];
          }
        }
        S.swap(next);
        a = b;
      }
      std::copy(S.begin(), S.end(), fin.begin() + (q * nh + h) * P * N);
    }
  });
  write(out, y);
  write(final_states, fin);
}

void selective_state_update(Tensor& out, Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A,
                            const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& dt_bias,
                            const MambaTimeStep& step, const Tensor& state_batch_indices) {
  const char* op = "selective_state_update";
  const ScanShape s = scan_shape(x, dt, A, B, C, D, dt_bias, op);
  KBN_CHECK(out.shape() == x.shape(), op, ": 'out' ", out.str(), " must match 'x' ", x.str());
  check_cpu(state, op, "state");
  check_rank(state, op, "state", 4, "[num_slots, num_heads, head_dim, state_size]");
  check_size(state, op, "state", 1, s.num_heads, "num_heads");
  check_size(state, op, "state", 2, s.head_dim, "head_dim");
  check_size(state, op, "state", 3, s.state_size, "state_size");
  const int64_t batch = x.size(0), nh = s.num_heads, P = s.head_dim, G = s.n_groups, N = s.state_size;
  const std::vector<int64_t> slot =
      per_sequence(state_batch_indices, size_t(batch), op, "state_batch_indices", state.size(0));
  const std::vector<double> xv = x.to_doubles(), dtv = dt.to_doubles(), Bv = B.to_doubles(), Cv = C.to_doubles();
  std::vector<double> st = state.to_doubles(), y(xv.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / (nh / G);
      const double d = time_step(dtv[size_t(b * nh + h)], s.dt_bias[size_t(h)], step);
      const double decay = std::exp(d * s.A[size_t(h)]);
      double* S = &st[size_t((slot[size_t(b)] * nh + h) * P * N)];
      for (int64_t p = 0; p < P; ++p) {
        const double xp = xv[size_t((b * nh + h) * P + p)];
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) {
          double& v = S[p * N + n];
          v = decay * v + d * xp * Bv[size_t((b * G + g) * N + n)];
          acc += v * Cv[size_t((b * G + g) * N + n)];
        }
        y[size_t((b * nh + h) * P + p)] = acc + s.D[size_t(h)] * xp;
      }
    }
  write(out, y);
  write(state, st);
}

void rms_norm_gated(Tensor& out, const Tensor& x, const Tensor& gate, const Tensor& weight, int64_t group_size,
                    double eps) {
  const char* op = "rms_norm_gated";
  for (const auto& [t, name] : {std::pair{&x, "x"}, {&gate, "gate"}, {&weight, "weight"}}) {
    check_defined(*t, op, name);
    check_cpu(*t, op, name);
  }
  check_rank(x, op, "x", 2, "[num_tokens, hidden]");
  KBN_CHECK(gate.shape() == x.shape(), op, ": 'gate' ", gate.str(), " must match 'x' ", x.str());
  KBN_CHECK(out.shape() == x.shape(), op, ": 'out' ", out.str(), " must match 'x' ", x.str());
  check_rank(weight, op, "weight", 1, "[hidden]");
  const int64_t T = x.size(0), H = x.size(1);
  check_size(weight, op, "weight", 0, H, "hidden");
  KBN_CHECK(group_size >= 1 && H % group_size == 0, op, ": group_size (", group_size, ") must divide hidden (", H, ")");
  const std::vector<double> xv = x.to_doubles(), gv = gate.to_doubles(), w = weight.to_doubles();
  std::vector<double> o(size_t(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g0 = 0; g0 < H; g0 += group_size) {
      double ss = 0;
      for (int64_t i = g0; i < g0 + group_size; ++i) {
        const double v = xv[size_t(t * H + i)] * silu(gv[size_t(t * H + i)]);
        o[size_t(t * H + i)] = v;
        ss += v * v;
      }
      const double inv = 1.0 / std::sqrt(ss / double(group_size) + eps);
      for (int64_t i = g0; i < g0 + group_size; ++i) o[size_t(t * H + i)] *= inv * w[size_t(i)];
    }
  write(out, o);
}

}  // namespace kbn::reference
