#pragma once
// Tensor-parallel linear layers (vLLM vllm/model_executor/layers/linear.py). Weights are [out, in] like
// PyTorch; each rank holds its shard (kbn::parallel_state()). forward returns (output, output_bias): the
// bias is added inside unless skip_bias_add, in which case it is returned for the caller to fuse.
#include <string>
#include <utility>
#include <vector>

#include "L1/all_reduce.h"
#include "L1/linear.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

// Output features split across ranks; no gather (every Llama use consumes the shard).
class ColumnParallelLinear : public Module {
 public:
  ColumnParallelLinear(int64_t input_size, int64_t output_size, bool bias, bool skip_bias_add, const ParamOptions& opts,
                       const std::string& prefix = "");

  // x: [num_tokens, input_size] -> ([num_tokens, output_size / tp], bias or undefined)
  std::pair<Tensor, Tensor> forward(const Tensor& x);

  int64_t input_size() const { return input_size_; }
  int64_t output_size_per_partition() const { return output_size_per_partition_; }

  Tensor weight;  // [output_size / tp, input_size]
  Tensor bias;    // [output_size / tp] when bias

 protected:
  // Copies rows [src_row, src_row + rows) of a checkpoint tensor into rows [dst_row, ...) of this rank's
  // weight (or bias); used by the fused subclasses' shard loaders.
  void load_rows(Tensor& param, const Tensor& loaded, int64_t dst_row, int64_t src_row, int64_t rows);

  int64_t input_size_;
  int64_t output_size_per_partition_;
  bool skip_bias_add_;
  Linear linear_;
};

// Several column-parallel outputs fused into one GEMM (gate_proj + up_proj). Shard ids "0", "1", ...
class MergedColumnParallelLinear : public ColumnParallelLinear {
 public:
  MergedColumnParallelLinear(int64_t input_size, const std::vector<int64_t>& output_sizes, bool bias,
                             bool skip_bias_add, const ParamOptions& opts, const std::string& prefix = "");

 private:
  std::vector<int64_t> output_sizes_;
};

// q, k and v projections fused into one GEMM. Shard ids "q", "k", "v". Output per rank:
// [q (num_heads * head_size) | k (num_kv_heads * head_size) | v (num_kv_heads * head_size)];
// kv heads are replicated when tp exceeds their count.
class QKVParallelLinear : public ColumnParallelLinear {
 public:
  QKVParallelLinear(int64_t hidden_size, int64_t head_size, int64_t total_num_heads, int64_t total_num_kv_heads,
                    bool bias, bool skip_bias_add, const ParamOptions& opts, const std::string& prefix = "");

  int64_t num_heads() const { return num_heads_; }        // per rank
  int64_t num_kv_heads() const { return num_kv_heads_; }  // per rank
  int64_t head_size() const { return head_size_; }

 private:
  int64_t head_size_, num_heads_, num_kv_heads_, kv_replicas_;
};

// Input features split across ranks; partial outputs summed by an all-reduce (when reduce_results).
class RowParallelLinear : public Module {
 public:
  RowParallelLinear(int64_t input_size, int64_t output_size, bool bias, bool input_is_parallel, bool skip_bias_add,
                    bool reduce_results, const ParamOptions& opts, const std::string& prefix = "");

  // x: [num_tokens, input_size / tp] -> ([num_tokens, output_size], bias or undefined)
  std::pair<Tensor, Tensor> forward(const Tensor& x);

  Tensor weight;  // [output_size, input_size / tp]
  Tensor bias;    // [output_size] when bias

 private:
  int64_t input_size_per_partition_;
  int64_t output_size_;
  bool skip_bias_add_;
  bool reduce_results_;
  Linear linear_;
  AllReduce all_reduce_;
};

}  // namespace kbn::KBN_VARIANT
