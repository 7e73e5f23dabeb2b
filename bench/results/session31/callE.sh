#!/usr/bin/env bash
# Session 31, call E: call D cut to what the device time left after refused starts allows (each step's figures printed
# as it ends, in case the call is cut). build-base = kb_nano of 8f693cd; build-dev = c9905f6 (rms_norm_gemv with two
# weight rows per warp and the fp32 sum staged; rms_norm_gemv_conv1d in Mamba-2's decode layers).
set -u
build-dev/unpack.sh
mkdir -p /tmp/base && gunzip -c build-base/kb_nano.gz > /tmp/base/kb_nano && chmod +x /tmp/base/kb_nano
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KBN_MODELS_DIR=$PWD/models
O=$OUT/s; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv | tee $O/gpu.txt
st() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout -k 5 $lim "$@" > $O/$name.log 2>&1; echo "$name rc=$? s=$(( $(date +%s) - t0 ))" | tee -a $O/status.txt; }
st gpu_tests 60 build/tests/kbn_gpu_tests --gtest_filter='RMSNormGemv*:MambaOpsContractGpu.*:EngineGraphGpu.*:*tiny_mamba2_*:*tiny_llama_llama_decoder_layer*:*tiny_qwen3_qwen3_decoder_layer*:*tiny_gemma3_gemma3_decoder_layer*:LlamaGpu.*'
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $O/gpu_tests.log | head -12
E="eval --workload latency-b1 --num-requests 8 --mode graph --variant baseline --max-model-len 4096"
for b in dev base; do
  bin=build/kb_nano; [ $b = base ] && bin=/tmp/base/kb_nano
  st b1_mamba_$b 30 $bin $E --model mamba-codestral-7b-v0.1 --json $O/eval_b1_mamba_$b.json
  grep -E "TPOT|floor / duration" $O/b1_mamba_$b.log | head -2
done
for b in dev base; do
  bin=build/kb_nano; [ $b = base ] && bin=/tmp/base/kb_nano
  st b1_llama_$b 35 $bin $E --model llama-3.1-8b-instruct --json $O/eval_b1_llama_$b.json
  grep -E "TPOT|floor / duration" $O/b1_llama_$b.log | head -2
done
cd $OUT && tar czf s.tgz s && rm -rf s
