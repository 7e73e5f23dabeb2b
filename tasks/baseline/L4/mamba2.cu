#include "L4/mamba2.h"

#include <string_view>

#include "kbn/error.h"
#include "kbn/weight_loading.h"

namespace kbn::KBN_VARIANT {

Mamba2Model::Mamba2Model(const Mamba2Config& config, const std::string& prefix, const ParamOptions& opts)
    : embeddings(config.vocab_size, config.hidden_size, opts, prefix + ".embeddings"),
      norm_f(config.hidden_size, config.layer_norm_epsilon, opts) {
  register_module("embeddings", &embeddings);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers.push_back(std::make_unique<Mamba2DecoderLayer>(config, prefix + ".layers." + std::to_string(i), opts));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  register_module("norm_f", &norm_f);
}

Tensor Mamba2Model::forward(const Tensor& input_ids) {
  Tensor h = embeddings.forward(input_ids), residual;
  for (auto& layer : layers) std::tie(h, residual) = layer->forward(h, residual);
  std::tie(h, residual) = norm_f.forward(h, residual);
  return h;
}

Mamba2ForCausalLM::Mamba2ForCausalLM(const ModelConfig& config, const ParamOptions& opts)
    : config_(Mamba2Config::from(config)),
      dtype_(opts.dtype),
      backbone(config_, "backbone", opts),
      lm_head(config_.vocab_size, config_.hidden_size, false, opts, "lm_head") {
  register_module("backbone", &backbone);
  if (config_.tie_word_embeddings) {
    lm_head.tie_weights(backbone.embeddings);
  } else {
    register_module("lm_head", &lm_head);
  }
}

Tensor Mamba2ForCausalLM::forward(const Tensor& input_ids, const Tensor& positions) {
  (void)positions;
  return backbone.forward(input_ids);
}

Tensor Mamba2ForCausalLM::compute_logits(const Tensor& hidden_states) { return lm_head.forward(hidden_states); }

std::vector<LayerCacheSpec> Mamba2ForCausalLM::cache_specs() const {
  std::vector<LayerCacheSpec> specs;
  for (const auto& layer : backbone.layers) specs.push_back(layer->mixer.cache_spec(dtype_));
  return specs;
}

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string_view x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

// What the mixers' checkpoint tensors say of the config's shape fields, gathered as the tensors go by so that a
// config which disagrees with its checkpoint is named by field and value (the loader alone would name a parameter's
// shape, and the first tensor to disagree need not pin down which field is wrong: conv1d, first in a checkpoint's
// order, depends on four).
struct MixerShapeCheck {
  const Mamba2Config& c;
  int64_t heads = -1, channels = -1, conv_dim = -1, width = -1;  // -1: not seen yet
  std::string first;  // the first tensor that disagreed, as "'name' is f32[...]"

  // Records `t` when it is a mixer tensor; true when it disagrees with the config.
  bool observe(const std::string& name, const Tensor& t) {
    if (name.find(".mixer.") == std::string::npos) return false;
    bool bad = false;
    const auto note = [&](int64_t& slot, int64_t value, int64_t expected) {
      if (slot < 0) slot = value;
      bad = bad || value != expected;
    };
    if ((ends_with(name, ".A_log") || ends_with(name, ".D") || ends_with(name, ".dt_bias")) && t.dim() == 1)
      note(heads, t.size(0), c.num_heads);
    else if (ends_with(name, ".norm.weight") && t.dim() == 1)
      note(channels, t.size(0), c.intermediate_size);
    else if (ends_with(name, ".out_proj.weight") && t.dim() == 2)
      note(channels, t.size(1), c.intermediate_size);
    else if (ends_with(name, ".conv1d.bias") && t.dim() == 1)
      note(conv_dim, t.size(0), c.conv_dim());
    else if (ends_with(name, ".conv1d.weight") && t.dim() == 3) {
      note(conv_dim, t.size(0), c.conv_dim());
      note(width, t.size(2), c.conv_kernel);
    }
    if (bad && first.empty()) first = "'" + name + "' is " + t.str();
    return bad;
  }
  bool complete() const { return heads >= 0 && channels >= 0 && conv_dim >= 0 && width >= 0; }

  // The field(s) to blame, from what was seen; throws.
  [[noreturn]] void fail() const {
    const std::string pre = "Mamba2ForCausalLM: the config disagrees with its checkpoint (" + first + "): ";
    if (heads >= 0 && heads != c.num_heads)
      KBN_FAIL(pre, "'num_heads' is ", c.num_heads, ", the checkpoint has ", heads, " heads");
    if (width >= 0 && width != c.conv_kernel)
      KBN_FAIL(pre, "'conv_kernel' is ", c.conv_kernel, ", the checkpoint's conv is ", width, " wide");
    if (channels >= 0 && channels != c.intermediate_size)
      KBN_FAIL(pre, "'num_heads' x 'head_dim' is ", c.num_heads, " x ", c.head_dim, " = ", c.intermediate_size,
               " channels, the checkpoint has ", channels,
               channels % c.num_heads == 0 ? " ('head_dim' " + std::to_string(channels / c.num_heads) + ")" : std::string());
    const int64_t I = channels >= 0 ? channels : c.intermediate_size;
    const int64_t gn = conv_dim - I;
    KBN_FAIL(pre, "the conv's channels are intermediate_size + 2 x 'n_groups' x 'state_size' = ", c.intermediate_size,
             " + 2 x ", c.n_groups, " x ", c.state_size, " = ", c.conv_dim(), ", the checkpoint has ", conv_dim,
             channels >= 0 && gn > 0 && gn % 2 == 0
                 ? "; 'n_groups' x 'state_size' must be " + std::to_string(gn / 2) + " (the config has " +
                       std::to_string(c.n_groups * c.state_size) + ")"
                 : std::string());
  }
};

}  // namespace

void Mamba2ForCausalLM::load_weights(const WeightSource& weights) {
  const bool tied = config_.tie_word_embeddings;
  MixerShapeCheck check{config_};
  bool disagrees = false;
  // Once a mixer tensor disagrees, nothing more is loaded: the tensors that follow only complete the picture (the
  // first layer's mixer pins every field), then the error names the field.
  const WeightSource checked = [&](const WeightVisitor& visit) {
    weights([&](const std::string& name, const Tensor& t) {
      disagrees = check.observe(name, t) || disagrees;
      if (disagrees && check.complete()) check.fail();
      if (!disagrees) visit(name, t);
    });
    if (disagrees) check.fail();
  };
  load_stacked_weights(
      *this, checked, {}, [tied](const std::string& name) { return tied && name == "lm_head.weight"; },
      "Mamba2ForCausalLM");
}

}  // namespace kbn::KBN_VARIANT
