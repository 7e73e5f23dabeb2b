#include "L2/mamba_mixer2.h"

#include <cmath>
#include <vector>

#include "kbn/comm.h"
#include "kbn/error.h"
#include "kbn/forward_context.h"
#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

WeightLoader mamba_v2_sharded_weight_loader(std::string what, std::vector<MambaShardSegment> segments, int tp_size,
                                            int tp_rank) {
  return [what = std::move(what), segments = std::move(segments), tp_size, tp_rank](Tensor& param, const Tensor& loaded,
                                                                                    std::string_view shard_id) {
    KBN_CHECK(shard_id.empty(), what, ": unexpected shard id '", std::string(shard_id), "' (one fused tensor)");
    int64_t full = 0, local = 0;
    std::string layout;
    for (const MambaShardSegment& s : segments) {
      full += s.rows;
      local += s.replicated ? s.rows : s.rows / tp_size;
      layout += (layout.empty() ? "" : " | ") + s.name + " " + std::to_string(s.rows);
    }
    KBN_CHECK(loaded.dim() == param.dim() && loaded.dim() >= 1 && loaded.size(0) == full, what,
              ": the checkpoint tensor is ", loaded.str(), ", expected ", full, " rows (", layout, ") and ",
              param.dim(), " dimensions");
    for (int64_t d = 1; d < param.dim(); ++d)
      KBN_CHECK(loaded.size(d) == param.size(d), what, ": the checkpoint tensor is ", loaded.str(), ", dimension ", d,
                " must be ", param.size(d));
    KBN_CHECK(param.size(0) == local, what, ": parameter ", param.str(), " does not hold this rank's ", local, " rows");
    int64_t src = 0, dst = 0;
    for (const MambaShardSegment& s : segments) {
      const int64_t n = s.replicated ? s.rows : s.rows / tp_size;
      const int64_t from = src + (s.replicated ? 0 : int64_t(tp_rank) * n);
      Tensor part = loaded.slice(0, from, from + n);
      if (part.dtype() != param.dtype()) part = part.to(Device::cpu()).to(param.dtype());
      param.slice(0, dst, dst + n).copy_(part);
      src += s.rows;
      dst += n;
    }
  };
}

Mamba2Shard Mamba2Shard::of(int64_t num_heads, int64_t n_groups, int64_t head_dim, int64_t intermediate_size,
                            const std::string& prefix) {
  KBN_CHECK(num_heads > 0 && head_dim > 0 && num_heads * head_dim == intermediate_size, "MambaMixer2 (", prefix,
            "): argument 'intermediate_size' (", intermediate_size, ") must equal num_heads * head_dim (", num_heads,
            " x ", head_dim, ")");
  KBN_CHECK(n_groups > 0 && num_heads % n_groups == 0, "MambaMixer2 (", prefix, "): argument 'n_groups' (", n_groups,
            ") must divide num_heads (", num_heads, ")");
  const ParallelState& ps = parallel_state();
  const int tp = ps.tp_size;
  KBN_CHECK(num_heads % tp == 0, "MambaMixer2 (", prefix, "): argument 'num_heads' (", num_heads,
            ") must be divisible by the tensor-parallel size ", tp, " (each rank holds num_heads / tp whole heads)");
  KBN_CHECK(n_groups == 1 || n_groups % tp == 0, "MambaMixer2 (", prefix, "): argument 'n_groups' (", n_groups,
            ") must be 1 (every rank holds the group) or divisible by the tensor-parallel size ", tp,
            " (each rank holds the groups of its num_heads / tp = ", num_heads / tp, " of the ", num_heads, " heads)");
  Mamba2Shard s;
  s.tp_size = tp;
  s.tp_rank = ps.tp_rank;
  s.num_heads = num_heads / tp;
  s.replicated_groups = tp > 1 && n_groups == 1;
  s.n_groups = s.replicated_groups ? n_groups : n_groups / tp;
  s.intermediate_size = s.num_heads * head_dim;
  return s;
}

namespace {

int64_t local_rows(const std::vector<MambaShardSegment>& segments, int tp) {
  int64_t n = 0;
  for (const MambaShardSegment& s : segments) n += s.replicated ? s.rows : s.rows / tp;
  return n;
}

}  // namespace

