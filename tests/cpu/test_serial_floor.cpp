// The serial floor of `kb_nano eval` (engine/serial_floor.h): the per-step work of a dense and of an MoE model worked
// out by hand from their shapes, for a decode step and a prefill step, at rates chosen so one step is bound by bytes
// and the other by FLOPs; the shape of a step read from a scheduler output; and the engine recording one shape per
// step of a real (tiny, CPU) run.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "engine/scheduler.h"
#include "engine/serial_floor.h"
#include "kbn/config.h"
#include "kbn/model_view.h"
#include "kbn/registry.h"
#include "test_errors.h"
#include "test_paths.h"

using namespace kbn;
using namespace kbn::engine;

namespace {

ModelView view_of(const std::string& json, int64_t tp = 1) {
  return ModelView::from("test", std::make_shared<const ModelConfig>(ModelConfig::parse(json, "test config")), tp);
}

// H 8, 2 query heads and 1 KV head of 4 dims, MLP 16, 2 layers, vocabulary 32.
const char* const kDense = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 16, "num_hidden_layers": 2, "vocab_size": 32})";
// The same attention; every layer an MoE of 4 experts of size 6, top-2 (Mixtral's keys).
const char* const kMoe = R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 6, "num_local_experts": 4, "num_experts_per_tok": 2,
  "num_hidden_layers": 2, "vocab_size": 32})";

// Rates in bytes and FLOPs per second small enough that the hand-computed seconds are readable.
const FloorRates kRates{1000, 5000};

StepShape decode_step(std::vector<int64_t> cached) {  // one decode per entry, each sampling
  StepShape s;
  for (int64_t c : cached) {
    s.tokens++, s.decodes++, s.logit_rows++;
    s.decode_context += c + 1;
  }
  return s;
}

}  // namespace

// The floor's projections share is compared with linear's and rms_norm_gemv's traced seconds (that kernel runs the
// one-token projections with the norm folded in); every other op with its own.
TEST(SerialFloor, TraceOpsOfAFloorOp) {
  EXPECT_EQ(engine::trace_ops_of_floor_op("linear"), (std::vector<std::string>{"linear", "rms_norm_gemv"}));
  EXPECT_EQ(engine::trace_ops_of_floor_op("fused_experts"), (std::vector<std::string>{"fused_experts"}));
  EXPECT_EQ(engine::trace_ops_of_floor_op("selective_state_update"),
            (std::vector<std::string>{"selective_state_update"}));
}

TEST(SerialFloor, StepShapeFromASchedulerOutput) {
  SchedulerOutput out;
  // A chunk of 6 after 4 cached tokens that reaches the end of its prompt, a first chunk of 5 that does not, and a
  // decode after 4 cached tokens.
  out.seqs = {{nullptr, 4, 6, true}, {nullptr, 0, 5, false}, {nullptr, 4, 1, true}};
  out.num_prefills = 2;
  out.num_tokens = 12;
  const StepShape s = step_shape(out);
  EXPECT_EQ(s.tokens, 12);
  EXPECT_EQ(s.prefill_tokens, 11);
  EXPECT_EQ(s.decodes, 1);
  EXPECT_EQ(s.logit_rows, 2);
  EXPECT_EQ(s.prefill_context, 10 + 5);
  EXPECT_EQ(s.prefill_pairs, (6 * 4 + 6 * 7 / 2) + 5 * 6 / 2);  // 45 + 15
  EXPECT_EQ(s.decode_context, 5);
}

TEST(SerialFloor, DenseModelShapes) {
  const FloorModel m(view_of(kDense), 2);
  // Per layer: qkv 8 x (2 + 2) x 4 = 128, o 2 x 4 x 8 = 64, gate_up + down 3 x 8 x 16 = 384; 2 layers.
  EXPECT_EQ(m.dense_layer_weights(), 2 * (128 + 64 + 384));
  EXPECT_EQ(m.kv_bytes_per_token(), 2 * 2 * 1 * 4 * 2);  // K and V x layers x KV heads x head dim x bf16
  // Tensor parallel 2: one query head, the KV head replicated, half the MLP and vocabulary per rank.
  const FloorModel r(view_of(kDense, 2), 2);
  EXPECT_EQ(r.dense_layer_weights(), 2 * (8 * 3 * 4 + 4 * 8 + 3 * 8 * 8));
  const StepWork w = r.work(decode_step({4, 9}));
  EXPECT_DOUBLE_EQ(w.embedding_bytes, 2.0 / 2 * 8 * 2);  // T / tp rows of H bf16 values
  EXPECT_DOUBLE_EQ(w.lm_head_bytes, 16 * 8 * 2);
}

