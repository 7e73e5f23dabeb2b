#include "engine/generate.h"

#include <algorithm>

#include "engine/clock.h"

namespace kbn::engine {

std::vector<KVCache> allocate_kv_caches(const std::vector<LayerCacheSpec>& specs, int64_t num_blocks,
                                        int64_t block_size, Device device) {
  KBN_CHECK(num_blocks > 0 && block_size > 0, "allocate_kv_caches: need positive num_blocks and block_size, got ",
            num_blocks, " and ", block_size);
  std::vector<KVCache> caches;
  for (size_t l = 0; l < specs.size(); ++l) {
    const LayerCacheSpec& spec = specs[l];
    KBN_CHECK(spec.kind == LayerCacheSpec::Kind::paged_kv && spec.sliding_window == 0, "allocate_kv_caches: layer ",
              l, " declares a ", spec.describe(),
              " cache; the engine allocates full-attention paged K/V caches only so far");
    Shape s{num_blocks, block_size, spec.num_kv_heads, spec.head_size};
    caches.push_back({Tensor::zeros(s, spec.dtype, device), Tensor::zeros(s, spec.dtype, device)});
  }
  return caches;
}

namespace {

Tensor to_device_i64(const std::vector<int64_t>& v, Device d) { return Tensor::from_i64(v, {int64_t(v.size())}).to(d); }
Tensor to_device_i32(const std::vector<int32_t>& v, const Shape& s, Device d) { return Tensor::from_i32(v, s).to(d); }

}  // namespace

GenerateResult greedy_generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, Device device,
                               Variant variant, const GenerateOptions& opt) {
  KBN_CHECK(!prompts.empty(), "generate: at least one prompt is needed");
  KBN_CHECK(opt.max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ", opt.max_new_tokens);
  const int64_t vocab = model.vocab_size();
  for (size_t i = 0; i < prompts.size(); ++i) {
    KBN_CHECK(!prompts[i].empty(), "generate: prompt ", i, " is empty");
    for (int64_t t : prompts[i])
      KBN_CHECK(t >= 0 && t < vocab, "generate: prompt ", i, " holds token id ", t, " outside [0, ", vocab, ")");
  }
  const int64_t bs = opt.block_size, nseq = int64_t(prompts.size());

  // Every sequence reserves the blocks for its whole length up front.
  std::vector<int64_t> first_block(static_cast<size_t>(nseq)), nblocks(static_cast<size_t>(nseq));
  int64_t total_blocks = 0, max_blocks = 0;
  for (int64_t i = 0; i < nseq; ++i) {
    int64_t len = int64_t(prompts[size_t(i)].size()) + opt.max_new_tokens;
    nblocks[size_t(i)] = (len + bs - 1) / bs;
    first_block[size_t(i)] = total_blocks;
    total_blocks += nblocks[size_t(i)];
    max_blocks = std::max(max_blocks, nblocks[size_t(i)]);
  }
  std::vector<KVCache> caches = allocate_kv_caches(model.cache_specs(), total_blocks, bs, device);
  auto slot_of = [&](int64_t seq, int64_t pos) { return (first_block[size_t(seq)] + pos / bs) * bs + pos % bs; };
  auto block_table_rows = [&](const std::vector<int64_t>& seqs) {
    std::vector<int32_t> bt(seqs.size() * size_t(max_blocks), 0);
    for (size_t r = 0; r < seqs.size(); ++r)
      for (int64_t b = 0; b < nblocks[size_t(seqs[r])]; ++b)
        bt[r * size_t(max_blocks) + size_t(b)] = int32_t(first_block[size_t(seqs[r])] + b);
    return to_device_i32(bt, {int64_t(seqs.size()), max_blocks}, device);
  };

  std::unique_ptr<AnyOp> sampler = registry(variant).get("argmax").make(OpArgs{"argmax", {}, {}});
  GenerateResult res;
  res.tokens.resize(size_t(nseq));
  std::vector<int64_t> lens(static_cast<size_t>(nseq));

  // ---- prefill: every prompt in one step ----
  double t0 = steady_seconds();
  {
    std::vector<int64_t> ids, pos, slots, all(static_cast<size_t>(nseq));
    std::vector<int32_t> qsl{0}, seq_lens;
    int64_t max_len = 0;
    for (int64_t i = 0; i < nseq; ++i) {
      const auto& p = prompts[size_t(i)];
      all[size_t(i)] = i;
      for (int64_t j = 0; j < int64_t(p.size()); ++j) {
        ids.push_back(p[size_t(j)]);
        pos.push_back(j);
        slots.push_back(slot_of(i, j));
      }
      qsl.push_back(qsl.back() + int32_t(p.size()));
      seq_lens.push_back(int32_t(p.size()));
      lens[size_t(i)] = int64_t(p.size());
      max_len = std::max(max_len, int64_t(p.size()));
    }
    AttentionMetadata md;
    md.num_prefills = nseq;
    md.num_prefill_tokens = int64_t(ids.size());
    md.slot_mapping = to_device_i64(slots, device);
    md.query_start_loc = to_device_i32(qsl, {nseq + 1}, device);
    md.seq_lens = to_device_i32(seq_lens, {nseq}, device);
    md.block_tables = block_table_rows(all);
    md.max_prefill_query_len = max_len;
    md.max_prefill_seq_len = max_len;
    ForwardContextGuard guard({&md, &caches});
    Tensor hidden = model.forward(to_device_i64(ids, device), to_device_i64(pos, device));
    Tensor last = Tensor::empty({nseq, hidden.size(1)}, hidden.dtype(), device);
    for (int64_t i = 0; i < nseq; ++i)
      last.slice(0, i, i + 1).copy_(hidden.slice(0, qsl[size_t(i) + 1] - 1, qsl[size_t(i) + 1]));
    if (opt.return_prompt_logits) {
      Tensor logits = model.compute_logits(hidden).to(Device::cpu());
      for (int64_t i = 0; i < nseq; ++i)
        res.prompt_logits.push_back(logits.slice(0, qsl[size_t(i)], qsl[size_t(i) + 1]).clone());
    }
    Tensor last_logits = model.compute_logits(last);
    if (opt.return_last_logits) res.last_logits = last_logits.to(Device::cpu());
    std::vector<int64_t> next = sampler->call({last_logits})[0].to_ints();
    for (int64_t i = 0; i < nseq; ++i) res.tokens[size_t(i)].push_back(next[size_t(i)]);
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
    std::vector<int64_t> ids, pos, slots;
    std::vector<int32_t> seq_lens;
    int64_t max_len = 0;
    for (int64_t i : running) {
      int64_t p = lens[size_t(i)];  // the position of the token being fed
      ids.push_back(res.tokens[size_t(i)].back());
      pos.push_back(p);
      slots.push_back(slot_of(i, p));
      lens[size_t(i)] = p + 1;
      seq_lens.push_back(int32_t(p + 1));
      max_len = std::max(max_len, p + 1);
    }
    const int64_t n = int64_t(running.size());
    AttentionMetadata md;
    md.num_decodes = n;
    md.slot_mapping = to_device_i64(slots, device);
    md.query_start_loc = to_device_i32({0}, {1}, device);
    md.seq_lens = to_device_i32(seq_lens, {n}, device);
    md.block_tables = block_table_rows(running);
    md.max_decode_seq_len = max_len;
    ForwardContextGuard guard({&md, &caches});
    Tensor hidden = model.forward(to_device_i64(ids, device), to_device_i64(pos, device));
    std::vector<int64_t> next = sampler->call({model.compute_logits(hidden)})[0].to_ints();
    for (int64_t r = 0; r < n; ++r) res.tokens[size_t(running[size_t(r)])].push_back(next[size_t(r)]);
    res.decode_steps++;
  }
  synchronize(device);
  res.decode_seconds = steady_seconds() - t1;
  return res;
}

}  // namespace kbn::engine
