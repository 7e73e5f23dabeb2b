// Oracle: rotary position embedding (vLLM RotaryEmbedding / Llama3RotaryEmbedding / LinearScalingRotaryEmbedding /
// YaRNScalingRotaryEmbedding, HF _compute_default_rope_parameters / _compute_llama3_parameters /
// _compute_linear_scaling_rope_parameters / _compute_yarn_parameters).
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "kbn/checks.h"
#include "kbn/parallel.h"
#include "reference/reference.h"

namespace kbn::reference {

namespace {

constexpr const char* kCacheOp = "reference::rope_cos_sin_cache";
constexpr const char* kRotaryOp = "reference::rotary_embedding";

// inv_freq[i] = base^(-2i / rotary_dim), i in [0, rotary_dim / 2).
std::vector<double> default_inv_freq(int64_t rotary_dim, double base) {
  std::vector<double> inv_freq(size_t(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    inv_freq[size_t(i)] = 1.0 / std::pow(base, double(2 * i) / double(rotary_dim));
  }
  return inv_freq;
}

// Llama-3.1 frequency rescaling: long wavelengths slow down by `factor`, short ones are kept, and the band
// between blends the two linearly in original_max / wavelength.
void apply_llama3_scaling(std::vector<double>& inv_freq, const RopeScaling& s) {
  KBN_CHECK(s.factor > 0, kCacheOp, ": argument 'scaling.factor' must be positive, got ", s.factor);
  KBN_CHECK(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor, kCacheOp,
            ": arguments 'scaling.low_freq_factor' and 'scaling.high_freq_factor' must satisfy 0 < low < high, got ",
            s.low_freq_factor, " and ", s.high_freq_factor);
  KBN_CHECK(s.original_max_position_embeddings > 0, kCacheOp,
            ": argument 'scaling.original_max_position_embeddings' must be positive, got ",
            s.original_max_position_embeddings);
  const double original_max = double(s.original_max_position_embeddings);
  const double low_freq_wavelen = original_max / s.low_freq_factor;
  const double high_freq_wavelen = original_max / s.high_freq_factor;
  for (double& freq : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / freq;
    if (wavelen < high_freq_wavelen) continue;
    if (wavelen > low_freq_wavelen) {
      freq = freq / s.factor;
    } else {
      const double smooth = (original_max / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      freq = (1.0 - smooth) * freq / s.factor + smooth * freq;
    }
  }
}

// YaRN (vLLM yarn_scaling_rope.py and rotary_embedding/common.py, HF _compute_yarn_parameters): the frequency index
// d at which a wavelength turns r times within original_max positions is
//   d(r) = rotary_dim * ln(original_max / (2 pi r)) / (2 ln base),
// the correction range is [d(beta_fast), d(beta_slow)] (floor and ceil when `truncate`, clamped to [0, rotary_dim -
// 1]), and with ramp(i) = clamp((i - low) / (high - low), 0, 1) each frequency becomes
//   inv_freq[i] = inv_freq[i] / factor * ramp(i) + inv_freq[i] * (1 - ramp(i)):
// fast frequencies (below low) keep their value, slow ones (above high) are interpolated by `factor`.
void apply_yarn_scaling(std::vector<double>& inv_freq, int64_t rotary_dim, double base, const RopeScaling& s) {
  KBN_CHECK(s.factor > 0, kCacheOp, ": argument 'scaling.factor' must be positive, got ", s.factor);
  KBN_CHECK(s.original_max_position_embeddings > 0, kCacheOp,
            ": argument 'scaling.original_max_position_embeddings' must be positive, got ",
            s.original_max_position_embeddings);
  KBN_CHECK(s.beta_slow > 0 && s.beta_fast > s.beta_slow, kCacheOp,
            ": arguments 'scaling.beta_fast' and 'scaling.beta_slow' must satisfy 0 < beta_slow < beta_fast, got ",
            s.beta_fast, " and ", s.beta_slow);
  const double dim = double(rotary_dim), original_max = double(s.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original_max / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // as vLLM and HF: no division by zero
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    inv_freq[i] = inv_freq[i] / s.factor * ramp + inv_freq[i] * (1.0 - ramp);
  }
}

// Checks a rotary operand and returns its number of heads. x: [num_tokens, num_heads * head_size] (rows may be
// strided) or [num_tokens, num_heads, head_size].
int64_t check_rotary_operand(const Tensor& x, const char* arg, int64_t num_tokens, int64_t head_size) {
  check_defined(x, kRotaryOp, arg);
  check_dtype(x, kRotaryOp, arg, {DType::f32, DType::f16, DType::bf16});
  check_cpu(x, kRotaryOp, arg);
  KBN_CHECK(x.dim() == 2 || x.dim() == 3, kRotaryOp, ": argument '", arg,
            "' must be 2-D [num_tokens, num_heads * head_size] or 3-D [num_tokens, num_heads, head_size], got ",
            x.str());
  check_size(x, kRotaryOp, arg, 0, num_tokens, "num_tokens = positions.size(0)");
  if (x.dim() == 3) {
    check_size(x, kRotaryOp, arg, 2, head_size, "head_size");
    return x.size(1);
  }
  KBN_CHECK(x.size(1) % head_size == 0, kRotaryOp, ": argument '", arg,
            "' [num_tokens, num_heads * head_size] must have a last dimension divisible by head_size ", head_size,
            ", got ", x.str());
  return x.size(1) / head_size;
}

// Rotates the first rotary_dim features of every head of x in place. token_cos_sin: the cos_sin_cache row of each
// token's position, as doubles, [num_tokens, rotary_dim].
void rotate_heads(Tensor& x, const std::vector<double>& token_cos_sin, int64_t num_tokens, int64_t num_heads,
                  int64_t head_size, int64_t rotary_dim, bool is_neox) {
  const int64_t half = rotary_dim / 2;
  const int64_t row_width = num_heads * head_size;
  std::vector<double> v = x.to_doubles();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const double* cos_row = &token_cos_sin[size_t(t * rotary_dim)];
    const double* sin_row = cos_row + half;
    for (int64_t h = 0; h < num_heads; ++h) {
      double* head = &v[size_t(t * row_width + h * head_size)];
      for (int64_t i = 0; i < half; ++i) {
        // NeoX pairs feature i with i + half; GPT-J pairs 2i with 2i + 1. Both use frequency i.
        const int64_t a = is_neox ? i : 2 * i, b = is_neox ? i + half : 2 * i + 1;
        const double x1 = head[a], x2 = head[b];
        head[a] = x1 * cos_row[i] - x2 * sin_row[i];
        head[b] = x2 * cos_row[i] + x1 * sin_row[i];
      }
    }
  }
  x.copy_(Tensor::from_floats(std::vector<float>(v.begin(), v.end()), x.shape(), DType::f32));
}

}  // namespace

std::vector<double> rope_inv_freq(int64_t rotary_dim, double base, const RopeScaling& scaling) {
  KBN_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, kCacheOp, ": argument 'rotary_dim' must be positive and even, got ",
            rotary_dim);
  KBN_CHECK(std::isfinite(base) && base > 0, kCacheOp, ": argument 'base' must be finite and positive, got ", base);
  std::vector<double> inv_freq = default_inv_freq(rotary_dim, base);
  if (scaling.rope_type == "llama3") {
    apply_llama3_scaling(inv_freq, scaling);
  } else if (scaling.rope_type == "linear") {
    // HF _compute_linear_scaling_rope_parameters: every frequency divided by the factor (positions / factor).
    KBN_CHECK(scaling.factor > 0, kCacheOp, ": argument 'scaling.factor' must be positive, got ", scaling.factor);
    for (double& f : inv_freq) f /= scaling.factor;
  } else if (scaling.rope_type == "yarn") {
    apply_yarn_scaling(inv_freq, rotary_dim, base, scaling);
  } else {
    KBN_CHECK(scaling.rope_type == "default", kCacheOp,
              ": argument 'scaling.rope_type' must be \"default\", \"llama3\", \"linear\" or \"yarn\", got \"",
              scaling.rope_type, "\"");
  }
  return inv_freq;
}

double rope_attention_scaling(const RopeScaling& scaling) {
  if (scaling.rope_type != "yarn") return 1.0;
  KBN_CHECK(scaling.attention_factor >= 0, kCacheOp,
            ": argument 'scaling.attention_factor' must be positive (or 0: derived from the factor), got ",
            scaling.attention_factor);
  if (scaling.attention_factor > 0) return scaling.attention_factor;
  // vLLM yarn_get_mscale, HF get_mscale: 0.1 ln(factor) + 1, and 1 when the factor does not stretch.
  return scaling.factor <= 1 ? 1.0 : 0.1 * std::log(scaling.factor) + 1.0;
}

Tensor rope_cos_sin_cache(int64_t rotary_dim, int64_t max_position, double base, const RopeScaling& scaling) {
  KBN_CHECK(max_position > 0, kCacheOp, ": argument 'max_position' must be positive, got ", max_position);
  const std::vector<double> inv_freq = rope_inv_freq(rotary_dim, base, scaling);
  const double mscale = rope_attention_scaling(scaling);
  const int64_t half = rotary_dim / 2;
  std::vector<float> table(size_t(max_position * rotary_dim));
  // Positions are independent (a 128k-position table is millions of cos / sin): threads take ranges of them.
  parallel_for(max_position, grain_for(32 * half), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(p) * inv_freq[size_t(i)];
        table[size_t(p * rotary_dim + i)] = float(std::cos(angle) * mscale);
        table[size_t(p * rotary_dim + half + i)] = float(std::sin(angle) * mscale);
      }
    }
  });
  return Tensor::from_floats(table, {max_position, rotary_dim}, DType::f32);
}