MambaInProj::MambaInProj(int64_t hidden_size, const std::vector<MambaShardSegment>& segments, bool bias,
                         const ParamOptions& opts, const std::string& prefix)
    // This rank's rows times tp, so that the base's even split gives this rank's size (replicated segments included).
    : ColumnParallelLinear(hidden_size, local_rows(segments, parallel_state().tp_size) * parallel_state().tp_size, bias,
                           false, opts, prefix) {
  const int tp = parallel_state().tp_size, rank = parallel_state().tp_rank;
  set_weight_loader("weight", mamba_v2_sharded_weight_loader(prefix + ".weight", segments, tp, rank));
  if (bias) set_weight_loader("bias", mamba_v2_sharded_weight_loader(prefix + ".bias", segments, tp, rank));
}

namespace {

// in_proj's segments [z | x | B | C | dt], of the whole model's sizes.
std::vector<MambaShardSegment> in_proj_segments(const Mamba2Shard& sh, int64_t I, int64_t GN, int64_t num_heads) {
  return {{"z", I, false},
          {"x", I, false},
          {"B", GN, sh.replicated_groups},
          {"C", GN, sh.replicated_groups},
          {"dt", num_heads, false}};
}

}  // namespace

MambaMixer2::MambaMixer2(int64_t hidden_size, int64_t ssm_state_size, int64_t conv_kernel_size,
                         int64_t intermediate_size, bool use_conv_bias, bool use_bias, int64_t n_groups,
                         int64_t num_heads, int64_t head_dim, double rms_norm_eps, int64_t chunk_size, double dt_min,
                         double dt_max, const std::string& prefix, const ParamOptions& opts)
    : shard_(Mamba2Shard::of(num_heads, n_groups, head_dim, intermediate_size, prefix)),
      in_proj(hidden_size, in_proj_segments(shard_, intermediate_size, n_groups * ssm_state_size, num_heads), use_bias,
              opts, prefix + ".in_proj"),
      norm(shard_.replicated_groups ? intermediate_size : shard_.intermediate_size, shard_.n_groups, rms_norm_eps,
           opts),
      out_proj(intermediate_size, hidden_size, use_bias, true, false, true, opts, prefix + ".out_proj"),
      hidden_size_(hidden_size),
      state_size_(ssm_state_size),
      conv_kernel_(conv_kernel_size),
      num_heads_(shard_.num_heads),
      head_dim_(head_dim),
      layer_idx_(extract_layer_index(prefix)),
      prefix_(prefix),
      conv_fn_("silu"),
      conv_update_("silu"),
      scan_(chunk_size, true, dt_min, dt_max),
      state_update_(true, dt_min, dt_max) {
  KBN_CHECK(conv_kernel_size >= 2, "MambaMixer2 (", prefix, "): argument 'conv_kernel_size' must be >= 2, got ",
            conv_kernel_size);
  const int tp = shard_.tp_size, rank = shard_.tp_rank;
  const int64_t I = intermediate_size, GN = n_groups * ssm_state_size;
  register_module("in_proj", &in_proj);
  const std::vector<MambaShardSegment> conv_segments = {
      {"x", I, false}, {"B", GN, shard_.replicated_groups}, {"C", GN, shard_.replicated_groups}};
  const int64_t cd = conv_dim(), full_cd = I + 2 * GN;
  conv_weight = Tensor::zeros({cd, conv_kernel_size}, opts.dtype, opts.device);
  register_parameter("conv1d.weight", &conv_weight, InitKind::normal,
                     [full_cd, conv_kernel_size,
                      load = mamba_v2_sharded_weight_loader(prefix + ".conv1d.weight", conv_segments, tp, rank)](
                         Tensor& param, const Tensor& loaded, std::string_view shard) {
                       // HF and vLLM checkpoints hold the depthwise conv as nn.Conv1d's [conv_dim, 1, width].
                       KBN_CHECK(loaded.dim() == 3 && loaded.size(0) == full_cd && loaded.size(1) == 1 &&
                                     loaded.size(2) == conv_kernel_size,
                                 "conv1d.weight: expected [", full_cd, ", 1, ", conv_kernel_size, "], got ",
                                 loaded.str());
                       load(param, loaded.contiguous().view({full_cd, conv_kernel_size}), shard);
                     });
  if (use_conv_bias) {
    conv_bias = Tensor::zeros({cd}, opts.dtype, opts.device);
    register_parameter("conv1d.bias", &conv_bias, InitKind::zeros,
                       mamba_v2_sharded_weight_loader(prefix + ".conv1d.bias", conv_segments, tp, rank));
  }
  const std::vector<MambaShardSegment> per_head = {{"heads", num_heads, false}};
  A_log = Tensor::zeros({num_heads_}, DType::f32, opts.device);
  D = Tensor::zeros({num_heads_}, DType::f32, opts.device);
  dt_bias = Tensor::zeros({num_heads_}, DType::f32, opts.device);
  register_parameter("A_log", &A_log, InitKind::normal,
                     mamba_v2_sharded_weight_loader(prefix + ".A_log", per_head, tp, rank));
  register_parameter("D", &D, InitKind::ones, mamba_v2_sharded_weight_loader(prefix + ".D", per_head, tp, rank));
  register_parameter("dt_bias", &dt_bias, InitKind::normal,
                     mamba_v2_sharded_weight_loader(prefix + ".dt_bias", per_head, tp, rank));
  // The norm's weight is registered here rather than through the norm module, whose exact-shape loader cannot take
  // this rank's channels of the checkpoint's [I] (or, with replicated groups, must take all of them).
  register_parameter(
      "norm.weight", &norm.weight, InitKind::ones,
      mamba_v2_sharded_weight_loader(prefix + ".norm.weight", {{"channels", I, shard_.replicated_groups}}, tp, rank));
  register_module("out_proj", &out_proj);
}

