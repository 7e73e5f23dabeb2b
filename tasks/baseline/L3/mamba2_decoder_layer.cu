#include "L3/mamba2_decoder_layer.h"

namespace kbn::KBN_VARIANT {

Mamba2DecoderLayer::Mamba2DecoderLayer(const Mamba2Config& config, const std::string& prefix,
                                       const ParamOptions& opts)
    : norm(config.hidden_size, config.layer_norm_epsilon, opts),
      mixer(config.hidden_size, config.state_size, config.conv_kernel, config.intermediate_size, config.use_conv_bias,
            config.use_bias, config.n_groups, config.num_heads, config.head_dim, config.layer_norm_epsilon,
            config.chunk_size, config.time_step_min, config.time_step_max, prefix + ".mixer", opts),
      residual_in_fp32_(config.residual_in_fp32) {
  register_module("norm", &norm);
  register_module("mixer", &mixer);
}

std::pair<Tensor, Tensor> Mamba2DecoderLayer::forward(const Tensor& hidden_states, const Tensor& residual) {
  Tensor h, res;
  if (!residual.defined()) {
    res = residual_in_fp32_ ? hidden_states.to(DType::f32) : hidden_states.clone();
    h = norm.forward(hidden_states);
  } else {
    std::tie(h, res) = norm.forward(hidden_states, residual);
  }
  h = mixer.forward(h);
  return {h, res};
}

}  // namespace kbn::KBN_VARIANT
