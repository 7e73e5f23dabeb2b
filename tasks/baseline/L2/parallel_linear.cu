#include "L2/parallel_linear.h"

#include <algorithm>

#include "kbn/checks.h"
#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

namespace {
Tensor new_param(const Shape& shape, const ParamOptions& opts) { return Tensor::empty(shape, opts.dtype, opts.device); }
}  // namespace

// ---- ColumnParallelLinear ----

ColumnParallelLinear::ColumnParallelLinear(int64_t input_size, int64_t output_size, bool bias, bool skip_bias_add,
                                           const ParamOptions& opts, const std::string& prefix)
    : input_size_(input_size),
      output_size_per_partition_(
          divide_exact(output_size, parallel_state().tp_size, "ColumnParallelLinear output_size")),
      skip_bias_add_(skip_bias_add) {
  KBN_CHECK(input_size > 0 && output_size > 0, "ColumnParallelLinear ", prefix, ": sizes must be positive, got ",
            input_size, " -> ", output_size);
  weight = new_param({output_size_per_partition_, input_size}, opts);
  const int rank = parallel_state().tp_rank;
  const int64_t shard = output_size_per_partition_;
  register_parameter(
      "weight", &weight, InitKind::normal, [this, rank, shard](Tensor& p, const Tensor& w, std::string_view sid) {
        KBN_CHECK(sid.empty(), "ColumnParallelLinear: unexpected shard id '", std::string(sid), "'");
        KBN_CHECK(w.dim() == 2 && w.size(1) == input_size_ && w.size(0) == shard * parallel_state().tp_size,
                  "ColumnParallelLinear: checkpoint weight ", w.str(), " does not match [",
                  shard * parallel_state().tp_size, ", ", input_size_, "]");
        load_rows(p, w, 0, rank * shard, shard);
      });
  if (bias) {
    this->bias = new_param({output_size_per_partition_}, opts);
    register_parameter(
        "bias", &this->bias, InitKind::zeros,
        [this, rank, shard](Tensor& p, const Tensor& b, std::string_view) { load_rows(p, b, 0, rank * shard, shard); });
  }
}

void ColumnParallelLinear::load_rows(Tensor& param, const Tensor& loaded, int64_t dst_row, int64_t src_row,
                                     int64_t rows) {
  KBN_CHECK(loaded.dim() == param.dim() && src_row + rows <= loaded.size(0) && dst_row + rows <= param.size(0),
            "weight loader: cannot copy rows [", src_row, ", ", src_row + rows, ") of checkpoint tensor ", loaded.str(),
            " into rows [", dst_row, ", ", dst_row + rows, ") of parameter ", param.str());
  if (param.dim() == 2)
    KBN_CHECK(loaded.size(1) == param.size(1), "weight loader: checkpoint tensor ", loaded.str(), " has ",
              loaded.size(1), " columns, parameter ", param.str(), " has ", param.size(1));
  Tensor src = loaded.slice(0, src_row, src_row + rows);
  if (src.dtype() != param.dtype()) src = src.to(Device::cpu()).to(param.dtype());
  param.slice(0, dst_row, dst_row + rows).copy_(src);
}

std::pair<Tensor, Tensor> ColumnParallelLinear::forward(const Tensor& x) {
  Tensor b = bias.defined() && !skip_bias_add_ ? bias : Tensor();
  Tensor out = linear_.forward(x, weight, b);
  return {out, skip_bias_add_ ? bias : Tensor()};
}

// ---- MergedColumnParallelLinear ----

