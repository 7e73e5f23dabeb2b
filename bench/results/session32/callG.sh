#!/usr/bin/env bash
# Session 32, call G. Three binaries: base = kb_nano of 8f693cd (the same code as e483de5); mid = session 31's patch
# (c9905f6 re-applied: rms_norm_gemv with two weight rows per warp and the fp32 h staged; rms_norm_gemv_conv1d in
# Mamba-2's decode layers); dev = mid + rms_norm_gated_gemv (the gated norm folded into out_proj's one-token GEMV) +
# rotary_embedding on head-strided views (DeepSeek's MLA rotates q's rope part in place: two copies fewer per layer) +
# Qwen3-MoE's sparse layers fold the post-attention norm into the router at one token (rms_norm_gemv forward_normed).
# GPU tests, kernel times at Mamba's shapes, latency-b1 base / mid / dev alternated (Mamba-Codestral-7B twice,
# Llama-3.1-8B, Qwen3-8B, DeepSeek-V2-Lite and Qwen3-30B-A3B once: base / dev), then a kernel trace of the dev Mamba run.
set -u
build-dev/unpack.sh
# build-cmp/{base,mid}.xz: the two other kb_nano binaries, xz-compressed to fit the carry limit beside build-dev.
for b in base mid; do mkdir -p /tmp/$b && python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" build-cmp/$b.xz /tmp/$b/kb_nano && chmod +x /tmp/$b/kb_nano; done
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv | tee $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" | tee -a $O/status.txt; }
st gpu_tests 150 build/tests/kbn_gpu_tests --gtest_filter='RMSNormGemv*:RMSNormGatedGemv*:*Mamba*:*mamba*:EngineGraphGpu.*:*rms_norm_gemv*:*llama_decoder_layer*:*qwen3_decoder_layer*:*gemma3_decoder_layer*:LlamaGpu.*:*Qwen3*:LinearGpu.*:RotaryEmbeddingGpu.*:*Deepseek*:*DeepSeek*:*MLA*:*Mla*:*Qwen3Moe*:*qwen3_moe*'
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -20
K="kernels --model mamba-codestral-7b-v0.1 --random 0 --seeds 1 --tokens 1"
st k_dev 60 build/kb_nano $K --target rms_norm_gemv --target rms_norm_gemv_conv1d --target rms_norm_gated_gemv --target causal_conv1d_update --target mixer2_rms_norm_gated --json $O/k_dev.json
st k_base 40 /tmp/base/kb_nano $K --target rms_norm_gemv --target causal_conv1d_update --target mixer2_rms_norm_gated --json $O/k_base.json
for f in $O/k_*.log; do echo "== $f"; grep -E "T=1|B=1 " $f | head -8 | cut -c1-170; done
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096"
one() { local m=$1 b=$2 r=$3 short=${1%%-*} bin=build/kb_nano; [ $b != dev ] && bin=/tmp/$b/kb_nano
  st b1_${short}_$b$r 45 $bin $E --model $m --json $O/eval_b1_${short}_$b$r.json
  echo "  $short $b$r: $(grep -E 'TPOT' $O/b1_${short}_$b$r.log | head -1)"; }
for r in 1 2; do for b in base mid dev; do one mamba-codestral-7b-v0.1 $b $r; done; done
for r in 1; do for b in base dev; do one llama-3.1-8b-instruct $b $r; one qwen3-8b $b $r; one deepseek-v2-lite $b $r; one qwen3-30b-a3b $b $r; done; done
st b1_mamba_trace 45 build/kb_nano $E --model mamba-codestral-7b-v0.1 --kernel-trace --json $O/eval_b1_mamba_trace.json
grep -A18 "^kernel time" $O/b1_mamba_trace.log | cut -c1-160
cd $OUT && tar czf s.tgz s && rm -rf s
