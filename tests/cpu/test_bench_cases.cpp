// The kernel bench's cases: byte and FLOP counts checked by hand, shapes derived from the configs (TP
// splits), the --list text, the cold-L2 rotation sizing and the CPU path of the output check.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/cases.h"
#include "bench/timing.h"
#include "bench/validate.h"
#include "kbn/config.h"
#include "kbn/error.h"
#include "kbn/module.h"
#include "kbn/registry.h"
#include "reference/reference.h"

using namespace kbn;

namespace {

ModelConfig load_config(const std::string& name) {
  return ModelConfig::load(std::string(KBN_SOURCE_DIR) + "/models/" + name + ".json");
}

ModelView view_of(const std::string& model, int64_t tp = 1) { return bench::model_view(model, load_config(model), tp); }

std::vector<bench::BenchCase> op_cases(const std::string& op, int64_t tp, std::vector<int64_t> tokens,
                                    const std::string& model = "llama-3.1-8b-instruct") {
  bench::CaseOptions o;
  o.tokens = std::move(tokens);
  return bench::cases_for(op, view_of(model, tp), o);
}

const bench::BenchCase& find_label(const std::vector<bench::BenchCase>& cs, const std::string& prefix) {
  auto it = std::find_if(cs.begin(), cs.end(), [&](const auto& c) { return c.label.rfind(prefix, 0) == 0; });
  if (it == cs.end()) throw Error("no case labelled " + prefix);
  return *it;
}

}  // namespace

TEST(BenchCases, RmsNormBytesAndFlopsByHand) {
  auto cs = op_cases("rms_norm", 1, {4096});
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].label, "T=4096 H=4096");
  EXPECT_EQ(cs[0].bytes, 2LL * 4096 * 4096 * 2 + 4096 * 2);  // x read + out written (bf16) + weight read
  EXPECT_EQ(cs[0].flops, 4LL * 4096 * 4096);
  auto fused = op_cases("fused_add_rms_norm", 1, {4096});
  EXPECT_EQ(fused[0].bytes, 4LL * 4096 * 4096 * 2 + 4096 * 2);  // x, residual read and written
}

TEST(BenchCases, LinearShapesOfLlama8B) {
  auto cs = op_cases("linear", 1, {1});
  ASSERT_EQ(cs.size(), 5u);  // qkv, o, gate_up, down, lm_head
  const auto& qkv = find_label(cs, "qkv ");
  EXPECT_EQ(qkv.label, "qkv T=1 N=6144 K=4096");
  EXPECT_EQ(qkv.flops, 2LL * 1 * 6144 * 4096);
  EXPECT_EQ(qkv.bytes, (1LL * 4096 + 6144LL * 4096 + 1LL * 6144) * 2);
  EXPECT_EQ(find_label(cs, "o ").label, "o T=1 N=4096 K=4096");
  EXPECT_EQ(find_label(cs, "gate_up ").label, "gate_up T=1 N=28672 K=4096");
  EXPECT_EQ(find_label(cs, "down ").label, "down T=1 N=4096 K=14336");
  EXPECT_EQ(find_label(cs, "lm_head ").label, "lm_head T=1 N=128256 K=4096");
}

TEST(BenchCases, TensorParallelHalvesPerRankSizes) {
  auto lin = op_cases("linear", 2, {1});
  EXPECT_EQ(find_label(lin, "qkv ").label, "qkv T=1 N=3072 K=4096");
  EXPECT_EQ(find_label(lin, "o ").label, "o T=1 N=4096 K=2048");
  EXPECT_EQ(find_label(lin, "gate_up ").label, "gate_up T=1 N=14336 K=4096");
  EXPECT_EQ(find_label(lin, "down ").label, "down T=1 N=4096 K=7168");
  EXPECT_EQ(find_label(lin, "lm_head ").label, "lm_head T=1 N=64128 K=4096");
  EXPECT_EQ(op_cases("silu_and_mul", 2, {8})[0].label, "T=8 I=7168");
  EXPECT_EQ(op_cases("rotary_embedding", 2, {8})[0].label, "T=8 heads=16 kv=4 D=128");
  EXPECT_EQ(op_cases("rms_norm", 2, {8})[0].label, "T=8 H=4096");  // replicated, not split
  // 70B at TP 8: one kv head per rank.
  auto dec = op_cases("flash_attn_decode", 8, {1}, "llama-3.1-70b-instruct");
  EXPECT_EQ(dec[0].label, "B=1 ctx=1024 heads=8 kv=1 D=128");
  EXPECT_EQ(dec[0].bytes, 2LL * 1 * 1024 * 1 * 128 * 2 + 2LL * 1 * 8 * 128 * 2 + 1 * 4 + 1 * 64 * 4);
}

