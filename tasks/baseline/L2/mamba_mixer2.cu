#include "L2/mamba_mixer2.h"

#include <cmath>
#include <vector>

#include "kbn/error.h"
#include "kbn/forward_context.h"
#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

MambaMixer2::MambaMixer2(int64_t hidden_size, int64_t ssm_state_size, int64_t conv_kernel_size,
                         int64_t intermediate_size, bool use_conv_bias, bool use_bias, int64_t n_groups,
                         int64_t num_heads, int64_t head_dim, double rms_norm_eps, int64_t chunk_size, double dt_min,
                         double dt_max, const std::string& prefix, const ParamOptions& opts)
    : in_proj(hidden_size, intermediate_size + (intermediate_size + 2 * n_groups * ssm_state_size) + num_heads,
              use_bias, false, opts, prefix + ".in_proj"),
      norm(intermediate_size, n_groups, rms_norm_eps, opts),
      out_proj(intermediate_size, hidden_size, use_bias, true, false, true, opts, prefix + ".out_proj"),
      hidden_size_(hidden_size),
      state_size_(ssm_state_size),
      conv_kernel_(conv_kernel_size),
      intermediate_size_(intermediate_size),
      n_groups_(n_groups),
      num_heads_(num_heads),
      head_dim_(head_dim),
      layer_idx_(extract_layer_index(prefix)),
      prefix_(prefix),
      conv_fn_("silu"),
      conv_update_("silu"),
      scan_(chunk_size, true, dt_min, dt_max),
      state_update_(true, dt_min, dt_max) {
  KBN_CHECK(parallel_state().tp_size == 1, "MambaMixer2 (", prefix,
            "): tensor-parallel Mamba-2 is not built (its in_proj splits z, xBC and dt separately); run with --tp 1");
  KBN_CHECK(num_heads > 0 && head_dim > 0 && num_heads * head_dim == intermediate_size, "MambaMixer2 (", prefix,
            "): argument 'intermediate_size' (", intermediate_size, ") must equal num_heads * head_dim (", num_heads,
            " x ", head_dim, ")");
  KBN_CHECK(n_groups > 0 && num_heads % n_groups == 0, "MambaMixer2 (", prefix, "): argument 'n_groups' (", n_groups,
            ") must divide num_heads (", num_heads, ")");
  KBN_CHECK(conv_kernel_size >= 2, "MambaMixer2 (", prefix, "): argument 'conv_kernel_size' must be >= 2, got ",
            conv_kernel_size);
  register_module("in_proj", &in_proj);
  const int64_t cd = conv_dim();
  conv_weight = Tensor::zeros({cd, conv_kernel_size}, opts.dtype, opts.device);
  register_parameter("conv1d.weight", &conv_weight, InitKind::normal,
                     [cd, conv_kernel_size](Tensor& param, const Tensor& loaded, std::string_view shard) {
                       // HF and vLLM checkpoints hold the depthwise conv as nn.Conv1d's [conv_dim, 1, width].
                       KBN_CHECK(loaded.dim() == 3 && loaded.size(0) == cd && loaded.size(1) == 1 &&
                                     loaded.size(2) == conv_kernel_size,
                                 "conv1d.weight: expected [", cd, ", 1, ", conv_kernel_size, "], got ", loaded.str());
                       default_weight_loader(param, loaded.contiguous().view({cd, conv_kernel_size}), shard);
                     });
  if (use_conv_bias) {
    conv_bias = Tensor::zeros({cd}, opts.dtype, opts.device);
    register_parameter("conv1d.bias", &conv_bias, InitKind::zeros);
  }
  A_log = Tensor::zeros({num_heads}, DType::f32, opts.device);
  D = Tensor::zeros({num_heads}, DType::f32, opts.device);
  dt_bias = Tensor::zeros({num_heads}, DType::f32, opts.device);
  register_parameter("A_log", &A_log);
  register_parameter("D", &D, InitKind::ones);
  register_parameter("dt_bias", &dt_bias);
  register_module("norm", &norm);
  register_module("out_proj", &out_proj);
}

void MambaMixer2::process_weights_after_loading() {
  std::vector<float> a;
  for (double v : A_log.to_doubles()) a.push_back(float(-std::exp(v)));
  A = Tensor::from_floats(a, {num_heads_}).to(A_log.device());
}

