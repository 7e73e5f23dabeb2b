#include "kbn/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "kbn/error.h"

namespace kbn {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::fp8e4m3:
      return 1;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::boolean:
      return 1;
  }
  KBN_FAIL("dtype_size: unknown dtype value ", int(dt));
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::fp8e4m3:
      return "fp8e4m3";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::boolean:
      return "bool";
  }
  KBN_FAIL("dtype_name: unknown dtype value ", int(dt));
}

DType parse_dtype(std::string_view name) {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  if (name == "f32" || name == "float32" || name == "float" || name == "fp32") return DType::f32;
  if (name == "f16" || name == "float16" || name == "half" || name == "fp16") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp8e4m3" || name == "float8_e4m3fn" || name == "F8_E4M3") return DType::fp8e4m3;
  if (name == "i32" || name == "int32") return DType::i32;
  if (name == "i64" || name == "int64") return DType::i64;
  if (name == "u8" || name == "uint8") return DType::u8;
  if (name == "bool") return DType::boolean;
  KBN_FAIL("dtype: expected one of f32, f16, bf16, fp8e4m3, i32, i64, u8, bool (or the torch spelling), got '",
           std::string(name), "'");
}

bool is_floating(DType dt) { return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16 || dt == DType::fp8e4m3; }

float f16_to_float(f16_t v) {
  uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1f;
  uint32_t man = v.bits & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = std::ldexp(float(man), -24);
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t{uint16_t(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return f16_t{uint16_t(sign | 0x7c00u)};  // overflow (after rounding) -> inf
  if (abs < 0x38800000u) {                                         // below smallest normal: subnormal or 0
    float a;
    std::memcpy(&a, &abs, 4);
    // Units of 2^-24, round to nearest even.
    float scaled = a * 16777216.0f;
    float r = std::nearbyint(scaled);
    return f16_t{uint16_t(sign | uint16_t(r))};
  }
  uint32_t exp = ((abs >> 23) - 112) << 10;
  uint32_t man = (abs >> 13) & 0x3ff;
  uint32_t rest = abs & 0x1fff;
  uint32_t h = exp | man;
  if (rest > 0x1000u || (rest == 0x1000u && (man & 1u))) h += 1;  // carries into exponent correctly
  return f16_t{uint16_t(sign | h)};
}

namespace {

// The value of every fp8 e4m3 code (sign, 4 exponent bits of bias 7, 3 mantissa bits; subnormals at exponent 0;
// 0x7f and 0xff are NaN, there are no infinities).
const std::array<float, 256>& fp8e4m3_values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> t{};
    for (uint32_t bits = 0; bits < 256; ++bits) {
      const uint32_t exp = (bits >> 3) & 0xf, man = bits & 0x7;
      float out;
      if (exp == 0xf && man == 0x7)
        out = std::nanf("");
      else if (exp == 0)
        out = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
      else
        out = std::ldexp(1.0f + float(man) / 8.0f, int(exp) - 7);
      t[bits] = (bits & 0x80u) ? -out : out;
    }
    return t;
  }();
  return values;
}

}  // namespace

float fp8e4m3_to_float(fp8e4m3_t v) { return fp8e4m3_values()[v.bits]; }

fp8e4m3_t float_to_fp8e4m3(float f) {
  if (std::isnan(f)) return fp8e4m3_t{0x7f};
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.0f) return fp8e4m3_t{uint8_t(sign | 0x7e)};  // saturate to max finite
  // Codes 0..0x7e hold the non-negative finite values in increasing order: the nearest of the two around `a`, ties
  // to the even code (round to nearest even).
  const float* v = fp8e4m3_values().data();
  const uint8_t hi = uint8_t(std::lower_bound(v, v + 0x7f, a) - v);  // v[hi] >= a; hi <= 0x7e as a < 448
  if (hi == 0) return fp8e4m3_t{sign};
  const uint8_t lo = hi - 1;
  const float below = a - v[lo], above = v[hi] - a;
  const uint8_t best = below < above ? lo : above < below ? hi : ((lo & 1) == 0 ? lo : hi);
  return fp8e4m3_t{uint8_t(sign | best)};
}

}  // namespace kbn
