#include "bench/cases.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "kbn/error.h"
#include "kbn/rng.h"

namespace kbn::bench {

ModelView model_view(const std::string& name, const ModelConfig& config, int64_t tp) {
  // A multimodal checkpoint (Gemma-3's Gemma3ForConditionalGeneration) nests its language model's shapes in
  // `text_config`: the ops see those, under the checkpoint's architecture.
  ModelView m = ModelView::from(name, std::make_shared<const ModelConfig>(config.language_model()), tp);
  const auto archs = registry(Variant::baseline).architectures_of(config);
  m.architecture = archs.empty() ? "" : archs.front();
  // An architecture with no L4 model yet still has the shapes of its ops (gpt-oss's attention before its model):
  // its L1 ops are benchmarked, and model_ops below names the missing model.
  if (const OpEntry* l4 = registry(Variant::baseline).find_model_for(m.architecture)) m.features = l4->features;
  if (m.attention) m.attention->sinks = m.has_feature("attention_sinks");
  return m;
}

std::vector<std::string> model_ops(const ModelView& m, int level) {
  const Registry& reg = registry(Variant::baseline);
  const auto closure = include_graph(Variant::baseline).closure(reg.model_for(m.architecture).header);
  std::vector<std::string> out;
  for (const auto& e : reg.entries())
    if (e.level == level && e.cases && (closure.count(e.header) || e.every_model)) out.push_back(e.name);
  return out;
}

std::vector<BenchCase> cases_for(const std::string& op, const ModelView& m, const CaseOptions& options) {
  const Registry& reg = registry(Variant::baseline);
  const OpEntry* e = reg.find(op);
  if (!e || !e->cases) {
    std::string known;
    for (const auto& x : reg.entries())
      if (x.cases) known += (known.empty() ? "" : ", ") + x.name;
    KBN_FAIL("--target: '", op, "' is not a benchmarked op; expected one of ", known);
  }
  for (int64_t t : options.tokens) KBN_CHECK(t > 0, "--tokens: expected positive token counts, got ", t);
  const DType dt = options.dtype;
  KBN_CHECK(dt == DType::bf16 || dt == DType::f16 || dt == DType::f32, "--dtype: expected bf16, f16 or f32, got ",
            dtype_name(dt));
  return e->cases(m, options);
}

namespace {

// A config with the shape keys of `j` written over `base`'s: random shapes keep everything else.
std::shared_ptr<const ModelConfig> config_with(const ModelConfig& base, const nlohmann::json& keys) {
  return std::make_shared<const ModelConfig>(base.with_overrides(keys.dump(), "random shapes from " + base.source()));
}

}  // namespace

std::vector<BenchCase> random_cases(const std::string& op, const ModelView& like, int count, uint64_t seed,
                                    bool small, DType dtype, std::optional<DType> kv_cache_dtype) {
  KBN_CHECK(count >= 0, "--random: expected a count >= 0, got ", count);
  const OpEntry& e = registry(Variant::baseline).get(op);
  const bool block = e.level >= 2;
  const ModelConfig& base = *like.config;
  std::vector<BenchCase> out;
  std::mt19937_64 gen(hash_seed(seed, ("random-shapes/" + op).c_str()));
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); };
  for (int i = 0; i < count; ++i) {
    nlohmann::json keys;
    const int64_t head_dim = pick(0, 1) ? 128 : 64;
    const int64_t kv_heads = pick(1, small ? 2 : 8);
    keys["head_dim"] = head_dim;
    keys["num_key_value_heads"] = kv_heads;
    keys["num_attention_heads"] = kv_heads * pick(1, small ? 4 : 8);
    // Odd sizes on purpose: kernels that assume a multiple of their vector width must handle the tail.
    keys["hidden_size"] = small ? pick(17, 700) : pick(257, 8191);
    keys["intermediate_size"] = small ? pick(17, 900) : pick(257, 15000);
    keys["vocab_size"] = small ? pick(65, 3000) : pick(1000, 70000);
    keys["max_position_embeddings"] = std::max<int64_t>(like.max_position_embeddings, 8192);
    if (like.mamba) {
      // Mamba-2: heads in groups, odd head and state sizes where the kernels take them (the SSD scan's tensor-core
      // tiles take 16..128 in powers of two), the channel count tied to them, the config's chunk size.
      const int64_t groups = pick(1, small ? 3 : 8), heads = groups * pick(1, small ? 3 : 16);
      const int64_t pow2[] = {16, 32, 64, 128};
      const int64_t hd = pow2[pick(0, small ? 1 : 3)];
      keys["n_groups"] = groups;
      keys["num_heads"] = heads;
      keys["head_dim"] = hd;
      keys["intermediate_size"] = heads * hd;
      keys["state_size"] = pow2[pick(0, small ? 1 : 3)];
      keys["conv_kernel"] = pick(2, 4);
    }
    const int64_t tokens = small ? pick(1, 40) : pick(1, 2500);
    ModelView m = ModelView::from("random", config_with(base, keys), 1);
    m.features = like.features;
    if (m.attention) m.attention->sinks = m.has_feature("attention_sinks");
    CaseOptions o;
    o.dtype = dtype;
    o.kv_cache_dtype = kv_cache_dtype;
    o.random = true;
    o.small = small;
    // Blocks: small decode batches (the cache holds 1024 tokens per sequence) or a short prefill.
    o.tokens = {block ? (pick(0, 1) ? pick(1, small ? 3 : 64) : pick(cases::kDecodeMaxTokens + 1, small ? 300 : 2500))
                      : tokens};
    for (auto& b : e.cases(m, o)) {
      b.label = "random#" + std::to_string(i) + " " + b.label;
      out.push_back(std::move(b));
    }
  }
  return out;
}

