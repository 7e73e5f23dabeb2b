#!/usr/bin/env bash
# session 21, call 1: HEAD fd8b759 on the GPU (attention tests, ragged random kernels cases), window prefill baseline + ncu,
# and mla_decode lagged P V (candidate) vs HEAD (baseline)
build-dev/unpack.sh

export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
st tests 100 build/tests/kbn_gpu_tests --gtest_filter='*OpContractGpu*flash_attn*:*OpContractGpu*mla_decode*:MlaDecodeGpu.*:*PrefillGpu*:*DecodeGpu*' --gtest_output=json:$o/gpu_tests.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/tests.log; grep -B2 -A10 "Failure" $o/tests.log | head -20


st win 90 build/kb_nano kernels --random 0 --seeds 1 --target flash_attn_prefill --model gpt-oss-20b --model gemma-3-12b-it --tokens 8192,32768 --json $o/win.json
grep -hE "^\| |FAIL|ERROR" $o/win.log | cut -d'|' -f2-8 | head -30
st ragged 150 build/kb_nano kernels --random 3 --seeds 1 --tokens 4096 --target flash_attn_decode --target flash_attn_prefill --target mla_decode --model llama-3.1-8b-instruct --model deepseek-v2-lite --model deepseek-v3 --model gemma-3-12b-it --model gpt-oss-20b --json $o/ragged.json
grep -hE "cases pass|FAIL|ERROR" $o/ragged.log | head; grep -hE "^\| .*(ragged|seqs=3)" $o/ragged.log | cut -d'|' -f2-8 | head -30
st prof 120 build/kb_nano profile --target flash_attn_prefill --model gpt-oss-20b --tokens 8192 --case 'seqs=1x8192 heads=64 kv=8 D=64 window=128 sinks' --case 'seqs=1x8192 heads=64 kv=8 D=64 sinks' --launch-count 1 --markdown $o/prof.md --json $o/prof.json
head -80 $o/prof.md
