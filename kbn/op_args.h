#pragma once
// How the registry builds and calls an op without knowing its class: constructor arguments by name
// (OpArgs) and a uniform calling convention (AnyOp).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kbn/config.h"
#include "kbn/module.h"

namespace kbn {

// Constructor arguments by name, for building an op from a model config or a bench case.
struct OpArgs {
  std::string op;  // for error messages
  std::map<std::string, double> values;
  ParamOptions opts;
  const ModelConfig* config = nullptr;  // L2..L4 ops build from a model config

  const ModelConfig& model_config() const;

  double get(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get(const std::string& key, double fallback) const;
  int64_t get_int_or(const std::string& key, int64_t fallback) const;
};

// A built op with a uniform calling convention: tensors in the order of OpEntry::args, outputs returned
// (for in-place ops, the mutated tensors).
class AnyOp {
 public:
  virtual ~AnyOp() = default;
  virtual Module& module() = 0;
  virtual std::vector<Tensor> call(const std::vector<Tensor>& args) = 0;
};

}  // namespace kbn