void rotary_embedding(const Tensor& positions, Tensor& query, Tensor& key, int64_t head_size,
                      const Tensor& cos_sin_cache, bool is_neox) {
  check_rank(positions, kRotaryOp, "positions", 1, "[num_tokens]");
  check_dtype(positions, kRotaryOp, "positions", {DType::i64, DType::i32});
  check_cpu(positions, kRotaryOp, "positions");
  check_rank(cos_sin_cache, kRotaryOp, "cos_sin_cache", 2, "[max_position, rotary_dim]");
  check_dtype(cos_sin_cache, kRotaryOp, "cos_sin_cache", {DType::f32, DType::f16, DType::bf16});
  check_cpu(cos_sin_cache, kRotaryOp, "cos_sin_cache");
  KBN_CHECK(head_size > 0, kRotaryOp, ": argument 'head_size' must be positive, got ", head_size);
  const int64_t max_position = cos_sin_cache.size(0), rotary_dim = cos_sin_cache.size(1);
  KBN_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_size, kRotaryOp,
            ": argument 'cos_sin_cache' [max_position, rotary_dim] needs an even rotary_dim in [2, head_size = ",
            head_size, "], got ", cos_sin_cache.str());
  const int64_t num_tokens = positions.size(0);
  const int64_t num_heads = check_rotary_operand(query, "query", num_tokens, head_size);
  const int64_t num_kv_heads = check_rotary_operand(key, "key", num_tokens, head_size);

  const std::vector<int64_t> pos = positions.to_ints();
  for (int64_t t = 0; t < num_tokens; ++t) {
    KBN_CHECK(pos[size_t(t)] >= 0 && pos[size_t(t)] < max_position, kRotaryOp, ": argument 'positions': token ", t,
              " has position ", pos[size_t(t)], ", outside [0, max_position = ", max_position, ")");
  }
  // NOTE: only the rows in use are read; a 128k-position table is never converted whole.
  std::vector<double> token_cos_sin;
  token_cos_sin.reserve(size_t(num_tokens * rotary_dim));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const std::vector<double> row = cos_sin_cache.select(0, pos[size_t(t)]).to_doubles();
    token_cos_sin.insert(token_cos_sin.end(), row.begin(), row.end());
  }
  rotate_heads(query, token_cos_sin, num_tokens, num_heads, head_size, rotary_dim, is_neox);
  rotate_heads(key, token_cos_sin, num_tokens, num_kv_heads, head_size, rotary_dim, is_neox);
}