TEST(SerialFloor, DenseDecodeStepIsBoundByBytes) {
  const FloorModel m(view_of(kDense), 2);
  const StepShape s = decode_step({4, 9, 14});  // contexts 5, 10, 15
  const StepWork w = m.work(s);
  // Layers 1152 weights + LM head 32 x 8, in bf16; FLOPs 2 x 3 tokens x 1152 + 2 x 3 rows x 8 x 32.
  EXPECT_DOUBLE_EQ(w.linear_bytes, (1152 + 256) * 2);
  EXPECT_DOUBLE_EQ(w.linear_flops, 2 * 3 * 1152 + 2 * 3 * 8 * 32);
  EXPECT_DOUBLE_EQ(w.embedding_bytes, 3 * 8 * 2);
  EXPECT_DOUBLE_EQ(w.expert_bytes, 0);
  EXPECT_DOUBLE_EQ(w.decode_kv_bytes, 30 * 32);
  EXPECT_DOUBLE_EQ(w.decode_flops, 4.0 * 4 * 2 * 2 * 30);  // 4 x head dim x heads x layers x pairs
  const SerialFloor f = serial_floor(m, {s}, kRates);
  // GEMMs: max(2864 B / 1000, 8448 FLOP / 5000) = 2.864 s; KV 0.96 s; attention FLOPs 1920 / 5000 = 0.384 s.
  EXPECT_EQ(f.steps, 1);
  EXPECT_EQ(f.compute_bound_steps, 0);
  EXPECT_DOUBLE_EQ(f.gemm_s, 2.864);
  EXPECT_DOUBLE_EQ(f.kv_read_s, 0.96);
  EXPECT_DOUBLE_EQ(f.attention_flops_s, 0.384);
  EXPECT_DOUBLE_EQ(f.floor_s, 2.864 + 0.96 + 0.384);
  EXPECT_DOUBLE_EQ(f.op_floor_s("linear"), 2.816);
  EXPECT_DOUBLE_EQ(f.op_floor_s("embedding"), 0.048);
  EXPECT_DOUBLE_EQ(f.op_floor_s("flash_attn_decode"), 0.96 + 0.384);
  EXPECT_DOUBLE_EQ(f.op_floor_s("flash_attn_prefill"), 0);
  EXPECT_DOUBLE_EQ(f.achieved(8.416), 0.5);
  // Overlapped: max((2864 + 960) B / 1000, (8448 + 1920) FLOP / 5000) = max(3.824, 2.0736).
  EXPECT_DOUBLE_EQ(f.overlap_floor_s, 3.824);
  EXPECT_DOUBLE_EQ(f.overlap_achieved(7.648), 0.5);
}

