#include "engine/model_loader.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "kbn/model_view.h"
#include "kbn/safetensors.h"

namespace fs = std::filesystem;

namespace kbn::engine {

std::string models_dir() {
  if (const char* env = std::getenv("KBN_MODELS_DIR")) return env;
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = 0;
    fs::path p = fs::path(buf).parent_path().parent_path() / "models";
    if (fs::is_directory(p)) return p.string();
  }
#ifdef KBN_SOURCE_DIR
  return std::string(KBN_SOURCE_DIR) + "/models";
#else
  return "models";
#endif
}

std::vector<std::string> known_models() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(models_dir(), ec))
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

ModelSpec resolve_model(const std::string& name_or_path) {
  ModelSpec s;
  s.name = name_or_path;
  fs::path p(name_or_path);
  if (fs::is_directory(p)) {
    KBN_CHECK(fs::exists(p / "config.json"), "--model: folder '", name_or_path, "' has no config.json");
    s.config_path = (p / "config.json").string();
    s.weights_path = p.string();
  } else if (fs::is_regular_file(p)) {
    s.config_path = p.string();
  } else {
    fs::path named = fs::path(models_dir()) / (name_or_path + ".json");
    if (!fs::exists(named)) {
      std::string known;
      for (const auto& m : known_models()) known += (known.empty() ? "" : ", ") + m;
      KBN_FAIL("--model: '", name_or_path, "' is neither a model name in ", models_dir(),
               " nor a config/HF folder path; known models: ", known);
    }
    s.config_path = named.string();
    const fs::path tok = fs::path(models_dir()) / "tokenizers" / (name_or_path + ".json");
    if (fs::is_regular_file(tok)) s.tokenizer_path = tok.string();
  }
  if (s.tokenizer_path.empty()) {
    const fs::path beside = fs::path(s.config_path).parent_path() / "tokenizer.json";
    if (fs::is_regular_file(beside) && fs::path(s.config_path).filename() == "config.json")
      s.tokenizer_path = beside.string();
  }
  s.config = ModelConfig::load(s.config_path);
  // A config naming no architectures (the published Gemma-3-12B-it's) gets the one its model_type maps to, so every
  // reader of the spec sees it.
  if (s.config.architectures().empty()) {
    const auto archs = registry(Variant::baseline).architectures_of(s.config);
    if (!archs.empty())
      s.config = s.config.with_overrides("{\"architectures\": [\"" + archs.front() + "\"]}",
                                         s.config_path + " (architectures from its model_type)");
  }
  return s;
}

Device default_device() { return cuda_available() ? Device::cuda(0) : Device::cpu(); }

std::string default_model_name(Device device) { return device.is_cuda() ? "llama-3.1-8b-instruct" : "tiny-llama"; }

DType default_dtype(const ModelSpec& spec, Device device) {
  if (device.is_cpu()) return DType::f32;
  DType dt = parse_dtype(spec.config.get_string("torch_dtype", spec.config.get_string("dtype", "bfloat16")));
  return dt == DType::f32 ? DType::bf16 : dt;
}

namespace {

// A config asking for an attention feature that the architecture's model does not apply would run as if the feature
// were absent: silently wrong logits. The L4 entry declares what it applies ("sliding_window", "logits_soft_cap");
// ModelView reads what the config asks for (a window unless use_sliding_window is false, attn_logit_softcapping).
void check_attention_features(const ModelSpec& spec, const OpEntry& entry) {
  const ModelView view = ModelView::from(spec.name, std::make_shared<const ModelConfig>(spec.config.language_model()), 1);
  if (!view.attention) return;
  auto declares = [&](const char* f) {
    return std::find(entry.features.begin(), entry.features.end(), f) != entry.features.end();
  };
  KBN_CHECK(view.attention->sliding_window == 0 || declares("sliding_window"), "model config ", spec.config_path,
            ": 'sliding_window' is ", view.attention->sliding_window, ", but kb-nano's ", entry.name,
            " applies no sliding window (set it to null, or 'use_sliding_window' to false, for full attention)");
  KBN_CHECK(view.attention->logits_soft_cap == 0 || declares("logits_soft_cap"), "model config ", spec.config_path,
            ": 'attn_logit_softcapping' is ", view.attention->logits_soft_cap, ", but kb-nano's ", entry.name,
            " applies no logit soft-capping");
}

}  // namespace

