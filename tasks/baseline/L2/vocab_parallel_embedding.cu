#include "L2/vocab_parallel_embedding.h"

#include <algorithm>

#include "kbn/checks.h"
#include "kbn/comm.h"
#include "kbn/parallel_state.h"

namespace kbn::KBN_VARIANT {

namespace {

int64_t rows_per_rank(int64_t num_embeddings) {
  const int tp = parallel_state().tp_size;
  return (num_embeddings + tp - 1) / tp;
}

// Loads this rank's vocabulary rows; rows past the end of the vocabulary stay zero.
WeightLoader vocab_loader(int64_t num_embeddings, int64_t embedding_dim) {
  return [num_embeddings, embedding_dim](Tensor& p, const Tensor& w, std::string_view sid) {
    KBN_CHECK(sid.empty(), "vocab embedding: unexpected shard id '", std::string(sid), "'");
    KBN_CHECK(w.dim() == 2 && w.size(0) == num_embeddings && w.size(1) == embedding_dim,
              "vocab embedding: checkpoint weight ", w.str(), " does not match [", num_embeddings, ", ", embedding_dim,
              "]");
    const int64_t per = p.size(0), start = parallel_state().tp_rank * per;
    const int64_t n = std::max<int64_t>(0, std::min(num_embeddings, start + per) - start);
    p.zero_();
    if (n == 0) return;
    Tensor src = w.slice(0, start, start + n);
    if (src.dtype() != p.dtype()) src = src.to(Device::cpu()).to(p.dtype());
    p.slice(0, 0, n).copy_(src);
  };
}

}  // namespace

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, const ParamOptions& opts,
                                               const std::string& prefix)
    : num_embeddings_(num_embeddings) {
  KBN_CHECK(num_embeddings > 0 && embedding_dim > 0, "VocabParallelEmbedding ", prefix, ": sizes must be positive");
  const int64_t per = rows_per_rank(num_embeddings);
  vocab_start_ = parallel_state().tp_rank * per;
  vocab_end_ = std::min(num_embeddings, vocab_start_ + per);
  weight = Tensor::zeros({per, embedding_dim}, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::normal, vocab_loader(num_embeddings, embedding_dim));
}

Tensor VocabParallelEmbedding::forward(const Tensor& input_ids) {
  Tensor out = embedding_.forward(input_ids, weight.slice(0, 0, vocab_end_ - vocab_start_), vocab_start_, vocab_end_);
  if (parallel_state().tp_size > 1) out = all_reduce_.forward(out);
  return out;
}

Tensor VocabParallelEmbedding::forward(const Tensor& input_ids, double scale) {
  // Scaled before the all-reduce: the other ranks contribute exact zeros, so the sum is the one scaled row.
  Tensor out = embedding_.forward(input_ids, weight.slice(0, 0, vocab_end_ - vocab_start_), vocab_start_, vocab_end_,
                                  scale);
  if (parallel_state().tp_size > 1) out = all_reduce_.forward(out);
  return out;
}

ParallelLMHead::ParallelLMHead(int64_t num_embeddings, int64_t embedding_dim, bool bias, const ParamOptions& opts,
                               const std::string& prefix)
    : num_embeddings_(num_embeddings) {
  KBN_CHECK(!bias, "ParallelLMHead ", prefix, ": a bias on the LM head is not supported (no Llama has one)");
  weight = Tensor::zeros({rows_per_rank(num_embeddings), embedding_dim}, opts.dtype, opts.device);
  register_parameter("weight", &weight, InitKind::normal, vocab_loader(num_embeddings, embedding_dim));
}

void ParallelLMHead::tie_weights(const VocabParallelEmbedding& embedding) {
  KBN_CHECK(embedding.weight.shape() == weight.shape(), "ParallelLMHead::tie_weights: embedding ",
            embedding.weight.str(), " and head ", weight.str(), " differ");
  weight = embedding.weight;
}

Tensor ParallelLMHead::forward(const Tensor& hidden_states) {
  const ParallelState& ps = parallel_state();
  if (ps.tp_size == 1) {
    Tensor logits = linear_.forward(hidden_states, weight.slice(0, 0, num_embeddings_), Tensor());
    return logits.dtype() == DType::f32 ? logits : logits.to(DType::f32);
  }
  // Each rank holds rows_per_rank vocabulary rows (the last rank's tail zero-padded): its logits are columns
  // [rank * per, (rank + 1) * per) of the full row. Gather them as [tp, T, per], lay them side by side as
  // [T, tp * per] and drop the padding; every rank ends with the same full logits.
  KBN_CHECK(ps.comm != nullptr, "ParallelLMHead: tensor-parallel size ", ps.tp_size, " but rank ", ps.tp_rank,
            " has no communicator");
  const Tensor local = linear_.forward(hidden_states, weight, Tensor());
  const Tensor gathered = ps.comm->all_gather(local.is_contiguous() ? local : local.contiguous());
  const int64_t tokens = local.size(0), per = local.size(1);
  Tensor logits = gathered.transpose(0, 1).contiguous().view({tokens, int64_t(ps.tp_size) * per});
  logits = logits.slice(1, 0, num_embeddings_);
  logits = logits.contiguous();
  return logits.dtype() == DType::f32 ? logits : logits.to(DType::f32);
}

}  // namespace kbn::KBN_VARIANT