void fused_qk_norm_rope(Tensor& q_out, Tensor& k_out, const Tensor& qkv, const Tensor& positions,
                        const Tensor& q_weight, const Tensor& k_weight, const Tensor& cos_sin_cache, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, double eps, double weight_offset) {
  constexpr const char* op = "reference::fused_qk_norm_rope";
  check_rank(qkv, op, "qkv", 2, "[num_tokens, (num_heads + 2 num_kv_heads) * head_dim]");
  check_size(qkv, op, "qkv", 1, (heads + 2 * kv_heads) * head_dim, "(num_heads + 2 num_kv_heads) * head_dim");
  KBN_CHECK(weight_offset == 0.0 || weight_offset == 1.0, op, ": argument 'weight_offset' must be 0 (RMSNorm) or 1 ",
            "(GemmaRMSNorm), got ", weight_offset);
  const int64_t T = qkv.size(0), D = head_dim;
  const Tensor q_heads = qkv.as_strided({T, heads, D}, {qkv.stride(0), D, 1}, qkv.offset());
  const Tensor k_heads = qkv.as_strided({T, kv_heads, D}, {qkv.stride(0), D, 1}, qkv.offset() + heads * D);
  Tensor q3 = q_out.view({T, heads, D}), k3 = k_out.view({T, kv_heads, D});
  const auto norm = weight_offset == 0.0 ? &rms_norm : &gemma_rms_norm;
  norm(q3, q_heads, q_weight, eps);
  norm(k3, k_heads, k_weight, eps);
  rotary_embedding(positions, q_out, k_out, D, cos_sin_cache, true);
}

}  // namespace kbn::reference
