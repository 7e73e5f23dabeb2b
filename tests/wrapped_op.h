#pragma once
// A test op: the baseline op it wraps (its module and weights) with another forward, for the validation tests'
// hand-made candidates.
#include <functional>
#include <memory>
#include <vector>

#include "kbn/registry.h"

namespace kbn::test {

class WrappedOp : public AnyOp {
 public:
  using Hook = std::function<std::vector<Tensor>(AnyOp& inner, const std::vector<Tensor>& args)>;
  WrappedOp(std::unique_ptr<AnyOp> inner, Hook hook) : inner_(std::move(inner)), hook_(std::move(hook)) {}
  Module& module() override { return inner_->module(); }
  std::vector<Tensor> call(const std::vector<Tensor>& args) override { return hook_(*inner_, args); }

 private:
  std::unique_ptr<AnyOp> inner_;
  Hook hook_;
};

}  // namespace kbn::test