TEST(SerialFloor, DensePrefillStepIsBoundByFlops) {
  const FloorModel m(view_of(kDense), 2);
  StepShape s;  // the chunks of StepShapeFromASchedulerOutput without the decode: 6 after 4 (sampling), 5 from 0
  s.tokens = s.prefill_tokens = 11;
  s.logit_rows = 1;
  s.prefill_context = 15;
  s.prefill_pairs = 60;
  const StepWork w = m.work(s);
  EXPECT_DOUBLE_EQ(w.linear_flops, 2 * 11 * 1152 + 2 * 1 * 8 * 32);   // 25856
  EXPECT_DOUBLE_EQ(w.weight_bytes(), (1152 + 256) * 2 + 11 * 8 * 2);  // 2992
  EXPECT_DOUBLE_EQ(w.prefill_kv_bytes, 15 * 32);
  EXPECT_DOUBLE_EQ(w.prefill_flops, 64.0 * 60);
  const SerialFloor f = serial_floor(m, {s}, kRates);
  // GEMMs: max(2.992 s, 25856 / 5000 = 5.1712 s); KV 0.48 s; attention 3840 / 5000 = 0.768 s.
  EXPECT_EQ(f.compute_bound_steps, 1);
  EXPECT_DOUBLE_EQ(f.gemm_s, 5.1712);
  EXPECT_DOUBLE_EQ(f.floor_s, 5.1712 + 0.48 + 0.768);
  EXPECT_DOUBLE_EQ(f.op_floor_s("linear"), 5.1712);
  EXPECT_DOUBLE_EQ(f.op_floor_s("embedding"), 0);  // a FLOP-bound step's GEMM term goes by FLOPs
  EXPECT_DOUBLE_EQ(f.op_floor_s("flash_attn_prefill"), 0.48 + 0.768);
  // Overlapped: max((2992 + 480) / 1000, (25856 + 3840) / 5000) = max(3.472, 5.9392).
  EXPECT_DOUBLE_EQ(f.overlap_floor_s, 5.9392);

  // A step where no chunk reaches its end runs no LM head.
  s.logit_rows = 0;
  EXPECT_DOUBLE_EQ(m.work(s).lm_head_bytes, 0);
  EXPECT_DOUBLE_EQ(m.work(s).linear_bytes, 1152 * 2);

  // Steps add up, the shares sum to the floor.
  const SerialFloor both = serial_floor(m, {decode_step({4, 9, 14}), s}, kRates);
  double shares = 0;
  for (const auto& o : both.by_op) shares += o.floor_s;
  EXPECT_NEAR(shares, both.floor_s, 1e-12);
  EXPECT_EQ(both.steps, 2);
  // Each step's own max; the prefill step now has no LM head: (25344 + 3840) FLOP / 5000 = 5.8368 s.
  EXPECT_NEAR(both.overlap_floor_s, 3.824 + 5.8368, 1e-12);
  EXPECT_LT(both.overlap_floor_s, both.floor_s);
}

TEST(SerialFloor, MoeDecodeAndPrefillSteps) {
  const ModelView v = view_of(kMoe);
  ASSERT_TRUE(v.moe.has_value());
  const FloorModel m(v, 2);
  EXPECT_EQ(m.dense_layer_weights(), 2 * (128 + 64));  // no dense MLP: every layer is sparse

  // One decode after 2 cached tokens: uniform routing touches 4 (1 - (1 - 2/4)^1) = 2 experts of 3 x 8 x 6 weights.
  const StepShape d = decode_step({2});
  const StepWork wd = m.work(d);
  EXPECT_DOUBLE_EQ(wd.expected_experts, 2);
  EXPECT_DOUBLE_EQ(wd.linear_bytes, (384 + 2 * 8 * 4 + 256) * 2);      // layers, routers, LM head: 1408
  EXPECT_DOUBLE_EQ(wd.linear_flops, 2 * 1 * (384 + 64) + 2 * 8 * 32);  // 1408
  EXPECT_DOUBLE_EQ(wd.expert_bytes, 2 * 2 * 144 * 2);                  // layers x experts x weights x bf16: 1152
  EXPECT_DOUBLE_EQ(wd.expert_flops, 2 * (2 * 1 * 2 * 144));            // 2 T k 3 H N per layer: 1152
  const SerialFloor fd = serial_floor(m, {d}, kRates);
  // max(2576 B / 1000, 2560 FLOP / 5000) = 2.576 s; KV 3 x 32 B = 0.096 s; attention 64 x 3 / 5000 = 0.0384 s.
  EXPECT_DOUBLE_EQ(fd.floor_s, 2.576 + 0.096 + 0.0384);
  EXPECT_DOUBLE_EQ(fd.op_floor_s("fused_experts"), 1.152);
  EXPECT_DOUBLE_EQ(fd.op_floor_s("linear"), 1.408);

  // A 3-token prompt from scratch: 4 (1 - 0.5^3) = 3.5 experts expected per layer; 6 causal pairs.
  StepShape p;
  p.tokens = p.prefill_tokens = 3;
  p.logit_rows = 1;
  p.prefill_context = 3;
  p.prefill_pairs = 6;
  const StepWork wp = m.work(p);
  EXPECT_DOUBLE_EQ(wp.expected_experts, 3.5);
  EXPECT_DOUBLE_EQ(wp.expert_bytes, 2 * 3.5 * 144 * 2);         // 2016
  EXPECT_DOUBLE_EQ(wp.expert_flops, 2 * (2 * 3 * 2 * 144));     // 3456
  EXPECT_DOUBLE_EQ(wp.linear_flops, 2 * 3 * 448 + 2 * 8 * 32);  // 3200
  // At a GEMM rate of 1000 FLOP/s the step is FLOP-bound: 6656 / 1000 s against 3472 / 1000 s of bytes.
  const SerialFloor fp = serial_floor(m, {p}, {1000, 1000});
  EXPECT_EQ(fp.compute_bound_steps, 1);
  EXPECT_DOUBLE_EQ(fp.gemm_s, 6.656);
  EXPECT_DOUBLE_EQ(fp.floor_s, 6.656 + 0.096 + 0.384);
  EXPECT_DOUBLE_EQ(fp.op_floor_s("fused_experts"), 3.456);

  // Many tokens touch (nearly) every expert.
  StepShape big = decode_step(std::vector<int64_t>(64, 1));
  EXPECT_NEAR(m.work(big).expected_experts, 4, 1e-12);
}

