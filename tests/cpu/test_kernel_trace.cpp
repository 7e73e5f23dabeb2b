// The kernel-trace summary of `kb_nano eval --kernel-trace` (engine/kernel_trace.h) without a GPU: which op a kernel
// name belongs to, names shortened from their mangled form, per-kernel and per-op sums, and busy time as the union
// of overlapping kernels. Recording itself (CUPTI) is tested on the GPU.
#include <gtest/gtest.h>

#include <map>

#include "engine/kernel_trace.h"

using namespace kbn::engine;

namespace {

const char* const kRmsMangled =
    "_ZN3kbn8baseline12_GLOBAL__N_115rms_norm_kernelI13__nv_bfloat16Li4ELb1EEEvNS1_13RmsNormParamsE";

TEST(KernelTrace, OpOfAKernelName) {
  EXPECT_EQ(kernel_op("kbn::baseline::(anonymous namespace)::rms_norm_kernel<__nv_bfloat16, 4, true>"), "rms_norm");
  EXPECT_EQ(kernel_op("flash_attn_decode_reduce_kernel<__nv_bfloat16>"), "flash_attn_decode");
  EXPECT_EQ(kernel_op("flash_attn_prefill_tma_kernel<128>"), "flash_attn_prefill");
  EXPECT_EQ(kernel_op("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopB_TNT"), "linear");
  EXPECT_EQ(kernel_op("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64"), "linear");
  EXPECT_EQ(kernel_op("gemv_kernel<__nv_bfloat16, 8>"), "linear");
  EXPECT_EQ(kernel_op("ncclDevKernel_AllReduce_Sum_bf16_RING_LL"), "all_reduce");
  EXPECT_EQ(kernel_op("kbn::(anonymous namespace)::one_shot_all_reduce_kernel<float>"), "all_reduce");
  EXPECT_EQ(kernel_op("embedding_kernel<__nv_bfloat16>"), "embedding");
  EXPECT_EQ(kernel_op("rotary_embedding_kernel<__nv_bfloat16, 128>"), "rotary_embedding");  // not "embedding"
  EXPECT_EQ(kernel_op("kbn::strided_copy_kernel<2>"), "tensor copies and fills");
  EXPECT_EQ(kernel_op("kbn::baseline::(anonymous namespace)::generic_attention_kernel<float>"),
            "flash_attn_decode / flash_attn_prefill (shared kernel)");
  EXPECT_EQ(kernel_op("some_library_kernel"), "other");
}

TEST(KernelTrace, ShortNamesDemangleAndDropParameters) {
  EXPECT_EQ(short_kernel_name(kRmsMangled),
            "kbn::baseline::(anonymous namespace)::rms_norm_kernel<__nv_bfloat16, 4, true>");
  EXPECT_EQ(short_kernel_name("nvjet_sm90_tst_256x128"), "nvjet_sm90_tst_256x128");  // not a C++ symbol
  EXPECT_EQ(short_kernel_name("void f<(int)2>(int, float)"), "f<(int)2>");
}

TEST(KernelTrace, SumsPerKernelAndOpAndUnitesBusyIntervals) {
  KernelTraceBuilder b;
  // Device 0: rms_norm twice (mangled), a GEMM overlapping the second; device 1: one GEMM.
  b.add(kRmsMangled, 0, 100, 200);
  b.add(kRmsMangled, 0, 300, 400);
  b.add("nvjet_gemm_a", 0, 350, 1000);
  b.add("nvjet_gemm_a", 1, 0, 50);
  EXPECT_THROW(b.add("bad", 0, 10, 5), std::exception);
  const KernelTrace t = b.finish(2e-6);
  EXPECT_EQ(t.kernels, 4);
  EXPECT_DOUBLE_EQ(t.wall_s, 2e-6);
  EXPECT_NEAR(t.kernel_s, (100 + 100 + 650 + 50) * 1e-9, 1e-15);
  ASSERT_EQ(t.busy_s.size(), 2u);
  EXPECT_NEAR(t.busy_s.at(0), (100 + 700) * 1e-9, 1e-15);  // [100,200) and [300,1000)
  EXPECT_NEAR(t.busy_s.at(1), 50e-9, 1e-15);
  ASSERT_EQ(t.by_op.size(), 2u);
  EXPECT_EQ(t.by_op[0].name, "linear");
  EXPECT_EQ(t.by_op[0].calls, 2);
  EXPECT_NEAR(t.by_op[0].total_s, 700e-9, 1e-15);
  EXPECT_EQ(t.by_op[1].name, "rms_norm");
  EXPECT_EQ(t.by_op[1].calls, 2);
  ASSERT_EQ(t.by_kernel.size(), 2u);
  EXPECT_EQ(t.by_kernel[0].name, "nvjet_gemm_a");
  EXPECT_EQ(t.by_kernel[1].name, "kbn::baseline::(anonymous namespace)::rms_norm_kernel<__nv_bfloat16, 4, true>");
  EXPECT_EQ(t.by_kernel[1].op, "rms_norm");
  // The overlap [350, 400) goes to the older kernel (the second rms_norm): rms_norm 100 + 100, the GEMMs 600 + 50.
  EXPECT_NEAR(t.by_op[1].attributed_s, 200e-9, 1e-15);
  EXPECT_NEAR(t.by_op[0].attributed_s, 650e-9, 1e-15);
  EXPECT_NEAR(t.by_op[0].attributed_s + t.by_op[1].attributed_s, t.busy_s.at(0) + t.busy_s.at(1), 1e-15);
}

// Dependent launches: each kernel starts while the one before runs and waits for it; a kernel nested inside a longer
// one costs nothing; the busy time is split without double counting.
TEST(KernelTrace, AttributesOverlapsToTheOldestRunningKernel) {
  KernelTraceBuilder b;
  b.add("gemv_a", 0, 0, 100);     // A
  b.add("rope_b", 0, 80, 130);    // B starts under A's tail: charged from 100
  b.add("attn_c", 0, 120, 200);   // C: from 130
  b.add("tiny_d", 0, 140, 150);   // inside C: nothing
  b.add("gemv_a", 0, 300, 350);   // after a gap
  const KernelTrace t = b.finish(1e-6);
  std::map<std::string, double> at;
  for (const KernelStat& k : t.by_kernel) at[k.name] = k.attributed_s;
  EXPECT_NEAR(at["gemv_a"], 150e-9, 1e-15);
  EXPECT_NEAR(at["rope_b"], 30e-9, 1e-15);
  EXPECT_NEAR(at["attn_c"], 70e-9, 1e-15);
  EXPECT_NEAR(at["tiny_d"], 0.0, 1e-15);
  EXPECT_NEAR(t.busy_s.at(0), 250e-9, 1e-15);
}

TEST(KernelTrace, EmptyTraceAndCpuBuild) {
  const KernelTrace t = KernelTraceBuilder().finish(1.0);
  EXPECT_EQ(t.kernels, 0);
  EXPECT_TRUE(t.by_op.empty());
  EXPECT_TRUE(t.busy_s.empty());
#ifndef KBN_WITH_CUDA
  try {
    KernelTracer tracer;
    FAIL() << "a CPU build started a kernel tracer";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA build"), std::string::npos) << e.what();
  }
#endif
}

}  // namespace