TEST(BenchCases, DefaultTokenCountsAndAttentionBatches) {
  EXPECT_EQ(op_cases("rms_norm", 1, {}).size(), 12u);           // 6 decode + 6 prefill
  EXPECT_EQ(op_cases("linear", 1, {}).size(), 60u);             // 5 GEMMs x 12
  EXPECT_EQ(op_cases("flash_attn_decode", 1, {}).size(), 15u);  // 5 batches x 3 contexts
  auto prefill = op_cases("flash_attn_prefill", 1, {});
  EXPECT_EQ(prefill.size(), 8u);  // 6 single sequences + 8192 and 16384 as batches of 4096
  const auto& batch = find_label(prefill, "seqs=4x4096");
  EXPECT_EQ(batch.tokens, 16384);
  EXPECT_EQ(batch.flops, 4LL * 32 * 128 * 4 * (4096LL * 4097 / 2));
  // The launch maxima travel as constructor arguments, so the timed call does no host read and can be captured.
  EXPECT_TRUE(batch.graph_capturable);
  EXPECT_EQ(batch.args.get_int("max_query_len"), 4096);
  EXPECT_EQ(batch.args.get_int("max_seq_len"), 4096);
  // Labels are unique within an (op, model, tp).
  auto lin = op_cases("linear", 1, {});
  std::set<std::string> labels;
  for (const auto& c : lin) labels.insert(c.label);
  EXPECT_EQ(labels.size(), lin.size());
}

TEST(BenchCases, ErrorsNameTheFlag) {
  try {
    op_cases("rms_norm", 3, {1});
    FAIL() << "tp 3 accepted for 32 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tp"), std::string::npos) << e.what();
  }
  try {
    op_cases("softmax", 1, {1});
    FAIL() << "unknown op accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--target"), std::string::npos) << e.what();
  }
}

TEST(BenchCases, ListTextWorksOnCpu) {
  const std::string text = bench::format_case_list(op_cases("rms_norm", 1, {4096}));
  EXPECT_NE(text.find("rms_norm"), std::string::npos);
  EXPECT_NE(text.find("llama-3.1-8b-instruct"), std::string::npos);
  EXPECT_NE(text.find("T=4096 H=4096"), std::string::npos);
  EXPECT_NE(text.find(std::to_string(2LL * 4096 * 4096 * 2 + 4096 * 2)), std::string::npos);
}

TEST(BenchCases, InputsMatchTheForwardSignature) {
  auto store = op_cases("store_kvcache", 1, {40})[0];
  auto in = store.make_inputs(Device::cpu(), 7);
  ASSERT_EQ(in.size(), 5u);
  EXPECT_EQ(in[0].shape(), (Shape{40, 8, 128}));
  EXPECT_EQ(in[2].shape(), (Shape{3, 16, 8, 128}));
  auto slots = in[4].to_ints();
  EXPECT_EQ(std::set<int64_t>(slots.begin(), slots.end()).size(), slots.size());  // distinct slots
  EXPECT_LT(*std::max_element(slots.begin(), slots.end()), 48);
  auto emb = op_cases("embedding", 2, {64}, "tiny-llama")[0].make_inputs(Device::cpu(), 1);
  EXPECT_EQ(emb[1].shape(), (Shape{256, 64}));  // vocab 512 split over 2 ranks
  auto ids = emb[0].to_ints();
  EXPECT_LT(*std::max_element(ids.begin(), ids.end()), 256);  // inside the rank's shard
}

TEST(BenchCases, CpuOutputCheckPassesOnIdenticalOps) {
  const auto c = op_cases("rms_norm", 1, {2})[0];
  ASSERT_TRUE(bench::fits_cpu_oracle(c));
  OpArgs args = c.args;
  args.opts = ParamOptions{c.dtype, Device::cpu()};
  const OpEntry& entry = registry(Variant::baseline).get(c.op);
  auto a = entry.make(args), b = entry.make(args);
  init_random_weights(a->module(), 3, 0.02);
  init_random_weights(b->module(), 3, 0.02);
  const auto result = bench::validate_candidate(c, entry, *a, *b, nullptr, Device::cpu(), 3, {});
  EXPECT_TRUE(result.pass) << result.summary();
  EXPECT_FALSE(bench::fits_cpu_oracle(op_cases("linear", 1, {16384})[0]));
}

