#pragma once
// VocabParallelEmbedding and ParallelLMHead (vLLM vllm/model_executor/layers/vocab_parallel_embedding.py).
// Each rank holds rows [rank * V/tp, (rank + 1) * V/tp) of the (padded) vocabulary.
#include <string>

#include "L1/all_reduce.h"
#include "L1/embedding.h"
#include "L1/linear.h"
#include "kbn/variant.h"

namespace kbn::KBN_VARIANT {

class VocabParallelEmbedding : public Module {
 public:
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, const ParamOptions& opts,
                         const std::string& prefix = "");

  // input_ids: [num_tokens] (i32/i64) -> [num_tokens, embedding_dim]
  Tensor forward(const Tensor& input_ids);
  // The rows times `scale` (rounded to the weight dtype, each product too): Gemma's sqrt(hidden_size) normaliser.
  Tensor forward(const Tensor& input_ids, double scale);

  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t vocab_start() const { return vocab_start_; }
  int64_t vocab_end() const { return vocab_end_; }

  Tensor weight;  // [ceil(num_embeddings / tp), embedding_dim]; rows past the vocabulary are zero

 private:
  int64_t num_embeddings_, vocab_start_, vocab_end_;
  Embedding embedding_;
  AllReduce all_reduce_;
};

class ParallelLMHead : public Module {
 public:
  ParallelLMHead(int64_t num_embeddings, int64_t embedding_dim, bool bias, const ParamOptions& opts,
                 const std::string& prefix = "");

  // hidden_states: [num_tokens, embedding_dim] -> logits [num_tokens, num_embeddings] (f32)
  Tensor forward(const Tensor& hidden_states);

  // Shares the embedding's weight (tie_word_embeddings); the head then owns no parameter of its own.
  void tie_weights(const VocabParallelEmbedding& embedding);

  Tensor weight;  // [ceil(num_embeddings / tp), embedding_dim]
  Tensor bias;

 private:
  int64_t num_embeddings_;
  Linear linear_;
};

}  // namespace kbn::KBN_VARIANT