TEST(SerialFloor, Qwen3MoeDenseAndSparseLayers) {
  // Three layers, layer 1 a dense MLP of 16 (mlp_only_layers), the others 8 experts of 6, top-2; head_dim 4.
  const FloorModel m(view_of(R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 16, "moe_intermediate_size": 6, "num_experts": 8,
    "num_experts_per_tok": 2, "mlp_only_layers": [1], "num_hidden_layers": 3, "vocab_size": 32})"),
                     2);
  EXPECT_EQ(m.dense_layer_weights(), 3 * 192 + 1 * 384);
  const StepWork w = m.work(decode_step({0}));
  EXPECT_DOUBLE_EQ(w.expected_experts, 8 * (1 - 0.75));
  EXPECT_DOUBLE_EQ(w.expert_bytes, 2 * 2 * 144 * 2);  // two sparse layers
  EXPECT_DOUBLE_EQ(w.linear_bytes, (3 * 192 + 384 + 2 * 8 * 8 + 256) * 2);
}

TEST(SerialFloor, OpsAreKernelTraceOps) {
  // The floor's op names are registered ops, which --kernel-trace groups kernels by.
  const FloorModel m(view_of(kMoe), 2);
  StepShape s = decode_step({3});
  s.tokens += 2, s.prefill_tokens = 2, s.prefill_context = 2, s.prefill_pairs = 3;
  const SerialFloor f = serial_floor(m, {s}, kRates);
  EXPECT_EQ(f.by_op.size(), 5u);
  for (const auto& o : f.by_op) EXPECT_NE(registry(Variant::baseline).find(o.op), nullptr) << o.op;
}

TEST(SerialFloor, RefusesBadRatesAndMissingShapes) {
  const FloorModel m(view_of(kDense), 2);
  EXPECT_NE(test::error_of([&] { serial_floor(m, {}, {0, 1}); }).find("copy rate"), std::string::npos);
  EXPECT_NE(test::error_of([&] { serial_floor(m, {}, {1, -1}); }).find("GEMM rate"), std::string::npos);
  const std::string e = test::error_of([] {
    FloorModel(view_of(R"({"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2, "vocab_size": 32})"), 2);
  });
  EXPECT_NE(e.find("'intermediate_size'"), std::string::npos) << e;
}