TEST(BenchTiming, ColdInputSetsExceedThreeL2s) {
  const long long l2 = 50LL << 20;
  EXPECT_EQ(bench::cold_input_sets(1LL << 20, l2), 16);   // capped at 16 sets
  EXPECT_EQ(bench::cold_input_sets(100LL << 20, l2), 2);  // 2 x 100 MiB > 150 MiB
  EXPECT_EQ(bench::cold_input_sets(4LL << 30, l2), 1);    // one set already exceeds 3x L2 (and 8 GiB caps it)
  EXPECT_EQ(bench::parse_timing_mode("graph"), bench::TimingMode::graph);
  EXPECT_THROW(bench::parse_timing_mode("warm"), Error);
}

TEST(BenchTiming, CaseThatCannotFitIsSkippedWithItsSizes) {
  const long long gib = 1LL << 30;
  EXPECT_EQ(bench::case_does_not_fit(8 * gib, 2, 140 * gib), "");
  EXPECT_EQ(bench::case_does_not_fit(64 * gib, 2, 140 * gib),
            "does not fit: 2 input sets of 64.0 GiB held at once need 128.0 GiB, more than 90% of the device's "
            "140.0 GiB");
  EXPECT_EQ(bench::case_does_not_fit(64 * gib, 2, 0), "");  // unknown device size: run it
}

TEST(BenchCases, AttentionAdapterUsesTheHostMaximaItIsGiven) {
  // The decode adapter launches with the case's max_seq_len (no device read); on CPU the result is the oracle's.
  auto dec = op_cases("flash_attn_decode", 1, {2});
  const bench::BenchCase& c = dec.front();
  OpArgs args = c.args;
  args.opts = {DType::f32, Device::cpu()};
  auto op = registry(Variant::baseline).get("flash_attn_decode").make(args);
  std::vector<Tensor> in = c.make_inputs(Device::cpu(), 3);
  for (auto& t : in)
    if (is_floating(t.dtype())) t = t.to(DType::f32);
  Tensor ours = op->call(in)[0];
  Tensor expected = Tensor::empty(ours.shape(), DType::f32);
  reference::paged_attention_decode(expected, in[0], in[1], in[2], in[3], in[4], args.get("scale"));
  EXPECT_EQ(ours.to_floats(), expected.to_floats());
}

TEST(BenchCases, AttentionPairsByHand) {
  EXPECT_EQ(cases::attention_pairs(4, 0, 0), 10);      // 1 + 2 + 3 + 4
  EXPECT_EQ(cases::attention_pairs(4, 0, 2), 7);       // 1 + 2 + 2 + 2
  EXPECT_EQ(cases::attention_pairs(3, 5, 0), 21);      // 6 + 7 + 8
  EXPECT_EQ(cases::attention_pairs(3, 5, 7), 6 + 7 + 7);
  EXPECT_EQ(cases::attention_pairs(3, 5, 4), 12);      // every query at the full window
  EXPECT_EQ(cases::attention_pairs(5, 0, 100), 15);    // a window wider than the sequence changes nothing
  EXPECT_EQ(cases::attention_pairs(8192, 0, 128), 127 * 128 / 2 + 128 + (8192 - 128) * 128);
}

