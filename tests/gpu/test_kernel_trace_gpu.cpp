// Kernel tracing with CUPTI (engine/kernel_trace.h, `kb_nano eval --kernel-trace`): a graph-mode engine run of the
// tiny Llama in bf16 records the kernels of every L1 op the model runs, those replayed from CUDA graphs included,
// with busy time within the wall time; a second tracer in the process is refused. (The tiny Llama's head size, 16,
// takes the generic attention kernel for prefill and decode alike; the 8B model's flash kernels were traced on
// the H200 by `kb_nano eval --kernel-trace`, bench/results/h200/eval/kernel_trace/.)
#include <gtest/gtest.h>

#include <map>

#include "engine/kernel_trace.h"
#include "engine/llm_engine.h"
#include "engine/model_loader.h"
#include "test_paths.h"

using namespace kbn;
using namespace kbn::engine;

TEST(KernelTraceGpu, RecordsEveryOpOfAGraphModeRun) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto model = build_model(resolve_model(kbn::test::fixture_dir() + "/tiny-llama"), Variant::baseline,
                           {DType::bf16, Device::cuda(0)}, 0);
  EngineConfig cfg;
  cfg.mode = ExecutionMode::graph;
  cfg.max_model_len = 256;
  cfg.num_kv_blocks = 256;
  cfg.max_num_seqs = 8;
  LLMEngine engine(*model, Variant::baseline, Device::cuda(0), cfg);
  std::vector<Request> reqs;
  for (int64_t i = 0; i < 8; ++i) {
    Request r;
    r.id = i;
    for (int64_t j = 0; j < 20 + i; ++j) r.prompt.push_back((i * 31 + j * 7 + 3) % model->vocab_size());
    r.sampling.max_tokens = 12;
    r.sampling.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  const int64_t graph_steps_before = engine.runner().num_graph_steps();
  KernelTracer tracer;
  EXPECT_THROW(KernelTracer(), std::exception);  // one at a time per process
  const RunResult run = engine.run_to_completion(reqs);
  const KernelTrace t = tracer.stop();
  const int64_t graph_steps = engine.runner().num_graph_steps() - graph_steps_before;
  ASSERT_GT(graph_steps, 0);

  std::map<std::string, int64_t> calls;
  for (const auto& k : t.by_op) calls[k.name] = k.calls;
  const int64_t layers = int64_t(model->cache_specs().size());
  // Llama's rope and KV store run as one kernel (fused_rope_kvcache); the norms and silu*mul run on their own from
  // two tokens on (these steps batch eight sequences).
  for (const char* op : {"embedding", "rms_norm", "linear", "fused_rope_kvcache",
                         "flash_attn_decode / flash_attn_prefill (shared kernel)", "silu_and_mul", "argmax"})
    EXPECT_GT(calls[op], 0) << op;
  // Every decode step runs the attention once per layer, graph replays included.
  EXPECT_GE(calls["flash_attn_decode / flash_attn_prefill (shared kernel)"], graph_steps * layers);
  EXPECT_EQ(calls.count("other"), 0u) << "a kernel of the model that kernel_op() does not know";
  EXPECT_GT(t.kernels, 0);
  EXPECT_GT(t.kernel_s, 0);
  ASSERT_EQ(t.busy_s.count(0), 1u);
  EXPECT_GT(t.busy_s.at(0), 0);
  EXPECT_LE(t.busy_s.at(0), t.wall_s);
  EXPECT_LE(t.busy_s.at(0), t.kernel_s * (1 + 1e-9));
  EXPECT_EQ(run.outputs.size(), reqs.size());
  // After stop() a new tracer may start.
  KernelTracer again;
  EXPECT_EQ(again.stop().kernels, 0);
}