LayerCacheSpec MambaMixer2::cache_spec(DType dtype) const {
  LayerCacheSpec s;
  s.kind = LayerCacheSpec::Kind::state;
  s.dtype = dtype;
  s.state_shapes = {{conv_kernel_ - 1, conv_dim()}, {num_heads_, head_dim_, state_size_}};
  return s;
}

Tensor MambaMixer2::forward(const Tensor& hidden_states) {
  KBN_CHECK(A.defined(), "MambaMixer2 (", prefix_,
            "): A = -exp(A_log) is not computed; call process_weights_after_loading() after loading the weights");
  const ForwardContext& ctx = get_forward_context();
  KBN_CHECK(ctx.attn_metadata != nullptr && ctx.kv_caches != nullptr, "MambaMixer2 (", prefix_,
            "): the forward context has no step metadata or caches");
  const AttentionMetadata& md = *ctx.attn_metadata;
  KBN_CHECK(layer_idx_ < int64_t(ctx.kv_caches->size()), "MambaMixer2 (", prefix_, "): layer ", layer_idx_,
            " has no cache (", ctx.kv_caches->size(), " layers of caches)");
  const KVCache& cache = (*ctx.kv_caches)[size_t(layer_idx_)];
  KBN_CHECK(cache.states.size() == 2, "MambaMixer2 (", prefix_, "): layer ", layer_idx_,
            " must hold a conv and an SSM state, has ", cache.states.size(), " state tensors");
  const int64_t P = md.num_prefills, Tp = md.num_prefill_tokens, Dn = md.num_decodes, T = md.num_tokens();
  KBN_CHECK(hidden_states.dim() == 2 && hidden_states.size(0) == T, "MambaMixer2 (", prefix_,
            "): argument 'hidden_states' must be [num_tokens = ", T, ", ", hidden_size_, "], got ",
            hidden_states.str());
  KBN_CHECK(md.state_indices.defined() && md.has_initial_state.defined() && md.state_indices.size(0) == P + Dn,
            "MambaMixer2 (", prefix_, "): the step metadata carries no state slots for its ", P + Dn,
            " sequences (AttentionMetadata::state_indices / has_initial_state)");
  const Tensor& conv_state = cache.states[0];
  const Tensor& ssm_state = cache.states[1];

  const int64_t I = intermediate_size_, cd = conv_dim(), GN = n_groups_ * state_size_;
  const Tensor proj = in_proj.forward(hidden_states).first;  // [T, I + cd + num_heads]
  const Tensor gate = proj.slice(1, 0, I);
  const Tensor xBC = proj.slice(1, I, I + cd);
  const Tensor dt = proj.slice(1, I + cd, I + cd + num_heads_);

  // The conv outputs viewed as x [n, heads, head_dim], B and C [n, G, N] (token stride conv_dim).
  auto split = [&](const Tensor& conv, Tensor& x, Tensor& B, Tensor& C) {
    const int64_t n = conv.size(0), off = conv.offset();
    x = conv.as_strided({n, num_heads_, head_dim_}, {cd, head_dim_, 1}, off);
    B = conv.as_strided({n, n_groups_, state_size_}, {cd, state_size_, 1}, off + I);
    C = conv.as_strided({n, n_groups_, state_size_}, {cd, state_size_, 1}, off + I + GN);
  };
  Tensor y_prefill, y_decode;
  if (P > 0) {
    const Tensor idx = md.state_indices.slice(0, 0, P), has = md.has_initial_state.slice(0, 0, P);
    const Tensor conv = conv_fn_.forward(xBC.slice(0, 0, Tp), conv_weight, conv_bias, conv_state, has, idx,
                                         md.query_start_loc);
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
    y = Tensor::empty({T, num_heads_, head_dim_}, hidden_states.dtype(), hidden_states.device());
    y.slice(0, 0, Tp).copy_(y_prefill);
    y.slice(0, Tp, T).copy_(y_decode);
  }
  const Tensor g = norm.forward(y.view({T, I}), gate);
  return out_proj.forward(g).first;
}

}  // namespace kbn::KBN_VARIANT
