#pragma once
// The validation contract of tests/op_contract.h for Mamba-2's conv, state-update and gated-norm ops (and the one-token
// norm + in_proj, rms_norm_gemv, with the fp32 residual) on Mamba-2 views
// built here: odd shapes no published config has (scalar kernel paths, width 2 and 3, no conv bias, a finite
// time_step_limit), which bench::random_cases cannot draw for a Mamba-2 config. Used by tests/cpu/test_mamba_ops.cpp
// and tests/gpu/test_mamba_gpu.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/validate.h"
#include "kbn/config.h"
#include "kbn/model_view.h"
#include "kbn/registry.h"
#include "op_contract.h"

namespace kbn::test {

inline const std::vector<std::string>& mamba_decode_and_conv_ops() {
  static const std::vector<std::string> ops = {"causal_conv1d_fn", "causal_conv1d_update", "selective_state_update",
                                               "mixer2_rms_norm_gated", "rms_norm_gemv"};
  return ops;
}

// Mamba-2 configs with odd shapes:
//   odd:     6 heads of 5 over 3 groups, state 12, width 3, no conv bias: conv_dim 102, groups of 10 (every op on its
//            scalar path), time steps clamped to 0.5;
//   aligned: 12 heads of 24 over 4 groups, state 32, width 2: conv_dim 544, groups of 72 (vector paths).
inline ModelView mamba_view(const std::string& which) {
  const bool odd = which == "odd";
  const std::string json =
      std::string(R"({"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 40,
      "vocab_size": 100, "num_hidden_layers": 1, "layer_norm_epsilon": 1e-5, "chunk_size": 8,)") +
      (odd ? R"("num_heads": 6, "head_dim": 5, "intermediate_size": 30, "n_groups": 3, "state_size": 12,
               "conv_kernel": 3, "use_conv_bias": false, "time_step_limit": [0.0, 0.5]})"
           : R"("num_heads": 12, "head_dim": 24, "intermediate_size": 288, "n_groups": 4, "state_size": 32,
               "conv_kernel": 2, "use_conv_bias": true, "time_step_limit": [0.0, Infinity]})");
  return bench::model_view("mamba2-" + which, ModelConfig::parse(json, "mamba2-" + which), 1);
}

// Every case of `op` on `view` at `tokens` through validate_candidate on `device` (as check_op_contract does for a
// model name).
inline void check_op_contract_on_view(const std::string& op, const ModelView& view, Device device,
                                      const std::vector<int64_t>& tokens) {
  const OpEntry& entry = registry(Variant::baseline).get(op);
  bench::CaseOptions o;
  o.tokens = tokens;
  o.dtype = DType::bf16;
  o.small = device.is_cpu();
  const std::vector<BenchCase> cases = bench::cases_for(op, view, o);
  ASSERT_FALSE(cases.empty()) << op << " has no cases for " << view.name;
  check_cases(entry, cases, device);
}

}  // namespace kbn::test