TEST(SerialFloor, EngineRecordsEveryStepsShape) {
  const ModelSpec spec = resolve_model(kbn::test::fixture_dir() + "/tiny-llama");
  auto model = build_model(spec, Variant::baseline, {DType::f32, Device::cpu()}, 0);
  EngineConfig cfg;
  cfg.max_model_len = 2048;
  cfg.num_kv_blocks = 256;
  cfg.block_size = 4;
  cfg.enable_prefix_caching = false;
  // Prompts of 7, 1, 23 and 12 tokens, 4 output tokens each, all in the first step (a 1-token prompt is a decode).
  const std::vector<int64_t> lens = {7, 1, 23, 12};
  const int64_t out = 4;
  std::vector<Request> reqs;
  for (size_t i = 0; i < lens.size(); ++i) {
    Request r;
    r.id = int64_t(i);
    for (int64_t j = 0; j < lens[i]; ++j) r.prompt.push_back((int64_t(i) * 97 + j * 31 + 5) % 512);
    r.sampling.max_tokens = out;
    r.sampling.ignore_eos = true;
    reqs.push_back(r);
  }
  LLMEngine engine(*model, Variant::baseline, Device::cpu(), cfg);
  engine.run_to_completion({reqs[0]});  // an earlier run's steps are not this run's
  const RunResult r = engine.run_to_completion(reqs);
  ASSERT_EQ(int64_t(r.step_shapes.size()), r.steps);
  StepShape sum;
  for (const auto& s : r.step_shapes) {
    EXPECT_EQ(s.tokens, s.prefill_tokens + s.decodes);
    sum.tokens += s.tokens, sum.prefill_tokens += s.prefill_tokens, sum.logit_rows += s.logit_rows;
    sum.decode_context += s.decode_context, sum.prefill_context += s.prefill_context;
    sum.prefill_pairs += s.prefill_pairs;
  }
  const int64_t prompts = std::accumulate(lens.begin(), lens.end(), int64_t(0));
  EXPECT_EQ(sum.tokens, prompts + int64_t(lens.size()) * (out - 1));  // the last token is never fed back
  EXPECT_EQ(sum.logit_rows, int64_t(lens.size()) * out);
  EXPECT_EQ(sum.prefill_tokens, prompts - 1);
  EXPECT_EQ(sum.prefill_context, 7 + 23 + 12);
  EXPECT_EQ(sum.prefill_pairs, 7 * 8 / 2 + 23 * 24 / 2 + 12 * 13 / 2);
  // Decodes: the 1-token prompt (context 1), then the tokens 2..4 of each request at contexts p + 1 .. p + 3.
  int64_t decode_context = 1;
  for (int64_t p : lens) decode_context += 3 * p + 6;
  EXPECT_EQ(sum.decode_context, decode_context);
}

TEST(SerialFloor, AgreesWithTheH200ResultsAccounts) {
  auto real = [](const char* name) {
    return ModelView::from(name,
                           std::make_shared<const ModelConfig>(
                               ModelConfig::load(std::string(KBN_SOURCE_DIR) + "/models/" + name + ".json")),
                           1);
  };
  // bench/results/h200/README.md: Llama-3.1-8B's GEMMs are 13.96 GFLOP per token through the layers plus 1.05 GFLOP
  // per logits row, and its KV is 128 KiB per token.
  const FloorModel llama(real("llama-3.1-8b-instruct"), 2);
  EXPECT_EQ(llama.kv_bytes_per_token(), 128 * 1024);
  const StepWork w = llama.work(decode_step({0}));
  EXPECT_NEAR((w.linear_flops - w.lm_head_flops) / 1e9, 13.96, 0.005);
  EXPECT_NEAR(w.lm_head_flops / 1e9, 1.05, 0.005);
  // bench/results/h200/moe/README.md: one Mixtral-8x7B token reads 2 experts, 704 MB per layer, and 25.8 GB in all
  // with the whole embedding table; the floor reads only the token's row of it (32000 x 4096 bf16 less one row).
  const FloorModel mixtral(real("mixtral-8x7b-instruct-v0.1"), 2);
  const StepWork m = mixtral.work(decode_step({0}));
  EXPECT_DOUBLE_EQ(m.expert_bytes / 32, 2.0 * 3 * 4096 * 14336 * 2);  // 704,643,072
  EXPECT_DOUBLE_EQ(m.weight_bytes(), 25497182208.0);
  EXPECT_NEAR((m.weight_bytes() + (32000 - 1) * 4096 * 2) / 1e9, 25.8, 0.05);
}

