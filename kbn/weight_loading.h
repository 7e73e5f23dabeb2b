#pragma once
// The checkpoint-to-parameter mapping every decoder model's load_weights shares (vLLM's load_weights with its
// stacked_params_mapping): checkpoint names are matched to parameters, fused parameters (qkv_proj,
// gate_up_proj) are filled shard by shard, and every parameter must end up filled by all of its shards.
#include <functional>
#include <string>
#include <vector>

#include "kbn/causal_lm.h"
#include "kbn/module.h"

namespace kbn {

// A checkpoint suffix that lands in one shard of a fused parameter: ".q_proj" -> ".qkv_proj" shard "q".
struct StackedParam {
  std::string param;  // fused parameter suffix, ".qkv_proj"
  std::string ckpt;   // checkpoint suffix, ".q_proj"
  std::string shard;  // shard id passed to the parameter's loader
};

// The q/k/v and gate/up fusions of the Llama-style decoder layers (QKVParallelLinear, MergedColumnParallelLinear).
const std::vector<StackedParam>& qkv_gate_up_stacking();

// The attention-layer parameters a checkpoint's fp8 KV-cache scale fills (vLLM's maybe_remap_kv_scale_name):
// "model.layers.3.self_attn.k_scale" (and the ModelOpt, compressed-tensors and fused-qkv spellings) ->
// {"model.layers.3.self_attn.attn.k_scale"}; the deprecated ".self_attn.kv_scale" fills both k_scale and v_scale.
// Empty when `name` is no KV-cache scale (the canonical ".attn.k_scale" is matched as an ordinary parameter).
std::vector<std::string> kv_scale_params(const std::string& name);

// What a model's attention layers hold in their k_scale / v_scale (Attention's optional parameters): how many layers
// have them and the range of each; `layers` is 0 for a model without them (MLA, recurrent layers).
struct KVScaleRange {
  int64_t layers = 0;
  float k_min = 1.f, k_max = 1.f, v_min = 1.f, v_max = 1.f;
  bool all_one() const { return k_min == 1.f && k_max == 1.f && v_min == 1.f && v_max == 1.f; }
};
KVScaleRange kv_scale_range(const Module& model);

// NaN and Inf elements of a floating-point tensor (0 for other dtypes), by their exponent bits: one pass over a
// host copy; *first_index gets the flat index of the first (-1 when none).
int64_t non_finite_count(const Tensor& t, int64_t* first_index = nullptr);

// Loads `weights` into `model`'s parameters. `skip(name)` drops checkpoint tensors the model recomputes or
// shares (rotary inv_freq, a tied lm_head). Errors start with `who` and name the checkpoint tensor or the
// parameter: a tensor that matches no parameter, one that appears twice, a dtype that cannot hold the
// parameter's values (an integer tensor for a floating-point parameter: the dtype found and the one expected),
// NaN or Inf values (checked once per tensor as it is loaded: how many and where the first is), a wrong shape (the
// loader's message), a parameter left unfilled (with how many of its shards were found).
void load_stacked_weights(Module& model, const WeightSource& weights, const std::vector<StackedParam>& stacking,
                          const std::function<bool(const std::string&)>& skip, const std::string& who);

// The same with per-expert checkpoint tensors stacked into a mixture-of-experts parameter (vLLM's
// expert_params_mapping): an `experts` entry's ckpt is a literal part of the checkpoint name that ends in '.'
// (".experts.3.w1.") and is replaced by its param (".experts.w13_", giving ".experts.w13_weight"), its shard id
// naming the expert and the part ("3.w1"). Expert entries are tried before `stacking` (a Qwen3-MoE expert's
// ".gate_proj" must not land in a dense gate_up_proj); a stacked parameter needs every shard id its entries list.
void load_stacked_weights(Module& model, const WeightSource& weights, const std::vector<StackedParam>& stacking,
                          const std::vector<StackedParam>& experts,
                          const std::function<bool(const std::string&)>& skip, const std::string& who);

}  // namespace kbn
