#pragma once
// Element types and their host-side conversions. No CUDA headers here: kbn/ must build CPU-only.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kbn {

enum class DType : uint8_t { f32, f16, bf16, fp8e4m3, i32, i64, u8, boolean };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::fp8e4m3,
                                       DType::i32, DType::i64, DType::u8,   DType::boolean};

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
// Accepts our names ("bf16") and HF/torch spellings ("bfloat16", "torch.float16", "float32").
DType parse_dtype(std::string_view name);
bool is_floating(DType dt);

// Storage-only types for host code. Device code uses cuda_bf16.h / cuda_fp16.h types of the same layout.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};
struct fp8e4m3_t {
  uint8_t bits;
};

inline float bf16_to_float(bf16_t v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, NaN stays NaN (quiet).
inline bf16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{uint16_t(u >> 16)};
}
float f16_to_float(f16_t v);
f16_t float_to_f16(float f);
// OCP FP8 E4M3 (the "fn" variant: no infinities, 0x7f/0xff are NaN, max 448). Saturates on overflow.
float fp8e4m3_to_float(fp8e4m3_t v);
fp8e4m3_t float_to_fp8e4m3(float f);

}  // namespace kbn
