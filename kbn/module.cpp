#include "kbn/module.h"

#include "kbn/rng.h"

namespace kbn {

void default_weight_loader(Tensor& param, const Tensor& loaded, std::string_view shard_id) {
  KBN_CHECK(shard_id.empty(), "weight loader: unexpected shard id '", std::string(shard_id),
            "' for an unsharded parameter");
  KBN_CHECK(param.shape() == loaded.shape(), "weight loader: parameter is ", param.str(), " but the checkpoint has ",
            loaded.str());
  param.copy_(loaded.dtype() == param.dtype() ? loaded : loaded.to(Device::cpu()).to(param.dtype()));
}

void Module::register_parameter(std::string name, Tensor* t, InitKind init, WeightLoader loader) {
  KBN_CHECK(t && t->defined(), "register_parameter: '", name, "' must be an allocated tensor");
  params_.emplace_back(std::move(name),
                       Parameter{t, loader ? std::move(loader) : WeightLoader(default_weight_loader), init});
}

void Module::register_optional_parameter(std::string name, Tensor* t, InitKind init, WeightLoader loader) {
  register_parameter(std::move(name), t, init, std::move(loader));
  params_.back().second.optional = true;
}

void Module::register_module(std::string name, Module* m) {
  KBN_CHECK(m != nullptr, "register_module: '", name, "' is null");
  children_.emplace_back(std::move(name), m);
}

void Module::set_weight_loader(const std::string& name, WeightLoader loader) {
  for (auto& [n, p] : params_) {
    if (n == name) {
      p.loader = std::move(loader);
      return;
    }
  }
  KBN_FAIL("set_weight_loader: module has no parameter '", name, "'");
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Parameter>>& out) const {
  for (auto& [n, p] : params_) out.emplace_back(prefix + n, p);
  for (auto& [n, m] : children_) m->collect(prefix + n + ".", out);
}

std::vector<std::pair<std::string, Parameter>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Parameter>> out;
  collect("", out);
  return out;
}

Parameter Module::parameter(const std::string& name) const {
  for (auto& [n, p] : named_parameters())
    if (n == name) return p;
  KBN_FAIL("module has no parameter named '", name, "'");
}

void Module::process_weights_after_loading_recursive() {
  for (auto& [n, m] : children_) m->process_weights_after_loading_recursive();
  process_weights_after_loading();
}

void init_random_weights(Module& m, uint64_t seed, double std) {
  for (auto& [name, p] : m.named_parameters()) {
    switch (p.init) {
      case InitKind::ones:
        p.tensor->fill_(1.0);
        break;
      case InitKind::zeros:
        p.tensor->fill_(0.0);
        break;
      case InitKind::normal:
        fill_normal_(*p.tensor, hash_seed(seed, name.c_str()), 0.0, std);
        break;
    }
  }
}

}  // namespace kbn