void check_architecture_served(const ModelSpec& spec) {
  const auto archs = spec.config.architectures();
  KBN_CHECK(!archs.empty(), "model config ", spec.config_path, ": 'architectures' is missing or empty");
  (void)registry(Variant::baseline).model_for(archs.front());
}

std::unique_ptr<CausalLM> build_model(const ModelSpec& spec, Variant variant, const ParamOptions& opts, uint64_t seed) {
  auto archs = spec.config.architectures();
  KBN_CHECK(!archs.empty(), "model config ", spec.config_path, ": 'architectures' is missing or empty");
  const OpEntry& entry = registry(variant).model_for(archs.front());
  check_attention_features(spec, entry);
  std::unique_ptr<CausalLM> model = entry.make_model(spec.config, opts);
  if (!spec.weights_path.empty()) {
    check_checkpoint_quantization(spec);
    Checkpoint ckpt = Checkpoint::open(spec.weights_path);
    model->load_weights([&](const WeightVisitor& visit) { ckpt.for_each(visit); });
  } else {
    init_random_weights(*model, seed, spec.config.get_double("initializer_range", 0.02));
  }
  model->process_weights_after_loading_recursive();
  return model;
}

void check_checkpoint_quantization(const ModelSpec& spec) {
  if (!spec.config.has("quantization_config")) return;
  const ModelConfig q = spec.config.sub("quantization_config");
  // Quantized checkpoints (DeepSeek-V3's block-scaled fp8: quant_method "fp8"; compressed-tensors with config_groups)
  // hold weights and scale tensors this loader would not read correctly; random weights for the same config are
  // 16-bit and fine. The one exception: compressed-tensors quantizing only the KV cache (llm-compressor's
  // kv_cache_scheme without config_groups), whose checkpoint is 16-bit weights plus each attention layer's per-tensor
  // fp8 k_scale / v_scale, which --kv-cache-dtype fp8 uses.
  const bool kv_only = q.get_string("quant_method", "") == "compressed-tensors" && q.has("kv_cache_scheme") &&
                       (!q.has("config_groups") || q.sub("config_groups").keys().empty());
  KBN_CHECK(kv_only, "model config ", spec.config_path,
            ": the checkpoint is quantized ('quantization_config'); kb-nano loads 16- and 32-bit checkpoints only "
            "(run the config with random weights, or a dequantized checkpoint), and of quantized ones those that "
            "quantize only the KV cache (compressed-tensors' kv_cache_scheme with no config_groups)");
  const ModelConfig kv = q.sub("kv_cache_scheme");
  const std::string type = kv.get_string("type", ""), strategy = kv.get_string("strategy", "");
  const int64_t bits = kv.has("num_bits") ? kv.get_int("num_bits") : 0;
  KBN_CHECK(type == "float" && bits == 8 && strategy == "tensor" && !kv.get_bool("dynamic", false), "model config ",
            spec.config_path, ": quantization_config.kv_cache_scheme must be static fp8 per tensor (type float, "
            "num_bits 8, strategy tensor, dynamic false: one k_scale and one v_scale per layer), got type '", type,
            "', num_bits ", bits, ", strategy '", strategy, "'");
}

std::vector<std::unique_ptr<CausalLM>> build_model_shards(const ModelSpec& spec, Variant variant,
                                                          const ParamOptions& opts, uint64_t seed,
                                                          TensorParallelGroup& group) {
  std::vector<std::unique_ptr<CausalLM>> shards(static_cast<size_t>(group.size()));
  group.run([&](int rank) {
    ParamOptions p = opts;
    p.device = group.device_of(rank);
    shards[size_t(rank)] = build_model(spec, variant, p, seed);
  });
  return shards;
}

int64_t max_positions(const ModelSpec& spec) {
  const ModelConfig lm = spec.config.language_model();
  return lm.has("max_position_embeddings") ? lm.get_int("max_position_embeddings") : kNoPositionLimitDefault;
}

}  // namespace kbn::engine
