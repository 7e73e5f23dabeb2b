#pragma once
// What the subcommands that run a model (eval, generate, serve, bench) take from the same flags: the device, the
// model with its weights, and the tokenizer, each resolved and checked in one place.
#include <string>

#include "engine/model_loader.h"
#include "kbn/device.h"

namespace kbn::cli {

// --device: the named device ("cpu", "cuda", "cuda:N"), or the default one when empty; a CUDA device that is not
// there is refused, naming the flag and how many are visible.
Device resolve_device(const std::string& device);

// --model (empty: the default for `device`) with --weights (a folder or .safetensors file; empty: random weights),
// refused unless an L4 model serves its architecture.
engine::ModelSpec resolve_model_spec(const std::string& model, const std::string& weights, Device device);

// The tokenizer.json a command reads: --tokenizer, else the one beside --weights, else the model's own ("" when
// there is none).
std::string resolve_tokenizer_path(const std::string& tokenizer, const std::string& weights,
                                   const engine::ModelSpec& spec);

}  // namespace kbn::cli
