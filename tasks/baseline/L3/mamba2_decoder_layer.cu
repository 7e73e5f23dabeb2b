#include "L3/mamba2_decoder_layer.h"

// The one-token path (rms_norm_gemv) stays off when tasks/candidate/ replaces an op it folds away (its header's
// test) or the mixer, so a candidate is reached at every token count (kbn/variant.h).
#if KBN_NORM_GEMV_FOLDS_A_CANDIDATE || defined(KBN_CANDIDATE_REPLACES_L2_mamba_mixer2_h) || \
    defined(KBN_CANDIDATE_REPLACES_L2_mamba_mixer2_cu)
#define KBN_MAMBA2_ONE_TOKEN_FUSION 0
#else
#define KBN_MAMBA2_ONE_TOKEN_FUSION 1
#endif

namespace kbn::KBN_VARIANT {

Mamba2DecoderLayer::Mamba2DecoderLayer(const Mamba2Config& config, const std::string& prefix,
                                       const ParamOptions& opts)
    : norm(config.hidden_size, config.layer_norm_epsilon, opts),
      mixer(config.hidden_size, config.state_size, config.conv_kernel, config.intermediate_size, config.use_conv_bias,
            config.use_bias, config.n_groups, config.num_heads, config.head_dim, config.layer_norm_epsilon,
            config.chunk_size, config.time_step_min, config.time_step_max, prefix + ".mixer", opts),
      residual_in_fp32_(config.residual_in_fp32),
      norm_in_proj_(config.layer_norm_epsilon) {
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
    auto [proj, res] =
        norm_in_proj_.forward(hidden_states, residual, norm.weight, mixer.in_proj.weight, mixer.in_proj.bias);
    return {mixer.forward_proj(proj), residual.defined() ? res : first_residual()};
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
