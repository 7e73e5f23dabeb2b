#!/usr/bin/env bash
# Session 33, call I (not run: no device machine came after call H, then lending paused). To run it:
#   git apply bench/results/session33/qk_mla_store_wiring.patch; ninja -C build kb_nano tests/kbn_gpu_tests
#   tools/pack_device_build.sh                                   # dev: the wired tree
#   tools/relink_variant.sh build-cmp/off.xz "-DKBN_CANDIDATE_REPLACES_L1_concat_and_cache_mla_h \
#     -DKBN_CANDIDATE_REPLACES_L1_store_kvcache_h" tasks/baseline/L2/deepseek_v2_mla_attention.cu \
#     tasks/baseline/L2/qwen3_attention.cu tasks/baseline/L2/gemma3_attention.cu   # off: both fusions switched off
# then carry ["build-dev", "build-cmp"]. dev: FusedMlaRopeCache (DeepSeek's latent norm, rope, latent store and q_pe
# into q_abs as one kernel) and FusedQKNormRope::forward_store (Qwen3 / Gemma-3: q/k norms + rope + the paged store as
# one kernel). GPU tests, latency-b1 off / dev alternated, kernel traces of DeepSeek-V2-Lite and Qwen3-30B-A3B (what
# is left at batch 1), and the op's validation contract and timing at DeepSeek-V2-Lite's shapes. Adopting the wiring:
# commit the patch and drop fused_mla_rope_cache's entry from tests/op_contract.h's pending list (the tiny models
# reach it then).
source tools/device_call.sh
unxz_to build-cmp/off.xz /tmp/off/kb_nano
st gpu_tests 100 build/tests/kbn_gpu_tests --gtest_filter='FusedMlaRopeCacheGpu.*:ConcatAndCacheMlaGpu.*:*tiny_deepseek*:MlaDecodeGpu.*:FusedQKNormRopeGpu.*:*tiny_qwen3*:*tiny_gemma*'
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -20
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096"
one() { local m=$1 b=$2 r=$3 bin=build/kb_nano; [ $b != dev ] && bin=/tmp/$b/kb_nano
  st b1_${m}_$b$r 45 $bin $E --model $m --json $O/eval_b1_${m}_$b$r.json
  echo "  $m $b$r: $(grep -E 'TPOT' $O/b1_${m}_$b$r.log | head -1)"; }
for r in 1 2; do for b in off dev; do one deepseek-v2-lite $b $r; one qwen3-30b-a3b $b $r; done; done
for b in off dev; do one gemma-3-12b-it $b 1; done
for m in deepseek-v2-lite qwen3-30b-a3b; do
  st trace_$m 60 build/kb_nano $E --model $m --kernel-trace --json $O/trace_$m.json
  grep -E "TPOT|kernels per|busy" $O/trace_$m.log | head -4
done
st kernels_mla 60 build/kb_nano kernels --model deepseek-v2-lite --variant baseline --target fused_mla_rope_cache --target concat_and_cache_mla --target rotary_embedding --target rms_norm --tokens 1,4096 --random 0 --seeds 1 --json $O/kernels_mla.json
tail -30 $O/kernels_mla.log
finish
