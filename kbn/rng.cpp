#include "kbn/rng.h"

#include <cmath>

#include "kbn/parallel.h"

namespace kbn {

uint64_t hash_seed(uint64_t seed, const char* label) {
  // FNV-1a over the label, then a splitmix64 finaliser with the seed.
  uint64_t h = 1469598103934665603ull;
  for (const char* p = label; *p; ++p) h = (h ^ uint8_t(*p)) * 1099511628211ull;
  uint64_t z = h + seed * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {

// kind 0: normal(a, b) by Box-Muller, two values per Philox call half; kind 1: uniform(a, b); kind 2: randint.
double random_value(uint64_t seed, int64_t i, int kind, double a, double b) {
  Philox4x32 r = philox4x32_10(uint64_t(i), seed);
  if (kind == 0) {
    float u1 = u32_to_unit(r.v[0]), u2 = u32_to_unit(r.v[1]);
    float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530718f * u2);
    return a + b * double(z);
  }
  if (kind == 1) return a + (b - a) * double(u32_to_unit(r.v[0]));
  uint64_t x = (uint64_t(r.v[0]) << 32) | r.v[1];
  return double(int64_t(a) + int64_t(x % uint64_t(int64_t(b) - int64_t(a))));
}

void fill_random_(Tensor& t, uint64_t seed, int kind, double a, double b, const char* what) {
  KBN_CHECK(t.defined() && t.is_contiguous(), what, ": needs a defined contiguous tensor, got ", t.str());
  if (kind == 2) {
    KBN_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, what, ": needs an i32 or i64 tensor, got ", t.str());
    KBN_CHECK(b > a, what, ": empty range [", a, ", ", b, ")");
  } else {
    KBN_CHECK(is_floating(t.dtype()), what, ": needs a floating tensor, got ", t.str());
  }
  if (t.is_cuda()) {
    cuda::fill_random(t, seed, kind, a, b);
    return;
  }
  int64_t n = t.numel();
  Tensor f = Tensor::empty({n}, DType::f32);
  // Element i is a function of (seed, i) alone: threads fill ranges of the elements, the same numbers as one thread.
  const int64_t grain = grain_for(64);
  if (kind == 2) {
    parallel_for(n, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        int64_t v = int64_t(random_value(seed, i, kind, a, b));
        if (t.dtype() == DType::i32)
          t.data<int32_t>()[i] = int32_t(v);
        else
          t.data<int64_t>()[i] = v;
      }
    });
    return;
  }
  float* fp = f.data<float>();
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fp[i] = float(random_value(seed, i, kind, a, b));
  });
  t.view({n}).copy_(f);
}

}  // namespace

void fill_normal_(Tensor& t, uint64_t seed, double mean, double std) {
  fill_random_(t, seed, 0, mean, std, "fill_normal_");
}
void fill_uniform_(Tensor& t, uint64_t seed, double lo, double hi) {
  fill_random_(t, seed, 1, lo, hi, "fill_uniform_");
}
void fill_randint_(Tensor& t, uint64_t seed, int64_t lo, int64_t hi) {
  fill_random_(t, seed, 2, double(lo), double(hi), "fill_randint_");
}

#ifndef KBN_WITH_CUDA
namespace cuda {
void fill_random(Tensor& t, uint64_t, int, double, double) {
  KBN_FAIL("fill_random: kb-nano was built without CUDA; no device ", t.device().str());
}
}  // namespace cuda
#endif

}  // namespace kbn
