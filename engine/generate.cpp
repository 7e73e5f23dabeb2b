#include "engine/generate.h"

#include <algorithm>

#include "engine/clock.h"
#include "engine/finite_check.h"
#include "engine/sampler.h"
#include "kbn/cache_spec.h"
#include "kbn/step_metadata.h"

namespace kbn::engine {

bool has_state_layers(const std::vector<LayerCacheSpec>& specs) {
  for (const LayerCacheSpec& s : specs)
    if (s.kind == LayerCacheSpec::Kind::state) return true;
  return false;
}

std::vector<KVCache> allocate_kv_caches(const std::vector<LayerCacheSpec>& specs, int64_t num_blocks,
                                        int64_t block_size, Device device, int64_t num_state_slots) {
  KBN_CHECK(num_blocks > 0 && block_size > 0, "allocate_kv_caches: need positive num_blocks and block_size, got ",
            num_blocks, " and ", block_size);
  // Paged layers read and write the pool tensor their KV cache group gives them: one per layer when every layer sees
  // the same window, shared across groups otherwise (kbn::KVCacheGroups).
  const KVCacheGroups groups = kv_cache_groups(specs);
  std::vector<KVCache> pool(size_t(groups.num_tensors));
  std::vector<KVCache> caches;
  for (size_t l = 0; l < specs.size(); ++l) {
    const LayerCacheSpec& spec = specs[l];
    if (spec.kind == LayerCacheSpec::Kind::state) {
      KBN_CHECK(num_state_slots >= 1, "allocate_kv_caches: layer ", l, " keeps a recurrent state (",
                spec.describe(), ") but no state slots were asked for");
      KVCache c;
      for (const Shape& shape : spec.state_shapes) {
        Shape full{num_state_slots};
        full.insert(full.end(), shape.begin(), shape.end());
        c.states.push_back(Tensor::zeros(full, spec.dtype, device));
      }
      caches.push_back(std::move(c));
      continue;
    }
    KBN_CHECK(spec.kind == LayerCacheSpec::Kind::paged_kv || spec.kind == LayerCacheSpec::Kind::paged_latent,
              "allocate_kv_caches: layer ", l, " declares a ", spec.describe(),
              " cache, a kind the engine has no cache for");
    KVCache& t = pool[size_t(groups.layer_tensor[l])];
    if (spec.kind == LayerCacheSpec::Kind::paged_latent && !t.latent.defined()) {
      t.latent = Tensor::zeros({num_blocks, block_size, spec.latent_size}, spec.dtype, device);
    } else if (spec.kind == LayerCacheSpec::Kind::paged_kv && !t.key.defined()) {
      const Shape s{num_blocks, block_size, spec.num_kv_heads, spec.head_size};
      t.key = Tensor::zeros(s, spec.dtype, device);
      t.value = Tensor::zeros(s, spec.dtype, device);
    }
    KVCache c = t;  // the same storage: a view of the pool tensor
    c.kv_group = groups.layer_group[l];
    c.sliding_window = spec.sliding_window;
    caches.push_back(std::move(c));
  }
  return caches;
}

namespace {

Tensor to_device_i64(const std::vector<int64_t>& v, Device d) { return Tensor::from_i64(v, {int64_t(v.size())}).to(d); }

}  // namespace

GenerateResult generate_tokens(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, Device device,
                               Variant variant, const GenerateOptions& opt) {
  KBN_CHECK(!prompts.empty(), "generate: at least one prompt is needed");
  KBN_CHECK(opt.max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ", opt.max_new_tokens);
  opt.sampling.validate();
  const int64_t vocab = model.vocab_size();
  for (size_t i = 0; i < prompts.size(); ++i) {
    KBN_CHECK(!prompts[i].empty(), "generate: prompt ", i, " is empty");
    for (int64_t t : prompts[i])
      KBN_CHECK(t >= 0 && t < vocab, "generate: prompt ", i, " holds token id ", t, " outside [0, ", vocab, ")");
  }
  const int64_t bs = opt.block_size, nseq = int64_t(prompts.size());

  // Every sequence reserves the blocks for its whole length up front, consecutive in the cache, in the table of each
  // KV cache group (kbn::KVCacheGroups; groups share pool tensors, so each needs blocks of its own).
  const std::vector<LayerCacheSpec> specs =
      with_kv_cache_dtype(model.cache_specs(), parse_kv_cache_dtype(opt.kv_cache_dtype, "generate: kv_cache_dtype"));
  const int64_t num_groups = kv_cache_groups(specs).num_groups();
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(nseq));
  std::vector<std::vector<std::vector<int32_t>>> more_tables(static_cast<size_t>(nseq));
  int64_t total_blocks = 0;
  for (int64_t i = 0; i < nseq; ++i) {
    const int64_t len = int64_t(prompts[size_t(i)].size()) + opt.max_new_tokens;
    more_tables[size_t(i)].resize(size_t(num_groups - 1));
    for (int64_t g = 0; g < num_groups; ++g) {
      std::vector<int32_t>& t = g == 0 ? tables[size_t(i)] : more_tables[size_t(i)][size_t(g - 1)];
      for (int64_t b = 0; b < (len + bs - 1) / bs; ++b) t.push_back(int32_t(total_blocks++));
    }
  }
  // A model with recurrent-state layers: prompt i keeps its state in slot i.
  const bool stateful = has_state_layers(specs);
  std::vector<KVCache> caches = allocate_kv_caches(specs, total_blocks, bs, device, stateful ? nseq : 0);
  auto slot_of = [&](int64_t i) { return stateful ? int32_t(i) : int32_t(-1); };

  Sampler sampler(variant);
  GenerateResult res;
  res.tokens.resize(size_t(nseq));
  // Row r of a step's logits belongs to prompt rows[r]; its output index is the number of tokens it has so far.
  auto choose = [&](const Tensor& logits, const std::vector<int64_t>& rows) {
    std::vector<const SamplingParams*> params(rows.size(), &opt.sampling);
    std::vector<int64_t> index;
    for (int64_t i : rows) index.push_back(int64_t(res.tokens[size_t(i)].size()));
    const std::vector<int64_t> next = sampler.sample(logits, params, index);
    for (size_t r = 0; r < rows.size(); ++r) {
      res.tokens[size_t(rows[r])].push_back(next[r]);
      if (opt.on_token) opt.on_token(size_t(rows[r]), next[r]);
    }
  };
  std::vector<int64_t> lens(static_cast<size_t>(nseq));

  // ---- prefill: every prompt in one step ----
  double t0 = steady_seconds();
  {
    std::vector<int64_t> ids;
    std::vector<StepSequence> seqs;
    for (int64_t i = 0; i < nseq; ++i) {
      const auto& p = prompts[size_t(i)];
      ids.insert(ids.end(), p.begin(), p.end());
      seqs.push_back({0, int64_t(p.size()), &tables[size_t(i)], true, slot_of(i), &more_tables[size_t(i)]});
      lens[size_t(i)] = int64_t(p.size());
    }
    const StepLayout layout = build_step_layout(seqs, bs);
    const AttentionMetadata md = upload_step_metadata(layout, device);
    ForwardContextGuard guard({&md, &caches});
    Tensor hidden = model.forward(to_device_i64(ids, device), to_device_i64(layout.positions, device));
    const std::vector<int32_t>& qsl = layout.query_start_loc;
    Tensor last = Tensor::empty({nseq, hidden.size(1)}, hidden.dtype(), device);
    for (int64_t i = 0; i < nseq; ++i)
      last.slice(0, i, i + 1).copy_(hidden.slice(0, qsl[size_t(i) + 1] - 1, qsl[size_t(i) + 1]));
    if (opt.return_prompt_logits) {
      Tensor logits = model.compute_logits(hidden).to(Device::cpu());
      for (int64_t i = 0; i < nseq; ++i)
        res.prompt_logits.push_back(logits.slice(0, qsl[size_t(i)], qsl[size_t(i) + 1]).clone());
    }
    Tensor last_logits = model.compute_logits(last);
    if (opt.check_finite) check_logits_finite(last_logits, hidden, md, caches, "prefill");
    if (opt.return_last_logits) res.last_logits = last_logits.to(Device::cpu());
    std::vector<int64_t> all(static_cast<size_t>(nseq));
    for (int64_t i = 0; i < nseq; ++i) all[size_t(i)] = i;
    choose(last_logits, all);
  }
  synchronize(device);
  double t1 = steady_seconds();
  res.prefill_seconds = t1 - t0;

  // ---- decode: one token per running sequence per step ----
  auto finished = [&](int64_t i) {
    const auto& t = res.tokens[size_t(i)];
    if (int64_t(t.size()) >= opt.max_new_tokens) return true;
    return std::find(opt.eos_token_ids.begin(), opt.eos_token_ids.end(), t.back()) != opt.eos_token_ids.end();
  };
  while (true) {
    std::vector<int64_t> running;
    for (int64_t i = 0; i < nseq; ++i)
      if (!finished(i)) running.push_back(i);
    if (running.empty()) break;
    std::vector<int64_t> ids;
    std::vector<StepSequence> seqs;
    for (int64_t i : running) {
      ids.push_back(res.tokens[size_t(i)].back());
      // feeds the token at lens[i]
      seqs.push_back({lens[size_t(i)], 1, &tables[size_t(i)], false, slot_of(i), &more_tables[size_t(i)]});
      lens[size_t(i)]++;
    }
    const StepLayout layout = build_step_layout(seqs, bs);
    const AttentionMetadata md = upload_step_metadata(layout, device);
    ForwardContextGuard guard({&md, &caches});
    Tensor hidden = model.forward(to_device_i64(ids, device), to_device_i64(layout.positions, device));
    const Tensor logits = model.compute_logits(hidden);
    if (opt.check_finite)
      check_logits_finite(logits, hidden, md, caches, "decode step " + std::to_string(res.decode_steps + 1));
    choose(logits, running);
    res.decode_steps++;
  }
  synchronize(device);
  res.decode_seconds = steady_seconds() - t1;
  return res;
}

}  // namespace kbn::engine
