#pragma once
// Nano-batches (NanoFlow, Zhu et al. 2024): a step's sequences split into a few smaller batches that run the whole
// model each, on streams of their own, so that one nano-batch's memory-bound work (decode attention reading the KV
// cache, GEMV-sized layers) runs while another's compute-bound GEMMs hold the tensor cores. A step run serially is
// bounded below by the sum of its GEMM time and its KV read time (engine/serial_floor.h); overlapped nano-batches
// can go under that sum.
//
// Every family's forward treats a step's sequences independently (attention reads only a sequence's own pages,
// recurrent state is per slot, MoE routes each token alone), and within a step no sequence reads a KV block
// another one writes (a block is shared through prefix caching only once all of its tokens are computed, which
// happens after the step): so the nano-batches of one step need no synchronisation between them, only a fork from
// and a join into the step's stream.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace kbn::engine {

// How a step's sequences are dealt to its nano-batches.
// balanced: every nano-batch gets prefill chunks and decodes alike, their token counts evened out: the nano-batches
//   run the same kernels on similar shapes, and overlap where one is ahead of another.
// by_kind: when the step has both, the prefill chunks go to the first half of the nano-batches (at least one) and the
//   decodes to the rest, so a decode nano-batch's attention (memory-bound: it reads every cached token) meets a
//   prefill nano-batch's GEMMs (compute-bound); a step of one kind splits as balanced. On CUDA the decode
//   nano-batches of such a step run on streams of the greatest priority, so their blocks take SMs first.
enum class NanoBatchSplit { balanced, by_kind };
const char* nano_batch_split_name(NanoBatchSplit s);
// "balanced" or "kind"; the error names `what` and what was expected.
NanoBatchSplit parse_nano_batch_split(const std::string& s, const char* what);

struct NanoBatching {
  // Nano-batches per step: 1 runs every step as one batch (the serial engine).
  int count = 1;
  // A step is split into min(count, its sequences) nano-batches only when it has at least min_tokens tokens for each:
  // below that the extra launches and the weights read once per nano-batch cost more than the overlap can hide.
  int64_t min_tokens = 256;
  NanoBatchSplit split = NanoBatchSplit::balanced;
  // The SMs each nano-batch's cuBLASLt GEMMs aim at (kbn::CublasLtSmCountTarget; 0: the whole device), leaving the
  // rest to the kernels another nano-batch runs meanwhile, as NanoFlow partitions the SMs. kb-nano's own kernels
  // (attention, MoE experts) are not limited.
  int gemm_sms = 0;
  // Staggered starts (CUDA): nano-batch i + 1 begins once nano-batch i has reached its first layer's attention (or
  // Mamba-2 mixer; kbn::ForwardContext::layer_hook), offsetting them by the first layer's projections so that one's
  // attention meets the other's GEMMs. Without it all start together and run the same kinds of kernel at once.
  bool stagger = false;
};

// Checks count in 1..8, min_tokens >= 1 and gemm_sms >= 0; the error names the field (`what` prefixes it, e.g.
// "--nano-batches").
void check_nano_batching(const NanoBatching& nb, const char* what);

struct NanoBatch {
  SchedulerOutput out;          // its sequences in their order in the step (prefills first), their token count
  std::vector<size_t> indices;  // out.seqs[i] is the step's seqs[indices[i]]
};

// Splits `step` into nb.count nano-batches (fewer when it has fewer sequences; one, the whole step, when it is
// below the thresholds). The prefill chunks are dealt largest first to the nano-batch (of those nb.split gives them)
// holding the fewest tokens, then the decodes one by one the same way, so balanced nano-batches' token counts (their
// GEMM work) differ by at most the largest chunk; each nano-batch then takes its number of decodes as one contiguous
// run of the step's (the lowest nano-batch the first run), so its sampled rows gather in one copy. Every sequence keeps
// its whole chunk: a chunk split across nano-batches would read K/V that the other one writes in the same step. No
// nano-batch is empty; each lists its prefills first, as the step does.
std::vector<NanoBatch> split_nano_batches(const SchedulerOutput& step, const NanoBatching& nb);

}  // namespace kbn::engine