void MambaMixer2::process_weights_after_loading() {
  std::vector<float> a;
  for (double v : A_log.to_doubles()) a.push_back(float(-std::exp(v)));
  A = Tensor::from_floats(a, {num_heads_}).to(A_log.device());
}

Tensor MambaMixer2::gated_norm(const Tensor& y, const Tensor& gate) {
  if (!shard_.replicated_groups) return norm.forward(y, gate);
  // One group spans every rank's channels, so its rms needs every rank's y * silu(z). vLLM all-reduces the local sums
  // of squares; this all-gathers y and z instead and runs the same norm op on the whole row on every rank, keeping
  // this rank's slice. Why: the op stays the one TP 1 runs (no kernel taking an outside sum of squares), and each row
  // is reduced in the same order as at TP 1, so the norm's output is bit-identical to TP 1's for the same inputs. The
  // price is a gather of 2 T I elements per layer (and the norm's work done tp times), paid only by models with one
  // group (Mamba-Codestral has 8, which shard and take the local path).
  const ParallelState& ps = parallel_state();
  KBN_CHECK(ps.comm != nullptr, "MambaMixer2 (", prefix_, "): tensor-parallel size ", ps.tp_size, " but rank ",
            ps.tp_rank, " has no communicator (run the model inside engine::TensorParallelGroup)");
  const int64_t T = y.size(0), L = y.size(1), tp = ps.tp_size;
  // One collective for both: [2, T, L] with y at 0 and the gate at 1.
  Tensor local = Tensor::empty({2, T, L}, y.dtype(), y.device());
  local.select(0, 0).copy_(y);
  local.select(0, 1).copy_(gate);
  const Tensor all = ps.comm->all_gather(local);  // [tp, 2, T, L]
  // Rank r's channels are columns [r L, (r + 1) L) of the full row: [tp, 2, T, L] -> [2, T, tp, L] = [2, T, I].
  const Tensor full = all.transpose(0, 1).transpose(1, 2).contiguous().view({2, T, tp * L});
  const Tensor out = norm.forward(full.select(0, 0), full.select(0, 1));  // [T, I]
  return out.slice(1, ps.tp_rank * L, (ps.tp_rank + 1) * L);
}

LayerCacheSpec MambaMixer2::cache_spec(DType dtype) const {
  LayerCacheSpec s;
  s.kind = LayerCacheSpec::Kind::state;
  s.dtype = dtype;
  s.state_shapes = {{conv_kernel_ - 1, conv_dim()}, {num_heads_, head_dim_, state_size_}};
  return s;
}

Tensor MambaMixer2::forward(const Tensor& hidden_states) {
  KBN_CHECK(hidden_states.dim() == 2 && hidden_states.size(1) == hidden_size_, "MambaMixer2 (", prefix_,
            "): argument 'hidden_states' must be [num_tokens, ", hidden_size_, "], got ", hidden_states.str());
  return forward_proj(in_proj.forward(hidden_states).first);
}

