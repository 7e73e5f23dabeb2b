#pragma once
// Counter-based RNG (Philox-4x32-10, Salmon et al. 2011): element i of a tensor filled with seed s is a
// pure function of (s, i), so CPU and GPU fills of the same seed agree and any slice can be regenerated.
#include <cstdint>

#include "kbn/tensor.h"

#if defined(__CUDACC__)
#define KBN_HD __host__ __device__ __forceinline__
#else
#define KBN_HD inline
#endif

namespace kbn {

struct Philox4x32 {
  uint32_t v[4];
};

KBN_HD Philox4x32 philox4x32_10(uint64_t counter, uint64_t key) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in (0, 1]: never 0, so log() is safe.
KBN_HD float u32_to_unit(uint32_t x) { return (float(x >> 8) + 1.0f) * (1.0f / 16777216.0f); }

// Deterministic 64-bit mix for deriving sub-seeds (e.g. seed ^ hash(parameter name)).
uint64_t hash_seed(uint64_t seed, const char* label);

// In-place fills on CPU or CUDA tensors (contiguous, floating dtypes).
void fill_normal_(Tensor& t, uint64_t seed, double mean, double std);
void fill_uniform_(Tensor& t, uint64_t seed, double lo, double hi);
// Integers uniform in [lo, hi) for i32/i64 tensors (token ids, slots).
void fill_randint_(Tensor& t, uint64_t seed, int64_t lo, int64_t hi);

namespace cuda {
void fill_random(Tensor& t, uint64_t seed, int kind, double a, double b);  // kind: 0 normal, 1 uniform, 2 randint
}

}  // namespace kbn
