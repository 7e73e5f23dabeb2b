#pragma once
// Finding a model by name, building it from the registry's L4 entry, and filling its weights from a local
// HF checkpoint or with seeded random values.
#include <memory>
#include <string>
#include <vector>

#include "kbn/causal_lm.h"
#include "kbn/config.h"
#include "kbn/registry.h"
#include "engine/tp_group.h"

namespace kbn::engine {

struct ModelSpec {
  std::string name;          // "llama-3.1-8b-instruct", or the path given
  std::string config_path;   // the config.json read
  std::string weights_path;  // HF folder or .safetensors file; empty = random weights
  // The model's tokenizer.json when it has one: a folder's own, the one beside a config.json path, or for a name
  // from models/ the file models/tokenizers/<name>.json (the tiny models'); empty when none.
  std::string tokenizer_path;
  ModelConfig config;
};

// The folder holding models/*.json: $KBN_MODELS_DIR, else <executable>/../models, else the source tree's.
std::string models_dir();
// Names of models/*.json (without .json), sorted.
std::vector<std::string> known_models();
// `name_or_path`: a name from models/ ("llama-3.1-8b-instruct"), a config.json path, or a local HF folder
// (config.json + safetensors, which become the weights). The error lists the known names.
ModelSpec resolve_model(const std::string& name_or_path);

// Throws naming the architecture and the supported ones when no L4 model of the registry serves the config (checked
// by the commands that run a model, before they read model-specific keys).
void check_architecture_served(const ModelSpec& spec);

// The longest sequence the model's positions allow: the language model's 'max_position_embeddings', or, for a
// model without positions (Mamba-2's recurrence has none), kNoPositionLimitDefault (a serving default; --max-model-len
// raises it).
constexpr int64_t kNoPositionLimitDefault = 65536;
int64_t max_positions(const ModelSpec& spec);

// The embedded default: a tiny Llama on CPU, Llama-3.1-8B-Instruct (random weights) when a GPU is present.
std::string default_model_name(Device device);
Device default_device();
// The model's own dtype on GPU (config torch_dtype), f32 on CPU (the oracle's precision).
DType default_dtype(const ModelSpec& spec, Device device);

// The checkpoint's quantization_config, if any, must be one the loader reads: compressed-tensors quantizing only the
// KV cache (kv_cache_scheme static fp8 per tensor, no config_groups: 16-bit weights plus per-layer k_scale / v_scale).
// Anything else is an error naming the config (build_model checks it before loading a checkpoint).
void check_checkpoint_quantization(const ModelSpec& spec);

// Builds the architecture's L4 model from `variant`'s registry and fills its weights: from
// spec.weights_path when set, else N(0, initializer_range) drawn from `seed` (norms = 1).
std::unique_ptr<CausalLM> build_model(const ModelSpec& spec, Variant variant, const ParamOptions& opts, uint64_t seed);

// Tensor parallel: one shard per rank of `group`, each built on its rank's thread and device (opts.device is
// replaced by group.device_of(rank)), all from the same checkpoint or seed. Random weights are drawn per
// shard, so a random model at TP > 1 is not the TP-1 model; a checkpoint gives the same model at every TP.
std::vector<std::unique_ptr<CausalLM>> build_model_shards(const ModelSpec& spec, Variant variant,
                                                          const ParamOptions& opts, uint64_t seed,
                                                          TensorParallelGroup& group);

}  // namespace kbn::engine
