#include "kbn/weight_loading.h"

#include <map>
#include <set>

#include "kbn/error.h"

namespace kbn {

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

  weights([&](const std::string& ckpt_name, const Tensor& tensor) {
    if (skip && skip(ckpt_name)) return;
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
    try {
      it->second.loader(*it->second.tensor, tensor, shard);
    } catch (const Error& e) {
      KBN_FAIL(who, "::load_weights: '", ckpt_name, "': ", e.what());
    }
    KBN_CHECK(filled[name].insert(shard).second, who, "::load_weights: checkpoint tensor '", ckpt_name,
              "' appears twice");
  });

  for (auto& [name, p] : params) {
    size_t need = 1;
    for (const auto& [suffix, n] : shards_needed)
      if (name.find(suffix) != std::string::npos) need = n;
    KBN_CHECK(filled[name].size() == need, who, "::load_weights: parameter '", name,
              "' was not filled by the checkpoint (", filled[name].size(), " of ", need, " parts found)");
  }
}

}  // namespace kbn