// Random attention cases are ragged: decode sequences of unequal lengths (the first the full context), prefill
// sequences of unequal query lengths after cached prefixes; the inputs carry those lengths and the bytes / FLOPs count
// exactly the keys and pairs they make.
TEST(BenchCases, RandomAttentionCasesAreRaggedAndCountedExactly) {
  for (const int64_t B : {1, 2, 5, 48}) {
    const std::vector<int32_t> lens = cases::ragged_lengths(B, 1000);
    ASSERT_EQ(int64_t(lens.size()), B);
    EXPECT_EQ(lens[0], 1000);
    for (int32_t n : lens) EXPECT_TRUE(n >= 1 && n <= 1000) << n;
    if (B >= 5) EXPECT_GT(std::set<int32_t>(lens.begin(), lens.end()).size(), 2u) << "B " << B;
  }
  for (const int64_t T : {1, 2, 3, 4, 17, 4096}) {
    const cases::RaggedPrefill r = cases::ragged_prefill(T);
    ASSERT_EQ(int64_t(r.query.size()), std::min<int64_t>(T, 3));
    int64_t sum = 0;
    for (size_t i = 0; i < r.query.size(); ++i) {
      EXPECT_GE(r.query[i], 1);
      EXPECT_TRUE(r.cached[i] >= 0 && r.cached[i] <= r.query[i]);
      sum += r.query[i];
    }
    EXPECT_EQ(sum, T);
  }
  const cases::RaggedPrefill big = cases::ragged_prefill(4096);
  EXPECT_NE(big.query[0], big.query[1]);

  bench::CaseOptions o;
  o.tokens = {4096};
  o.random = true;
  const ModelView v = view_of("llama-3.1-8b-instruct");
  const auto pre = bench::cases_for("flash_attn_prefill", v, o);
  ASSERT_EQ(pre.size(), 1u);
  const bench::BenchCase& p = pre[0];
  EXPECT_NE(p.label.find(" cached="), std::string::npos) << p.label;
  int64_t pairs = 0, keys = 0, max_q = 0, max_len = 0;
  for (size_t i = 0; i < big.query.size(); ++i) {
    pairs += cases::attention_pairs(big.query[i], big.cached[i], 0);
    keys += big.query[i] + big.cached[i];
    max_q = std::max<int64_t>(max_q, big.query[i]);
    max_len = std::max<int64_t>(max_len, big.query[i] + big.cached[i]);
  }
  EXPECT_EQ(p.flops, 2LL * 32 * 256 * pairs);
  EXPECT_EQ(p.args.get_int_or("max_query_len", 0), max_q);
  EXPECT_EQ(p.args.get_int_or("max_seq_len", 0), max_len);
  const std::vector<Tensor> pin = p.make_inputs(Device::cpu(), 1);
  const std::vector<int64_t> starts = pin[3].to_ints(), seq_lens = pin[4].to_ints();
  ASSERT_EQ(starts.size(), big.query.size() + 1);
  int64_t cached_total = 0;
  for (size_t i = 0; i < big.query.size(); ++i) {
    EXPECT_EQ(starts[i + 1] - starts[i], big.query[i]);
    EXPECT_EQ(seq_lens[i], big.query[i] + big.cached[i]);
    cached_total += big.cached[i];
  }
  EXPECT_GT(cached_total, 0);
  EXPECT_EQ(keys, 4096 + cached_total);

  o.tokens = {5};
  const auto dec = bench::cases_for("flash_attn_decode", v, o);
  ASSERT_FALSE(dec.empty());
  for (const bench::BenchCase& d : dec) {
    EXPECT_NE(d.label.find(" ragged"), std::string::npos) << d.label;
    const std::vector<Tensor> in = d.make_inputs(Device::cpu(), 1);
    const std::vector<int64_t> got = in[3].to_ints();
    const int64_t ctx = d.args.get_int_or("max_seq_len", 0);
    const std::vector<int32_t> want = cases::ragged_lengths(int64_t(got.size()), ctx);
    int64_t total = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], want[i]);
      total += got[i];
    }
    EXPECT_EQ(d.flops, 4LL * v.attention->num_heads * v.attention->head_dim * total) << d.label;
  }
}