// Sliding windows: a step's shape also counts the keys each sequence's window covers, and a sliding layer reads and
// pairs only those (Gemma-3's five sliding layers per full one; gpt-oss alternates).
TEST(SerialFloor, SlidingLayersReadOnlyTheirWindow) {
  SchedulerOutput out;
  out.seqs = {{nullptr, 4, 6, true}, {nullptr, 0, 5, false}, {nullptr, 4, 1, true}};
  out.num_prefills = 2;
  out.num_tokens = 12;
  const StepShape s = step_shape(out, 3);
  EXPECT_EQ(s.window, 3);
  EXPECT_EQ(s.prefill_context_in_window, (10 - 2) + 5);  // the first chunk's queries see keys 2..9
  EXPECT_EQ(s.prefill_pairs_in_window, 6 * 3 + (1 + 2 + 3 + 3 + 3));
  EXPECT_EQ(s.decode_context_in_window, 3);
  EXPECT_EQ(step_shape(out).prefill_pairs_in_window, s.prefill_pairs);  // no window: every pair

  // kDense with its first layer sliding (window 6), the second full: decode contexts 5, 10, 15 read 5 + 6 + 6 keys
  // in the sliding layer and all 30 in the full one, 16 bytes of K and V per key and layer.
  const std::string windowed = std::string(kDense).insert(1, R"("sliding_window": 6, "layer_types":
    ["sliding_attention", "full_attention"], )");
  const ModelView v = view_of(windowed);
  EXPECT_EQ(v.attention->num_sliding_layers, 1);
  const FloorModel m(v, 2);
  SchedulerOutput dec;
  dec.seqs = {{nullptr, 4, 1, true}, {nullptr, 9, 1, true}, {nullptr, 14, 1, true}};
  dec.num_tokens = 3;
  const StepWork w = m.work(step_shape(dec, 6));
  EXPECT_DOUBLE_EQ(w.decode_kv_bytes, 16.0 * (30 + 17));
  EXPECT_DOUBLE_EQ(w.decode_flops, 4.0 * 4 * 2 * (30 + 17));
  EXPECT_DOUBLE_EQ(m.work(step_shape(dec)).decode_kv_bytes, 30 * 32);  // a shape recorded without the window

  // Without layer_types: every sliding_window_pattern-th layer is full; with neither, every layer slides.
  EXPECT_EQ(view_of(R"({"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 12, "vocab_size": 32,
    "sliding_window": 6, "sliding_window_pattern": 6})").attention->num_sliding_layers, 10);
  EXPECT_EQ(view_of(R"({"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 4, "vocab_size": 32,
    "sliding_window": 6})").attention->num_sliding_layers, 4);
}

namespace {

// Mamba-2: H 8, 2 heads of 4 dims (I 8), state 2, 1 group, conv width 3 (conv_dim 8 + 2 x 2 = 12), chunk 4, 2 layers.
const char* const kMamba = R"({"architectures": ["Mamba2ForCausalLM"], "hidden_size": 8, "num_heads": 2,
  "head_dim": 4, "state_size": 2, "n_groups": 1, "conv_kernel": 3, "chunk_size": 4, "intermediate_size": 8,
  "num_hidden_layers": 2, "vocab_size": 32})";

