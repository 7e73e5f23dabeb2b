#include "kbn/weight_loading.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "kbn/error.h"
#include "kbn/safetensors.h"

namespace kbn {

namespace {

// Elements of a contiguous host buffer whose exponent bits are all ones (NaN or Inf; fp8 e4m3 has only NaN).
template <class Bits>
int64_t count_non_finite(const Bits* p, int64_t n, Bits mask, int64_t& first) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i)
    if ((p[i] & mask) == mask) {
      if (count++ == 0) first = i;
    }
  return count;
}

}  // namespace

int64_t non_finite_count(const Tensor& t, int64_t* first_index) {
  if (!is_floating(t.dtype()) || t.numel() == 0) return 0;
  const Tensor host = t.device().is_cpu() && t.is_contiguous() ? t : t.to(Device::cpu()).contiguous();
  int64_t first = -1, n = 0;
  switch (host.dtype()) {
    case DType::f32: n = count_non_finite(static_cast<const uint32_t*>(host.data_ptr()), host.numel(), 0x7f800000u, first); break;
    case DType::f16: n = count_non_finite(static_cast<const uint16_t*>(host.data_ptr()), host.numel(), uint16_t(0x7c00), first); break;
    case DType::bf16: n = count_non_finite(static_cast<const uint16_t*>(host.data_ptr()), host.numel(), uint16_t(0x7f80), first); break;
    case DType::fp8e4m3: n = count_non_finite(static_cast<const uint8_t*>(host.data_ptr()), host.numel(), uint8_t(0x7f), first); break;
    default: break;
  }
  if (first_index) *first_index = first;
  return n;
}

std::vector<std::string> kv_scale_params(const std::string& name) {
  // Suffixes as quantizers write them (vLLM's maybe_remap_kv_scale_name): llm-compressor / compressed-tensors
  // (".self_attn.k_scale", formerly ".self_attn.k_proj.output_scale"), NVIDIA ModelOpt (".self_attn.k_proj.k_scale"),
  // fused qkv (".self_attn.qkv_proj.k_scale"), and the deprecated single ".kv_scale" for both.
  static const std::vector<std::pair<std::string, std::vector<std::string>>> patterns = {
      {".self_attn.k_scale", {"k_scale"}},
      {".self_attn.v_scale", {"v_scale"}},
      {".self_attn.k_proj.k_scale", {"k_scale"}},
      {".self_attn.v_proj.v_scale", {"v_scale"}},
      {".self_attn.k_proj.output_scale", {"k_scale"}},
      {".self_attn.v_proj.output_scale", {"v_scale"}},
      {".self_attn.qkv_proj.k_scale", {"k_scale"}},
      {".self_attn.qkv_proj.v_scale", {"v_scale"}},
      {".self_attn.kv_scale", {"k_scale", "v_scale"}},
  };
  for (const auto& [suffix, params] : patterns) {
    if (name.size() <= suffix.size() || !name.ends_with(suffix)) continue;
    const std::string layer = name.substr(0, name.size() - suffix.size());
    std::vector<std::string> out;
    for (const std::string& p : params) out.push_back(layer + ".self_attn.attn." + p);
    return out;
  }
  return {};
}

KVScaleRange kv_scale_range(const Module& model) {
  KVScaleRange r;
  std::vector<float> k, v;
  for (const auto& [name, p] : model.named_parameters()) {
    if (name.ends_with(".attn.k_scale")) k.push_back(p.tensor->to(Device::cpu()).to_floats()[0]);
    if (name.ends_with(".attn.v_scale")) v.push_back(p.tensor->to(Device::cpu()).to_floats()[0]);
  }
  r.layers = int64_t(k.size());
  if (!k.empty()) {
    const auto [lo, hi] = std::minmax_element(k.begin(), k.end());
    r.k_min = *lo, r.k_max = *hi;
  }
  if (!v.empty()) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    r.v_min = *lo, r.v_max = *hi;
  }
  return r;
}

const std::vector<StackedParam>& qkv_gate_up_stacking() {
  static const std::vector<StackedParam> s = {{".qkv_proj", ".q_proj", "q"},
                                              {".qkv_proj", ".k_proj", "k"},
                                              {".qkv_proj", ".v_proj", "v"},
                                              {".gate_up_proj", ".gate_proj", "0"},
                                              {".gate_up_proj", ".up_proj", "1"}};
  return s;
}

void load_stacked_weights(Module& model, const WeightSource& weights, const std::vector<StackedParam>& stacking,
                          const std::function<bool(const std::string&)>& skip, const std::string& who) {
  load_stacked_weights(model, weights, stacking, {}, skip, who);
}

