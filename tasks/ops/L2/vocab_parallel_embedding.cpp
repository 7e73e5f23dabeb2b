// vocab_parallel_embedding and parallel_lm_head (tasks/baseline/L2/vocab_parallel_embedding.h). Their kernels are
// the embedding and linear L1 ops, which carry the cases.
#include "L2/vocab_parallel_embedding.h"
#include "ops/op.h"

KBN_FALLBACK_CLASS(VocabParallelEmbedding)
KBN_FALLBACK_CLASS(ParallelLMHead)

namespace kbn::KBN_VARIANT {
using namespace kbn::missing_task_class;
using namespace kbn::ops;

KBN_REQUIRE_CLASS(VocabParallelEmbedding, "L2/vocab_parallel_embedding.h");
KBN_REQUIRE_CTOR(VocabParallelEmbedding, "L2/vocab_parallel_embedding.h", int64_t, int64_t, const ParamOptions&,
                 const std::string&);
KBN_REQUIRE_METHOD(VocabParallelEmbedding, Tensor, forward, (const Tensor&), "L2/vocab_parallel_embedding.h");
KBN_REQUIRE_METHOD(VocabParallelEmbedding, Tensor, forward, (const Tensor&, double), "L2/vocab_parallel_embedding.h");
KBN_REQUIRE_CLASS(ParallelLMHead, "L2/vocab_parallel_embedding.h");
KBN_REQUIRE_CTOR(ParallelLMHead, "L2/vocab_parallel_embedding.h", int64_t, int64_t, bool, const ParamOptions&,
                 const std::string&);
KBN_REQUIRE_METHOD(ParallelLMHead, Tensor, forward, (const Tensor&), "L2/vocab_parallel_embedding.h");

KBN_REGISTER_OPS(r) {
  r.add({.name = "vocab_parallel_embedding",
         .class_name = "VocabParallelEmbedding",
         .level = 2,
         .header = "L2/vocab_parallel_embedding.h",
         .ctor_args = {},
         .args = {"input_ids"},
         .mutates = {},
         .make = adapter(
             "vocab_parallel_embedding", 1,
             [](const OpArgs& a) {
               const ModelConfig& c = a.model_config();
               return std::make_unique<VocabParallelEmbedding>(c.get_int("vocab_size"), c.get_int("hidden_size"),
                                                               a.opts, "model.embed_tokens");
             },
             [](VocabParallelEmbedding& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
  r.add({.name = "parallel_lm_head",
         .class_name = "ParallelLMHead",
         .level = 2,
         .header = "L2/vocab_parallel_embedding.h",
         .ctor_args = {},
         .args = {"hidden_states"},
         .mutates = {},
         .make = adapter(
             "parallel_lm_head", 1,
             [](const OpArgs& a) {
               const ModelConfig& c = a.model_config();
               return std::make_unique<ParallelLMHead>(c.get_int("vocab_size"), c.get_int("hidden_size"), false, a.opts,
                                                       "lm_head");
             },
             [](ParallelLMHead& op, const Tensors& t) { return Tensors{op.forward(t[0])}; })});
}

}  // namespace kbn::KBN_VARIANT