TEST(SerialFloor, MambaStatesAndScanByHand) {
  const FloorModel m(view_of(kMamba), 2);
  // Per layer: in_proj 8 x (8 + 12 + 2) = 176, out_proj 8 x 8 = 64; no attention, no MLP.
  EXPECT_EQ(m.dense_layer_weights(), 2 * (176 + 64));
  EXPECT_EQ(m.kv_bytes_per_token(), 0);
  // State per sequence and layer: conv 2 x 12 + SSM 2 x 4 x 2 = 40 elements, 80 bytes; 160 over the layers.
  StepShape decode;
  decode.tokens = decode.decodes = decode.logit_rows = 3;
  decode.decode_context = 30;
  const StepWork d = m.work(decode);
  EXPECT_DOUBLE_EQ(d.decode_state_bytes, 2 * 160.0 * 3);  // read and written
  EXPECT_DOUBLE_EQ(d.decode_kv_bytes, 0);
  EXPECT_DOUBLE_EQ(d.decode_state_flops, 2 * 2 * 5 * 4 * 2 * 3.0);  // layers x heads x 5 P N per token
  // Two prefill chunks of 5 tokens, one continuing its sequence: written twice, read once.
  StepShape prefill;
  prefill.tokens = prefill.prefill_tokens = 10;
  prefill.prefill_seqs = 2;
  prefill.prefill_continued = 1;
  prefill.logit_rows = 2;
  const StepWork p = m.work(prefill);
  EXPECT_DOUBLE_EQ(p.prefill_state_bytes, 160.0 * 3);
  // Per token and layer: heads x (2 L (N + P) + 4 P N) = 2 x (2 x 4 x 6 + 32) = 160.
  EXPECT_DOUBLE_EQ(p.prefill_state_flops, 10 * 2 * 160.0);
  const SerialFloor f = serial_floor(m, {decode, prefill}, kRates);
  EXPECT_GT(f.op_floor_s("selective_state_update"), 0);
  EXPECT_GT(f.op_floor_s("mamba_chunk_scan_combined"), 0);
  EXPECT_DOUBLE_EQ(f.kv_bytes, d.decode_state_bytes + p.prefill_state_bytes);
}

}  // namespace

namespace {

// DeepSeek-V2-Lite's shapes in miniature: 2 heads of 4 + 2 rope, kv_lora_rank 6, v_head_dim 3, no q_lora; layer 0
// dense (MLP 16), layer 1 an MoE of 4 experts of 5 (top 2) with 1 shared expert.
const char* const kMla = R"({"architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
  "num_key_value_heads": 2, "intermediate_size": 16, "num_hidden_layers": 2, "vocab_size": 32, "kv_lora_rank": 6,
  "q_lora_rank": null, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 3, "n_routed_experts": 4,
  "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 5, "first_k_dense_replace": 1,
  "moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax"})";

}  // namespace

TEST(SerialFloor, LatentAttentionCountsTheLatentRowAndTheAbsorbedDecode) {
  const FloorModel m(view_of(kMla), 2);
  EXPECT_TRUE(m.mla());
  // One row of kv_lora_rank + rope = 8 values per token per layer, bf16.
  EXPECT_EQ(m.kv_bytes_per_token(), 2 * 8 * 2);
  // Per layer: q 8 x 2 x 6, kv_a 8 x 8, kv_b 6 x 2 x (4 + 3), o 2 x 3 x 8 = 96 + 64 + 84 + 48 = 292; the dense
  // layer's MLP 3 x 8 x 16 = 384.
  EXPECT_EQ(m.dense_layer_weights(), 2 * 292 + 384);
  const StepWork d = m.work(decode_step({9}));  // one decode over 10 keys
  EXPECT_DOUBLE_EQ(d.decode_kv_bytes, 2 * 10 * 8 * 2);
  EXPECT_DOUBLE_EQ(d.decode_flops, 2 * 10 * (2.0 * 2 * (8 + 6)));  // absorbed: scores over 8, values of 6
  // Router 8 x 4 and the shared expert 3 x 8 x 5 of the sparse layer read as dense weights.
  EXPECT_DOUBLE_EQ(d.linear_bytes, (2 * 292 + 384 + 8 * 4 + 3 * 8 * 5 + 32 * 8) * 2.0);
  StepShape p;  // a prefill of 4 new tokens: 10 causal pairs, decompressed heads of 6 + 3
  p.tokens = p.prefill_tokens = 4, p.prefill_seqs = 1, p.logit_rows = 1, p.prefill_context = 4, p.prefill_pairs = 10;
  EXPECT_DOUBLE_EQ(m.work(p).prefill_flops, 2 * 10 * (2.0 * 2 * (6 + 3)));
}
