#include "cli/model_args.h"

#include <algorithm>
#include <filesystem>

#include "cli/args.h"
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

ModelEngine build_model_engine(const engine::ModelSpec& spec, Variant variant, const ParamOptions& popts, uint64_t seed,
                               Device device, const engine::EngineConfig& config, engine::TensorParallelGroup* group) {
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

void NanoBatchFlags::add_to(CLI::App* cmd) {
  cmd->add_option("--nano-batches", count,
                  "Overlapped nano-batches (NanoFlow's): a step run eagerly runs as N nano-batches (fewer when it has "
                  "fewer sequences) when each gets --nano-batch-min-tokens tokens, each the whole model on a CUDA "
                  "stream of its own, so one's decode attention can run under another's GEMMs; steps a CUDA graph "
                  "serves are not split; --tp 1 only (default 1: off; at most 8)");
  cmd->add_option("--nano-batch-min-tokens", min_tokens,
                  "Tokens per nano-batch below which a step is not split (default 256)")
      ->check(integer_at_least(1));
  cmd->add_option("--nano-batch-split", split,
                  "How a step's sequences are dealt to nano-batches: balanced (default: prefill chunks and decodes "
                  "alike, token counts evened out) or kind (chunks to the first half of the nano-batches, decodes to "
                  "the rest on high-priority streams, so decode attention meets prefill GEMMs)");
  cmd->add_option("--nano-batch-gemm-sms", gemm_sms,
                  "SMs each nano-batch's cuBLASLt GEMMs aim at (cuBLASLt's SM count target), leaving the rest to the "
                  "other nano-batch's kernels, as NanoFlow partitions the SMs (default 0: the whole GPU)")
      ->check(integer_at_least(0));
  cmd->add_flag("--nano-batch-stagger", stagger,
                "Each nano-batch after the first starts once the one before has reached its first layer's attention, "
                "so that one's attention runs under the next one's GEMMs (without it they start together and run the "
                "same kinds of kernel at once; CUDA only)");
}

bool NanoBatchFlags::given() const {
  return count != 1 || min_tokens != 256 || split != "balanced" || gemm_sms != 0 || stagger;
}

engine::NanoBatching NanoBatchFlags::resolve(int tp) const {
  const engine::NanoBatching nb{count, min_tokens, engine::parse_nano_batch_split(split, "--nano-batch-split"),
                                gemm_sms, stagger};
  engine::check_nano_batching(nb, "--nano-batches / --nano-batch-min-tokens / --nano-batch-gemm-sms");
  KBN_CHECK(count > 1 || !given(),
            "--nano-batch-min-tokens / --nano-batch-split / --nano-batch-gemm-sms / "
            "--nano-batch-stagger set how steps split into nano-batches: give --nano-batches N (N >= 2) with them");
  KBN_CHECK(count == 1 || tp == 1, "--nano-batches ", count,
            ": overlapped nano-batches need --tp 1 (each rank's all-reduces have one communicator and one staging "
            "buffer, which two nano-batches would use at once), got --tp ",
            tp);
  return nb;
}

}  // namespace kbn::cli
