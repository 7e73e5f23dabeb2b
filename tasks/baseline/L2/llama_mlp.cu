#include "L2/llama_mlp.h"

namespace kbn::KBN_VARIANT {

LlamaMLP::LlamaMLP(int64_t hidden_size, int64_t intermediate_size, const std::string& hidden_act, bool bias,
                   const std::string& prefix, const ParamOptions& opts)
    : gate_up_proj(hidden_size, {intermediate_size, intermediate_size}, bias, false, opts, prefix + ".gate_up_proj"),
      down_proj(intermediate_size, hidden_size, bias, true, false, true, opts, prefix + ".down_proj") {
  KBN_CHECK(hidden_act == "silu", "LlamaMLP ", prefix, ": hidden_act must be \"silu\", got \"", hidden_act, "\"");
  register_module("gate_up_proj", &gate_up_proj);
  register_module("down_proj", &down_proj);
}

Tensor LlamaMLP::forward(const Tensor& x) {
  auto [gate_up, gate_up_bias] = gate_up_proj.forward(x);
  return forward_act(act_fn.forward(gate_up));
}

Tensor LlamaMLP::forward_act(const Tensor& act) {
  auto [out, out_bias] = down_proj.forward(act);
  return out;
}

}  // namespace kbn::KBN_VARIANT
