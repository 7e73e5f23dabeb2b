#pragma once
// The closed form of the engine tests' toy models (tests/cpu/test_state_engine.cpp keeps the sum in a recurrent state,
// tests/cpu/test_latent_cache.cpp reads it back from latent rows): a token's hidden state is the sum of its sequence's
// token ids so far mod the vocabulary, and the next token is that sum + 1.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kbn/tensor.h"

namespace kbn::test {

// The logits of hidden states [n, 1] holding running sums: one-hot at (sum + 1) mod vocab, [n, vocab] f32.
inline Tensor running_sum_logits(const Tensor& hidden, int64_t vocab) {
  const std::vector<double> h = hidden.to_doubles();
  std::vector<float> logits(h.size() * size_t(vocab), 0.f);
  for (size_t r = 0; r < h.size(); ++r) logits[r * size_t(vocab) + size_t(std::fmod(h[r] + 1, double(vocab)))] = 1;
  return Tensor::from_floats(logits, {int64_t(h.size()), vocab});
}

// The n greedy tokens such a model gives after `prompt`.
inline std::vector<int64_t> running_sum_tokens(const std::vector<int64_t>& prompt, int64_t n, int64_t vocab) {
  int64_t s = 0;
  for (int64_t t : prompt) s = (s + t) % vocab;
  std::vector<int64_t> out;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t next = (s + 1) % vocab;
    out.push_back(next);
    s = (s + next) % vocab;
  }
  return out;
}

}  // namespace kbn::test