namespace {

// An op that runs every call under its own forward context (blocks containing attention or a recurrent state): a
// one-layer cache holding the cached tokens or the sequences' states, and the step's metadata, identical for every
// variant and device. A step advances recurrent states, so each call first restores them from a snapshot taken when
// the context was made: every call then sees the same states (the determinism check needs that), and the timed call
// includes that one copy of the step's states.
class ContextOp final : public AnyOp {
 public:
  ContextOp(std::unique_ptr<AnyOp> inner, std::shared_ptr<StepContext> ctx)
      : inner_(std::move(inner)), ctx_(std::move(ctx)) {
    for (const KVCache& layer : ctx_->kv_caches)
      for (const Tensor& s : layer.states) snapshot_.push_back(s.clone());
  }
  Module& module() override { return inner_->module(); }
  std::vector<Tensor> call(const std::vector<Tensor>& args) override {
    size_t k = 0;
    for (KVCache& layer : ctx_->kv_caches)
      for (Tensor& s : layer.states) s.copy_(snapshot_[k++]);
    ForwardContextGuard guard({&ctx_->metadata, &ctx_->kv_caches});
    return inner_->call(args);
  }

 private:
  std::unique_ptr<AnyOp> inner_;
  std::shared_ptr<StepContext> ctx_;
  std::vector<Tensor> snapshot_;
};

}  // namespace

std::unique_ptr<AnyOp> build_case_op(const OpEntry& entry, const BenchCase& c, Device device, uint64_t seed) {
  OpArgs a = c.args;
  a.opts = ParamOptions{c.dtype, device};
  std::unique_ptr<AnyOp> op = entry.make(a);
  init_random_weights(op->module(), seed, cases::kWeightStd);
  op->module().process_weights_after_loading_recursive();  // what a loader does after the weights are in
  if (c.make_context) return std::make_unique<ContextOp>(std::move(op), c.make_context(device, seed));
  return op;
}

std::string format_case_list(const std::vector<BenchCase>& cases) {
  std::string text;
  char line[512];
  std::snprintf(line, sizeof line, "%-20s %-24s %3s  %-48s %16s %18s\n", "op", "model", "tp", "case", "bytes", "FLOPs");
  text += line;
  for (const auto& c : cases) {
    std::snprintf(line, sizeof line, "%-20s %-24s %3lld  %-48s %16lld %18lld\n", c.op.c_str(), c.model.c_str(),
                  (long long)c.tp, c.label.c_str(), (long long)c.bytes, (long long)c.flops);
    text += line;
  }
  return text;
}

}  // namespace kbn::bench
