#pragma once
// What an op's facts file (tasks/ops/L<n>/<name>.cpp) uses to register its ops: compile-time checks that the
// variant's class keeps the baseline's name, constructor and forward signatures (so a candidate that drifts
// fails the build with a message naming the file, the class and the expected declaration), type-erased
// adapters, and KBN_REGISTER_OPS, which defines the function the generated register-all unit calls. Facts
// files are compiled once per variant and cannot be shadowed by a candidate (they are not under baseline/).
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kbn/cache_spec.h"
#include "kbn/op_case.h"
#include "kbn/registry.h"
#include "kbn/variant.h"

#ifndef KBN_OPS_ID
#error "facts files are compiled with KBN_OPS_ID set from their path (cmake/KbnTasks.cmake)"
#endif

#define KBN_CAT2(a, b) a##b
#define KBN_CAT(a, b) KBN_CAT2(a, b)
#define KBN_WHERE(file) "tasks/" KBN_VARIANT_NAME "/" file " (or its baseline twin)"

// Defines this file's registration function; the body adds entries to `r`.
#define KBN_REGISTER_OPS(r) void KBN_CAT(register_ops_, KBN_OPS_ID)(::kbn::Registry & r)

// Declares a stand-in for `Class` that unqualified lookup inside kbn::<variant> finds when the variant's
// header does not declare it, so KBN_REQUIRE_CLASS can say which class went missing. Use at file scope.
#define KBN_FALLBACK_CLASS(Class)                   \
  namespace kbn::missing_task_class {               \
  struct Class {                                    \
    static constexpr bool kbn_missing_class = true; \
  };                                                \
  }

namespace kbn::ops {

template <class C>
concept task_class_present = !requires { C::kbn_missing_class; };

}  // namespace kbn::ops

#define KBN_REQUIRE_CLASS(Class, File)                                                                        \
  static_assert(::kbn::ops::task_class_present<Class>, KBN_WHERE(File) ": class '" #Class "' is missing; the " \
                                                                       "baseline declares it and a candidate " \
                                                                       "must keep the name")

// Exact signature: the member function pointer of that type must be formable.
#define KBN_REQUIRE_METHOD(Class, Ret, Name, Params, File)                                   \
  template <class C>                                                                         \
  concept KBN_CAT(kbn_sig_, __LINE__) = requires {                                           \
    static_cast<Ret(C::*) Params>(&C::Name);                                                 \
  };                                                                                         \
  static_assert(KBN_CAT(kbn_sig_, __LINE__) < Class >,                                       \
                KBN_WHERE(File) ": class '" #Class "' must declare `" #Ret " " #Name #Params \
                                "` exactly as the baseline does")

#define KBN_REQUIRE_CTOR(Class, File, ...)                                 \
  static_assert(std::is_constructible_v<Class __VA_OPT__(, ) __VA_ARGS__>, \
                KBN_WHERE(File) ": class '" #Class "' must be constructible from (" #__VA_ARGS__ ")")

namespace kbn::ops {

using TensorPair = std::pair<Tensor, Tensor>;
using TensorTriple = std::tuple<Tensor, Tensor, Tensor>;
using Tensors = std::vector<Tensor>;

template <class Op, class Call>
class Adapter final : public AnyOp {
 public:
  Adapter(std::unique_ptr<Op> op, Call call) : op_(std::move(op)), call_(call) {}
  Module& module() override { return *op_; }
  Tensors call(const Tensors& args) override { return call_(*op_, args); }

 private:
  std::unique_ptr<Op> op_;
  Call call_;
};

// Builds an OpEntry::make from a constructor lambda and a call lambda; checks the argument count (between
// min_args and max_args for an op with trailing optional tensors). A call may also take the OpArgs it was built
// with (host facts such as attention maxima).
template <class Make, class Call>
auto adapter(std::string name, size_t min_args, size_t max_args, Make make, Call call) {
  return [=](const OpArgs& a) -> std::unique_ptr<AnyOp> {
    auto op = make(a);
    using Op = typename decltype(op)::element_type;
    auto checked = [=](Op& o, const Tensors& args) -> Tensors {
      KBN_CHECK(args.size() >= min_args && args.size() <= max_args, name, ": expected ", min_args,
                min_args == max_args ? std::string() : " to " + std::to_string(max_args), " tensor arguments, got ",
                args.size());
      if constexpr (std::is_invocable_v<Call, Op&, const Tensors&, const OpArgs&>)
        return call(o, args, a);
      else
        return call(o, args);
    };
    return std::make_unique<Adapter<Op, decltype(checked)>>(std::move(op), checked);
  };
}
template <class Make, class Call>
auto adapter(std::string name, size_t nargs, Make make, Call call) {
  return adapter(std::move(name), nargs, nargs, std::move(make), std::move(call));
}

// The fp8 pages' per-tensor scales of a paged-KV op's case (args k_scale / v_scale, cases::set_kv_pages; 1.0 when absent).
inline KVScales kv_scales_arg(const OpArgs& a) { return {float(a.get("k_scale", 1.0)), float(a.get("v_scale", 1.0))}; }

// The single-rank view of the model config an L2..L4 op is built from (OpArgs::config).
inline ModelView view_of(const OpArgs& a) {
  return ModelView::from(a.op, std::make_shared<const ModelConfig>(a.model_config()), 1);
}

// Host maxima for attention launches, read from the metadata tensors (a device-to-host copy) when the
// caller does not pass them in OpArgs.
inline int64_t host_max(const Tensor& t) {
  int64_t m = 0;
  for (int64_t v : t.to_ints()) m = std::max(m, v);
  return m;
}
inline int64_t host_max_diff(const Tensor& loc) {
  auto v = loc.to_ints();
  int64_t m = 0;
  for (size_t i = 1; i < v.size(); ++i) m = std::max(m, v[i] - v[i - 1]);
  return m;
}

}  // namespace kbn::ops