Tensor MambaMixer2::forward_proj(const Tensor& proj) {
  KBN_CHECK(A.defined(), "MambaMixer2 (", prefix_,
            "): A = -exp(A_log) is not computed; call process_weights_after_loading() after loading the weights");
  const ForwardContext& ctx = get_forward_context();
  KBN_CHECK(ctx.attn_metadata != nullptr && ctx.kv_caches != nullptr, "MambaMixer2 (", prefix_,
            "): the forward context has no step metadata or caches");
  const AttentionMetadata& md = *ctx.attn_metadata;
  KBN_CHECK(layer_idx_ < int64_t(ctx.kv_caches->size()), "MambaMixer2 (", prefix_, "): layer ", layer_idx_,
            " has no cache (", ctx.kv_caches->size(), " layers of caches)");
  const KVCache& cache = (*ctx.kv_caches)[size_t(layer_idx_)];
  ctx.entering_layer_cache(layer_idx_);
  KBN_CHECK(cache.states.size() == 2, "MambaMixer2 (", prefix_, "): layer ", layer_idx_,
            " must hold a conv and an SSM state, has ", cache.states.size(), " state tensors");
  const int64_t P = md.num_prefills, Tp = md.num_prefill_tokens, Dn = md.num_decodes, T = md.num_tokens();
  const int64_t proj_cols = shard_.intermediate_size + conv_dim() + num_heads_;
  KBN_CHECK(proj.dim() == 2 && proj.size(0) == T && proj.size(1) == proj_cols, "MambaMixer2 (", prefix_,
            "): in_proj's output must be [num_tokens = ", T, ", ", proj_cols, "], got ", proj.str());
  KBN_CHECK(md.state_indices.defined() && md.has_initial_state.defined() && md.state_indices.size(0) == P + Dn,
            "MambaMixer2 (", prefix_, "): the step metadata carries no state slots for its ", P + Dn,
            " sequences (AttentionMetadata::state_indices / has_initial_state)");
  const Tensor& conv_state = cache.states[0];
  const Tensor& ssm_state = cache.states[1];

  // This rank's sizes (see the top of the header).
  const int64_t I = shard_.intermediate_size, G = shard_.n_groups, cd = conv_dim(), GN = G * state_size_;
  const Tensor gate = proj.slice(1, 0, I);
  const Tensor xBC = proj.slice(1, I, I + cd);
  const Tensor dt = proj.slice(1, I + cd, I + cd + num_heads_);

  // The conv outputs viewed as x [n, heads, head_dim], B and C [n, G, N] (token stride conv_dim).
  auto split = [&](const Tensor& conv, Tensor& x, Tensor& B, Tensor& C) {
    const int64_t n = conv.size(0), off = conv.offset();
    x = conv.as_strided({n, num_heads_, head_dim_}, {cd, head_dim_, 1}, off);
    B = conv.as_strided({n, G, state_size_}, {cd, state_size_, 1}, off + I);
    C = conv.as_strided({n, G, state_size_}, {cd, state_size_, 1}, off + I + GN);
  };
  Tensor y_prefill, y_decode;
  if (P > 0) {
    const Tensor idx = md.state_indices.slice(0, 0, P), has = md.has_initial_state.slice(0, 0, P);
    const Tensor conv =
        conv_fn_.forward(xBC.slice(0, 0, Tp), conv_weight, conv_bias, conv_state, has, idx, md.query_start_loc);
    Tensor x, B, C;
    split(conv, x, B, C);
    y_prefill = scan_.forward(x, dt.slice(0, 0, Tp), A, B, C, D, dt_bias, ssm_state, has, idx, md.query_start_loc);
  }
  if (Dn > 0) {
    const Tensor idx = md.state_indices.slice(0, P, P + Dn);
    const Tensor conv = conv_update_.forward(xBC.slice(0, Tp, T), conv_state, conv_weight, conv_bias, idx);
    Tensor x, B, C;
    split(conv, x, B, C);
    y_decode = state_update_.forward(ssm_state, x, dt.slice(0, Tp, T), A, B, C, D, dt_bias, idx);
  }
  Tensor y;  // [T, num_heads, head_dim]
  if (Dn == 0) {
    y = y_prefill;
  } else if (P == 0) {
    y = y_decode;
  } else {
    y = Tensor::empty({T, num_heads_, head_dim_}, proj.dtype(), proj.device());
    y.slice(0, 0, Tp).copy_(y_prefill);
    y.slice(0, Tp, T).copy_(y_decode);
  }
  const Tensor g = gated_norm(y.view({T, I}), gate);
  return out_proj.forward(g).first;
}

}  // namespace kbn::KBN_VARIANT
