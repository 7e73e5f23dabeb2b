#pragma once
// A minimal module tree, like torch.nn.Module: parameters and submodules registered by name so that one
// loader fills baseline and candidate alike. Modules own their parameter tensors and are neither copied
// nor moved (registration stores addresses); hold them by value or unique_ptr.
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kbn/tensor.h"

namespace kbn {

// Copies a checkpoint tensor into a parameter. `shard_id` is empty for plain parameters and names the
// part for fused ones ("q", "k", "v"; "0", "1" for merged gate/up), as in vLLM's weight_loader.
using WeightLoader = std::function<void(Tensor& param, const Tensor& loaded, std::string_view shard_id)>;

// How a freshly built model fills a parameter when no checkpoint is given.
enum class InitKind { normal, ones, zeros };

struct Parameter {
  Tensor* tensor = nullptr;
  WeightLoader loader;  // default: exact-shape copy
  InitKind init = InitKind::normal;
  // A checkpoint may leave it out, and it then keeps the value it was created with (vLLM's k_scale / v_scale: 1.0
  // unless the checkpoint was calibrated for an fp8 KV cache). Every other parameter must be filled.
  bool optional = false;
};

// The default loader: shapes must match exactly; dtype converts.
void default_weight_loader(Tensor& param, const Tensor& loaded, std::string_view shard_id);

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  std::vector<std::pair<std::string, Parameter>> named_parameters() const;
  // Throws naming the parameter when absent.
  Parameter parameter(const std::string& name) const;
  // After all weights are loaded (vLLM's process_weights_after_loading): modules may re-layout here.
  virtual void process_weights_after_loading() {}
  void process_weights_after_loading_recursive();

 protected:
  void register_parameter(std::string name, Tensor* t, InitKind init = InitKind::normal, WeightLoader loader = {});
  // A parameter a checkpoint may omit (Parameter::optional); `t` must hold its value for that case.
  void register_optional_parameter(std::string name, Tensor* t, InitKind init, WeightLoader loader = {});
  void register_module(std::string name, Module* m);
  // Replaces the loader of one of this module's own parameters (subclasses that fuse several checkpoint
  // tensors into one parameter install shard-aware loaders).
  void set_weight_loader(const std::string& name, WeightLoader loader);

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Parameter>>& out) const;
  std::vector<std::pair<std::string, Parameter>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
};

// Fills every parameter with seeded random values: InitKind::normal draws N(0, std) from a stream derived
// from (seed, parameter name), so the same model gets the same weights on any device and in any variant.
void init_random_weights(Module& m, uint64_t seed, double std);

}  // namespace kbn

namespace kbn {
// Where and in what dtype a module creates its parameters (vLLM takes these from global defaults).
struct ParamOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
};
}  // namespace kbn
