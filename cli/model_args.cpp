#include "cli/model_args.h"

#include <algorithm>
#include <filesystem>

#include "kbn/error.h"

namespace kbn::cli {

Device resolve_device(const std::string& device) {
  const Device d = device.empty() ? engine::default_device() : parse_device(device);
  KBN_CHECK(!d.is_cuda() || d.index < cuda_device_count(), "--device: ", d.str(), " is not available (",
            cuda_device_count(), " CUDA devices visible)");
  return d;
}

engine::ModelSpec resolve_model_spec(const std::string& model, const std::string& weights, Device device) {
  engine::ModelSpec spec = engine::resolve_model(model.empty() ? engine::default_model_name(device) : model);
  if (!weights.empty()) spec.weights_path = weights;
  engine::check_architecture_served(spec);
  return spec;
}

std::string resolve_tokenizer_path(const std::string& tokenizer, const std::string& weights,
                                   const engine::ModelSpec& spec) {
  if (!tokenizer.empty()) return tokenizer;
  if (!weights.empty()) {
    const std::filesystem::path beside = std::filesystem::path(weights) / "tokenizer.json";
    if (std::filesystem::is_regular_file(beside)) return beside.string();
  }
  return spec.tokenizer_path;
}

ModelEngine build_model_engine(const engine::ModelSpec& spec, Variant variant, const ParamOptions& popts,
                               uint64_t seed, Device device, const engine::EngineConfig& config,
                               engine::TensorParallelGroup* group) {
  ModelEngine m;
  if (!group) {
    m.model = engine::build_model(spec, variant, popts, seed);
    m.engine = std::make_unique<engine::LLMEngine>(*m.model, variant, device, config);
  } else {
    m.shards = engine::build_model_shards(spec, variant, popts, seed, *group);
    std::vector<CausalLM*> ptrs;
    for (auto& shard : m.shards) ptrs.push_back(shard.get());
    m.engine = std::make_unique<engine::LLMEngine>(ptrs, *group, variant, config);
  }
  return m;
}

void warm_up(engine::LLMEngine& eng, int64_t max_model_len, int64_t max_tokens) {
  engine::Request warm;
  warm.id = -1;
  warm.prompt.assign(size_t(std::min<int64_t>(16, max_model_len - 4)), 1);
  warm.sampling.max_tokens = max_tokens;
  warm.sampling.ignore_eos = true;
  eng.run_to_completion({warm});
}

}  // namespace kbn::cli
