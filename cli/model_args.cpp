#include "cli/model_args.h"

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

}  // namespace kbn::cli
