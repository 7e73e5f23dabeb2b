#include "L3/mamba2_decoder_layer.h"

// The one-token path (rms_norm_gemv) stays off when tasks/candidate/ replaces an op it folds away (its header's
// test) or the mixer, so a candidate is reached at every token count (kbn/variant.h).
#if KBN_NORM_GEMV_FOLDS_A_CANDIDATE || defined(KBN_CANDIDATE_REPLACES_L2_mamba_mixer2_h) || \
    defined(KBN_CANDIDATE_REPLACES_L2_mamba_mixer2_cu)
#define KBN_MAMBA2_ONE_TOKEN_FUSION 0
#else
#define KBN_MAMBA2_ONE_TOKEN_FUSION 1
#endif
// The conv update folded into in_proj's epilogue (rms_norm_gemv_conv1d) likewise stays off when a candidate replaces
// the conv update.
#if KBN_MAMBA2_ONE_TOKEN_FUSION && !defined(KBN_CANDIDATE_REPLACES_L1_causal_conv1d_update_h) && \
    !defined(KBN_CANDIDATE_REPLACES_L1_causal_conv1d_update_cu) && !defined(KBN_CANDIDATE_REPLACES_L1_causal_conv1d_cuh)
#define KBN_MAMBA2_CONV_FUSION 1
#else
#define KBN_MAMBA2_CONV_FUSION 0
#endif

namespace kbn::KBN_VARIANT {

Mamba2DecoderLayer::Mamba2DecoderLayer(const Mamba2Config& config, const std::string& prefix,
                                       const ParamOptions& opts)
    : norm(config.hidden_size, config.layer_norm_epsilon, opts),
      mixer(config.hidden_size, config.state_size, config.conv_kernel, config.intermediate_size, config.use_conv_bias,
            config.use_bias, config.n_groups, config.num_heads, config.head_dim, config.layer_norm_epsilon,
            config.chunk_size, config.time_step_min, config.time_step_max, prefix + ".mixer", opts),
      residual_in_fp32_(config.residual_in_fp32),
      norm_in_proj_(config.layer_norm_epsilon),
      norm_in_proj_conv_(config.layer_norm_epsilon, mixer.shard().intermediate_size, "silu") {
  register_module("norm", &norm);
  register_module("mixer", &mixer);
}

std::pair<Tensor, Tensor> Mamba2DecoderLayer::forward(const Tensor& hidden_states, const Tensor& residual) {
  // The first layer's residual stream: its input, in fp32 with residual_in_fp32.
  const auto first_residual = [&] {
    return residual_in_fp32_ ? hidden_states.to(DType::f32) : hidden_states.clone();
  };
#if KBN_MAMBA2_ONE_TOKEN_FUSION
  // One token: the norm folded into in_proj (always on CPU, where the op composes the same oracles; on the GPU where
  // its kernel takes the row).
  if (RMSNormGemv::applies(hidden_states)) {
    // A decode token: the conv update too, in in_proj's epilogue (rms_norm_gemv_conv1d).
    const bool conv = KBN_MAMBA2_CONV_FUSION && mixer.one_decode_token() &&
                      (hidden_states.is_cpu() || RMSNormGemvConv1d::kernel_supports(hidden_states.dtype(), 1,
                                                                                   hidden_states.size(1),
                                                                                   mixer.conv_weight.size(1)));
    Tensor proj, res;
    if (conv)
      std::tie(proj, res) = norm_in_proj_conv_.forward(hidden_states, residual, norm.weight, mixer.in_proj.weight,
                                                       mixer.in_proj.bias, mixer.conv_state_cache(), mixer.conv_weight,
                                                       mixer.conv_bias, mixer.step_state_indices());
    else
      std::tie(proj, res) =
          norm_in_proj_.forward(hidden_states, residual, norm.weight, mixer.in_proj.weight, mixer.in_proj.bias);
    return {mixer.forward_proj(proj, conv), residual.defined() ? res : first_residual()};
  }
#endif
  Tensor h, res;
  if (!residual.defined()) {
    res = first_residual();
    h = norm.forward(hidden_states);
  } else {
    std::tie(h, res) = norm.forward(hidden_states, residual);
  }
  h = mixer.forward(h);
  return {h, res};
}

}  // namespace kbn::KBN_VARIANT
