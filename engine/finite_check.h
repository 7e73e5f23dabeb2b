#pragma once
// --check-finite (kb_nano generate and eval): the logits of every step that samples are checked for NaN/Inf, and
// when some are not finite the error names the first layer whose output is not, without a per-layer hook in the
// models. The models' layers are plain calls inside each L4 forward (tasks/), but every layer leaves a trace of its
// input in the paged KV cache: layer l's keys and values of a token are projections of rms_norm(the residual
// stream entering layer l), and a NaN/Inf anywhere in a row of that stream makes rms_norm's sum, hence every key
// and value of the token, NaN. So the first layer whose keys/values (of this step's sequences) are not finite is
// the layer whose *input* is not: the output of the layer before it (or the embedding, for layer 0). When every
// layer's keys/values are finite, the last layer's output or the final norm produced the non-finite hidden states,
// or, when those are finite too, the LM head did. Cost: one device-to-host copy of the logits per sampling step
// (opt-in for that reason); the scan of the caches runs only after a failure. Weights are checked once at load
// (kbn/weight_loading.h), so a layer's own NaN weights do not reach this point from a checkpoint.
#include <string>
#include <vector>

#include "kbn/forward_context.h"
#include "kbn/tensor.h"

namespace kbn::engine {

// Which layer first produced non-finite values in a step (see above). `hidden`: the model's final hidden states of
// the step; `md`: its attention metadata (block_tables and seq_lens select the cache slots of its sequences).
std::string locate_non_finite(const Tensor& hidden, const AttentionMetadata& md, const std::vector<KVCache>& caches);

// Throws kbn::Error when `logits` holds NaN or Inf: "non-finite values (--check-finite): <step>: the logits are not
// finite (N of M values NaN or Inf); first non-finite layer output: ...".
void check_logits_finite(const Tensor& logits, const Tensor& hidden, const AttentionMetadata& md,
                         const std::vector<KVCache>& caches, const std::string& step);

}  // namespace kbn::engine