void load_stacked_weights(Module& model, const WeightSource& weights, const std::vector<StackedParam>& stacking,
                          const std::vector<StackedParam>& experts,
                          const std::function<bool(const std::string&)>& skip, const std::string& who) {
  std::map<std::string, Parameter> params;
  for (auto& [name, p] : model.named_parameters()) params.emplace(name, p);
  // Every parameter must be filled; fused ones by each of their shards.
  std::map<std::string, std::set<std::string>> filled;
  std::map<std::string, size_t> shards_needed;
  for (const auto& s : stacking) {
    std::set<std::string> ids;
    for (const auto& t : stacking)
      if (t.param == s.param) ids.insert(t.shard);
    shards_needed[s.param + "."] = ids.size();
  }
  for (const auto& s : experts) {
    KBN_CHECK(!s.ckpt.empty() && s.ckpt.back() == '.', who, "::load_weights: expert mapping '", s.ckpt,
              "' must end in '.'");
    std::set<std::string> ids;
    for (const auto& t : experts)
      if (t.param == s.param) ids.insert(t.shard);
    shards_needed[s.param] = ids.size();
  }

  // One checkpoint tensor into (one shard of) a parameter.
  auto load = [&](const Parameter& param, const std::string& name, const std::string& shard,
                  const std::string& ckpt_name, const Tensor& tensor) {
    // The loader converts dtypes, so a tensor relabelled I32 (or a quantized one) would load as garbage numbers.
    const DType want = param.tensor->dtype();
    KBN_CHECK(is_floating(want) ? is_floating(tensor.dtype()) : tensor.dtype() == want, who,
              "::load_weights: checkpoint tensor '", ckpt_name, "' has dtype ", safetensors_dtype_name(tensor.dtype()),
              "; expected ", is_floating(want) ? "a floating-point dtype (F32, F16, BF16 or F8_E4M3)"
                                               : std::string(safetensors_dtype_name(want)),
              " for parameter '", name, "' (", dtype_name(want), ")");
    int64_t first = -1;
    const int64_t bad = non_finite_count(tensor, &first);
    KBN_CHECK(bad == 0, who, "::load_weights: checkpoint tensor '", ckpt_name, "' holds ", bad, " of ", tensor.numel(),
              " values that are NaN or Inf (the first at flat index ", first,
              "): the checkpoint is corrupt or was converted badly");
    try {
      param.loader(*param.tensor, tensor, shard);
    } catch (const Error& e) {
      KBN_FAIL(who, "::load_weights: '", ckpt_name, "': ", e.what());
    }
    KBN_CHECK(filled[name].insert(shard).second, who, "::load_weights: checkpoint tensor '", ckpt_name,
              "' appears twice");
  };

  weights([&](const std::string& ckpt_name, const Tensor& tensor) {
    if (skip && skip(ckpt_name)) return;
    if (const std::vector<std::string> targets = kv_scale_params(ckpt_name); !targets.empty()) {
      for (const std::string& name : targets) {
        auto it = params.find(name);
        KBN_CHECK(it != params.end(), who, "::load_weights: checkpoint tensor '", ckpt_name,
                  "' is a per-tensor fp8 KV-cache scale, but this layer has no scaled K/V pages (looked for '", name,
                  "'; latent and recurrent caches take none)");
        load(it->second, name, "", ckpt_name, tensor);
      }
      return;
    }
    std::string name = ckpt_name, shard;
    bool expert = false;
    for (const auto& s : experts) {
      const size_t pos = name.find(s.ckpt);
      if (pos != std::string::npos) {
        name.replace(pos, s.ckpt.size(), s.param);
        shard = s.shard;
        expert = true;
        break;
      }
    }
    for (const auto& s : stacking) {
      if (expert) break;
      const size_t pos = name.find(s.ckpt + ".");
      if (pos != std::string::npos) {
        name.replace(pos, s.ckpt.size(), s.param);
        shard = s.shard;
        break;
      }
    }
    auto it = params.find(name);
    KBN_CHECK(it != params.end(), who, "::load_weights: checkpoint tensor '", ckpt_name,
              "' matches no parameter (looked for '", name, "')");
    load(it->second, name, shard, ckpt_name, tensor);
  });

  for (auto& [name, p] : params) {
    if (p.optional && filled[name].empty()) continue;
    size_t need = 1;
    for (const auto& [suffix, n] : shards_needed)
      if (name.find(suffix) != std::string::npos) need = n;
    KBN_CHECK(filled[name].size() == need, who, "::load_weights: parameter '", name,
              "' was not filled by the checkpoint (", filled[name].size(), " of ", need, " parts found)");
  }
}

}  // namespace kbn
