#include "kbn/dtype.h"

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

float fp8e4m3_to_float(fp8e4m3_t v) {
  uint32_t sign = v.bits & 0x80u;
  uint32_t exp = (v.bits >> 3) & 0xf;
  uint32_t man = v.bits & 0x7;
  float out;
  if (exp == 0xf && man == 0x7) {
    out = std::nanf("");
  } else if (exp == 0) {
    out = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    out = std::ldexp(1.0f + float(man) / 8.0f, int(exp) - 7);
  }
  return sign ? -out : out;
}

fp8e4m3_t float_to_fp8e4m3(float f) {
  if (std::isnan(f)) return fp8e4m3_t{0x7f};
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return fp8e4m3_t{uint8_t(sign | 0x7e)};  // saturate to max finite
  // Brute force nearest-even over the 127 non-negative codes: exact and obviously correct.
  uint8_t best = 0;
  float best_err = a;
  for (uint8_t c = 1; c < 0x7f; ++c) {
    float v = fp8e4m3_to_float(fp8e4m3_t{c});
    float err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return fp8e4m3_t{uint8_t(sign | best)};
}

}  // namespace kbn
