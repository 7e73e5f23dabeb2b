#include "L2/gemma3_mlp.h"

#include "kbn/error.h"

namespace kbn::KBN_VARIANT {

Gemma3MLP::Gemma3MLP(int64_t hidden_size, int64_t intermediate_size, const std::string& hidden_activation,
                     const std::string& prefix, const ParamOptions& opts)
    : gate_up_proj(hidden_size, {intermediate_size, intermediate_size}, false, false, opts, prefix + ".gate_up_proj"),
      down_proj(intermediate_size, hidden_size, false, true, false, true, opts, prefix + ".down_proj"),
      act_fn("tanh") {
  KBN_CHECK(hidden_activation == "gelu_pytorch_tanh", "Gemma3MLP ", prefix,
            ": hidden_activation must be \"gelu_pytorch_tanh\", got \"", hidden_activation, "\"");
  register_module("gate_up_proj", &gate_up_proj);
  register_module("down_proj", &down_proj);
}

Tensor Gemma3MLP::forward(const Tensor& x) {
  auto [gate_up, gate_up_bias] = gate_up_proj.forward(x);
  return forward_act(act_fn.forward(gate_up));
}

Tensor Gemma3MLP::forward_act(const Tensor& act) {
  auto [out, out_bias] = down_proj.forward(act);
  return out;
}

}  // namespace kbn::KBN_VARIANT