// gpt-oss: 128-token windows and sinks (the "attention_sinks" feature its L4 declares) on head_dim 64;
// the window's FLOPs count only the visible pairs, decode reads only the window's keys.
TEST(BenchCases, GptOssAttentionCasesCarryWindowsAndSinks) {
  const auto pre = op_cases("flash_attn_prefill", 1, {8192}, "gpt-oss-20b");
  ASSERT_EQ(pre.size(), 6u);  // 1 x 8192 and 2 x 4096, each plain, sinks, window + sinks
  const auto& full = find_label(pre, "seqs=1x8192 heads=64 kv=8 D=64");
  EXPECT_EQ(full.label, "seqs=1x8192 heads=64 kv=8 D=64");
  EXPECT_EQ(full.flops, 4LL * 64 * 64 * (8192LL * 8193 / 2));
  const auto& win = find_label(pre, "seqs=1x8192 heads=64 kv=8 D=64 window=128 sinks");
  EXPECT_EQ(win.flops, 4LL * 64 * 64 * cases::attention_pairs(8192, 0, 128));
  EXPECT_EQ(win.args.get_int_or("sliding_window", 0), 128);
  EXPECT_EQ(win.bytes, full.bytes + 64 * 4);  // the same keys are read; plus the sinks
  const std::vector<Tensor> in = win.make_inputs(Device::cpu(), 1);
  ASSERT_EQ(in.size(), 7u);
  EXPECT_EQ(in[6].shape(), (Shape{64}));
  EXPECT_EQ(in[6].dtype(), DType::f32);

  const auto dec = op_cases("flash_attn_decode", 1, {32}, "gpt-oss-20b");
  const auto& dw = find_label(dec, "B=32 ctx=4096 heads=64 kv=8 D=64 window=128 sinks");
  const auto& df = find_label(dec, "B=32 ctx=4096 heads=64 kv=8 D=64 sinks");
  EXPECT_EQ(dw.bytes, 2LL * 32 * 128 * 8 * 64 * 2 + 2LL * 32 * 64 * 64 * 2 + 32 * 4 + 32 * 256 * 4 + 64 * 4);
  EXPECT_EQ(df.flops, 4LL * 64 * 64 * 32 * 4096);
  EXPECT_EQ(dw.flops, 4LL * 64 * 64 * 32 * 128);
  // Llama has none of this: one variant per shape.
  EXPECT_EQ(op_cases("flash_attn_prefill", 1, {4096}).size(), 1u);
}

// The adapter passes the sinks and the window through to the op; on CPU it is the oracle with those features.
TEST(BenchCases, AttentionAdapterPassesSinksAndWindow) {
  ModelConfig cfg = load_config("gpt-oss-20b");
  nlohmann::json j = nlohmann::json::parse(cfg.dump());
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 16;
  j["sliding_window"] = 5;
  const ModelView m = bench::model_view("small-gpt-oss", ModelConfig::parse(j.dump(), "test"), 1);
  bench::CaseOptions o;
  o.tokens = {2};
  const auto dec = bench::cases_for("flash_attn_decode", m, o);
  const bench::BenchCase& c = find_label(dec, "B=2 ctx=1024 heads=4 kv=2 D=16 window=5 sinks");
  OpArgs args = c.args;
  args.opts = {DType::f32, Device::cpu()};
  auto op = registry(Variant::baseline).get("flash_attn_decode").make(args);
  std::vector<Tensor> in = c.make_inputs(Device::cpu(), 3);
  for (auto& t : in)
    if (is_floating(t.dtype())) t = t.to(DType::f32);
  const Tensor ours = op->call(in)[0];
  Tensor expected = Tensor::empty(ours.shape(), DType::f32);
  reference::paged_attention_decode(expected, in[0], in[1], in[2], in[3], in[4], args.get("scale"),
                                    {5, 0.0, &in[5]});
  EXPECT_EQ(ours.to_floats(), expected.to_floats());
  Tensor no_sinks = Tensor::empty(ours.shape(), DType::f32);
  reference::paged_attention_decode(no_sinks, in[0], in[1], in[2], in[3], in[4], args.get("scale"), {5, 0.0});
  EXPECT_NE(ours.to_floats(), no_sinks.to_floats());
}

// Gemma-3-12B's published config nests the language model in text_config: the view reads the shapes there (head_dim
// 256, 1024-token windows). The config names no architectures; its model_type gemma3 names the multimodal class,
// whose text model Gemma3ForCausalLM serves.
TEST(BenchCases, GemmaTextConfigIsTheLanguageModelsView) {
  const ModelView m = view_of("gemma-3-12b-it");
  EXPECT_EQ(m.architecture, "Gemma3ForConditionalGeneration");
  EXPECT_TRUE(m.has_feature("sliding_window"));
  EXPECT_EQ(m.hidden_size, 3840);
  ASSERT_TRUE(m.attention);
  EXPECT_EQ(m.attention->head_dim, 256);
  EXPECT_EQ(m.attention->sliding_window, 1024);
  EXPECT_FALSE(m.attention->sinks);
  const auto pre = op_cases("flash_attn_prefill", 1, {4096}, "gemma-3-12b-it");
  ASSERT_EQ(pre.size(), 2u);
  EXPECT_EQ(pre[1].label, "seqs=1x4096 heads=16 kv=8 D=256 window=1024");
}
