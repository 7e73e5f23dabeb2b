#include "engine/sequence.h"

#include <cmath>

#include "kbn/error.h"

namespace kbn::engine {

void SamplingParams::validate() const {
  KBN_CHECK(std::isfinite(temperature) && temperature >= 0.0, "sampling: temperature must be >= 0 (0 = greedy), got ",
            temperature);
  KBN_CHECK(top_k >= -1, "sampling: top_k must be >= 1, or 0 / -1 for off, got ", top_k);
  KBN_CHECK(top_p > 0.0 && top_p <= 1.0, "sampling: top_p must be in (0, 1] (1 = off), got ", top_p);
  KBN_CHECK(max_tokens >= 1, "sampling: max_tokens must be >= 1, got ", max_tokens);
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none:
      return "none";
    case FinishReason::eos:
      return "eos";
    case FinishReason::max_tokens:
      return "max_tokens";
    case FinishReason::max_model_len:
      return "max_model_len";
    case FinishReason::aborted:
      return "aborted";
  }
  KBN_FAIL("finish_reason_name: unknown FinishReason ", int(r));
}

Sequence::Sequence(const Request& r, double arrival)
    : id(r.id), prompt(r.prompt), sampling(r.sampling), arrival_time(arrival) {}

}  // namespace kbn::engine
