#pragma once
// What the subcommands that run a model (eval, generate, serve, bench) take from the same flags: the device, the
// model with its weights, and the tokenizer, each resolved and checked in one place.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/tp_group.h"
#include "kbn/device.h"

namespace CLI {
class App;
}

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

// The model (or, under tensor parallelism, one shard per rank of `group`) and the engine that runs it; the engine
// refers to the model, so they live and die together.
struct ModelEngine {
  std::unique_ptr<CausalLM> model;
  std::vector<std::unique_ptr<CausalLM>> shards;
  std::unique_ptr<engine::LLMEngine> engine;
};
// The model of `spec` with seeded random weights (or its checkpoint) on `device`, or sharded over `group` when one
// is given, and its engine.
ModelEngine build_model_engine(const engine::ModelSpec& spec, Variant variant, const ParamOptions& popts, uint64_t seed,
                               Device device, const engine::EngineConfig& config, engine::TensorParallelGroup* group);

// The overlapped nano-batch flags of eval and serve (engine/nano_batch.h), declared and checked in one place.
struct NanoBatchFlags {
  int count = 1;                   // --nano-batches
  int64_t min_tokens = 256;        // --nano-batch-min-tokens
  std::string split = "balanced";  // --nano-batch-split
  int gemm_sms = 0;                // --nano-batch-gemm-sms
  bool stagger = false;            // --nano-batch-stagger
  void add_to(CLI::App* cmd);
  bool given() const;  // any of them differs from its default
  // The engine's setting; refused naming the flag when out of range or given with --tp > 1.
  engine::NanoBatching resolve(int tp) const;
};

// One short request (16 prompt tokens, `max_tokens` out) through the engine before anything is timed or served:
// the first step of a process pays one-time costs (library handles, kernel loading, first allocations).
void warm_up(engine::LLMEngine& eng, int64_t max_model_len, int64_t max_tokens);

}  // namespace kbn::cli