static int64_t sum_sizes(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

MergedColumnParallelLinear::MergedColumnParallelLinear(int64_t input_size, const std::vector<int64_t>& output_sizes,
                                                       bool bias, bool skip_bias_add, const ParamOptions& opts,
                                                       const std::string& prefix)
    : ColumnParallelLinear(input_size, sum_sizes(output_sizes), bias, skip_bias_add, opts, prefix),
      output_sizes_(output_sizes) {
  const int tp = parallel_state().tp_size, rank = parallel_state().tp_rank;
  for (int64_t s : output_sizes_) divide_exact(s, tp, "MergedColumnParallelLinear output size");
  auto loader = [this, tp, rank](Tensor& p, const Tensor& w, std::string_view sid) {
    KBN_CHECK(!sid.empty(), "MergedColumnParallelLinear: a fused parameter needs a shard id (0..",
              output_sizes_.size() - 1, ")");
    size_t idx = size_t(std::stoul(std::string(sid)));
    KBN_CHECK(idx < output_sizes_.size(), "MergedColumnParallelLinear: shard id ", std::string(sid), " out of range");
    int64_t offset = 0;
    for (size_t i = 0; i < idx; ++i) offset += output_sizes_[i] / tp;
    int64_t shard = output_sizes_[idx] / tp;
    KBN_CHECK(w.size(0) == output_sizes_[idx], "MergedColumnParallelLinear: checkpoint shard ", std::string(sid),
              " is ", w.str(), ", expected ", output_sizes_[idx], " rows");
    load_rows(p, w, offset, rank * shard, shard);
  };
  set_weight_loader("weight", loader);
  if (bias) set_weight_loader("bias", loader);
}

// ---- QKVParallelLinear ----

QKVParallelLinear::QKVParallelLinear(int64_t hidden_size, int64_t head_size, int64_t total_num_heads,
                                     int64_t total_num_kv_heads, bool bias, bool skip_bias_add,
                                     const ParamOptions& opts, const std::string& prefix)
    : ColumnParallelLinear(hidden_size,
                           // Per-rank output times tp, so the base's exact division gives the per-rank size.
                           (divide_exact(total_num_heads, parallel_state().tp_size, "QKVParallelLinear num_heads") +
                            2 * std::max<int64_t>(1, total_num_kv_heads / parallel_state().tp_size)) *
                               head_size * parallel_state().tp_size,
                           bias, skip_bias_add, opts, prefix),
      head_size_(head_size) {
  const int tp = parallel_state().tp_size, rank = parallel_state().tp_rank;
  num_heads_ = total_num_heads / tp;
  if (tp >= total_num_kv_heads) {
    KBN_CHECK(tp % total_num_kv_heads == 0, "QKVParallelLinear: tensor-parallel size ", tp,
              " must be a multiple of the kv head count ", total_num_kv_heads, " when it exceeds it");
    num_kv_heads_ = 1;
    kv_replicas_ = tp / total_num_kv_heads;
  } else {
    num_kv_heads_ = divide_exact(total_num_kv_heads, tp, "QKVParallelLinear num_kv_heads");
    kv_replicas_ = 1;
  }
  const int64_t total_heads = total_num_heads, total_kv = total_num_kv_heads;
  auto loader = [this, rank, total_heads, total_kv](Tensor& p, const Tensor& w, std::string_view sid) {
    const int64_t d = head_size_;
    int64_t dst, src, rows, expected;
    if (sid == "q") {
      expected = total_heads * d;
      dst = 0;
      src = rank * num_heads_ * d;
      rows = num_heads_ * d;
    } else if (sid == "k" || sid == "v") {
      expected = total_kv * d;
      dst = (num_heads_ + (sid == "v" ? num_kv_heads_ : 0)) * d;
      src = (rank / kv_replicas_) * num_kv_heads_ * d;
      rows = num_kv_heads_ * d;
    } else {
      KBN_FAIL("QKVParallelLinear: shard id must be q, k or v, got '", std::string(sid), "'");
    }
    KBN_CHECK(w.size(0) == expected, "QKVParallelLinear: checkpoint shard ", std::string(sid), " is ", w.str(),
              ", expected ", expected, " rows");
    load_rows(p, w, dst, src, rows);
  };
  set_weight_loader("weight", loader);
  if (bias) set_weight_loader("bias", loader);
}

// ---- RowParallelLinear ----

RowParallelLinear::RowParallelLinear(int64_t input_size, int64_t output_size, bool bias, bool input_is_parallel,
                                     bool skip_bias_add, bool reduce_results, const ParamOptions& opts,
                                     const std::string& prefix)
    : input_size_per_partition_(divide_exact(input_size, parallel_state().tp_size, "RowParallelLinear input_size")),
      output_size_(output_size),
      skip_bias_add_(skip_bias_add),
      reduce_results_(reduce_results) {
  KBN_CHECK(input_is_parallel, "RowParallelLinear ", prefix,
            ": input_is_parallel=false (scattering a full input) is not supported; Llama feeds it the shard");
  KBN_CHECK(!(bias && !reduce_results && parallel_state().tp_size > 1 && !skip_bias_add), "RowParallelLinear ", prefix,
            ": a bias without reduce_results would be added on every rank");
  weight = new_param({output_size, input_size_per_partition_}, opts);
  const int rank = parallel_state().tp_rank;
  const int64_t shard = input_size_per_partition_;
  register_parameter("weight", &weight, InitKind::normal,
                     [rank, shard, output_size](Tensor& p, const Tensor& w, std::string_view sid) {
                       KBN_CHECK(sid.empty(), "RowParallelLinear: unexpected shard id '", std::string(sid), "'");
                       KBN_CHECK(
                           w.dim() == 2 && w.size(0) == output_size && w.size(1) == shard * parallel_state().tp_size,
                           "RowParallelLinear: checkpoint weight ", w.str(), " does not match [", output_size, ", ",
                           shard * parallel_state().tp_size, "]");
                       Tensor src = w.slice(1, rank * shard, (rank + 1) * shard);
                       if (src.dtype() != p.dtype()) src = src.to(Device::cpu()).to(p.dtype());
                       p.copy_(src);
                     });
  if (bias) {
    this->bias = new_param({output_size}, opts);
    register_parameter("bias", &this->bias, InitKind::zeros);
  }
}

std::pair<Tensor, Tensor> RowParallelLinear::forward(const Tensor& x) {
  check_rank(x, "RowParallelLinear", "x", 2, "[num_tokens, input_size / tp]");
  check_size(x, "RowParallelLinear", "x", 1, input_size_per_partition_, "input_size / tp");
  // NOTE: the bias joins on rank 0 only, so the all-reduce adds it exactly once (vLLM does the same).
  const bool add_bias = bias.defined() && !skip_bias_add_ && parallel_state().tp_rank == 0;
  Tensor out = linear_.forward(x, weight, add_bias ? bias : Tensor());
  if (reduce_results_ && parallel_state().tp_size > 1) out = all_reduce_.forward(out);
  return {out, skip_bias_add_ ? bias : Tensor()};
}

}  // namespace kbn::KBN_VARIANT
