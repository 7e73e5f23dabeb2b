#!/usr/bin/env bash
# session 22, call 1: head-64 window prefill with 160-key tiles (baseline: candidate_window_tile_160.patch applied)
# vs a475449 (candidate): A/B, tests, sanitizers; then mla_decode's 32-key wgmma kernel under ncu (full set + SASS source)
build-dev/unpack.sh
gunzip -c build-dev/kb_nano_tune.gz > build/kb_nano_tune && chmod +x build/kb_nano_tune
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
st ab 120 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_prefill --model gpt-oss-20b --tokens 1024,4096,8192,16384 --json $o/ab_gptoss.json --markdown $o/ab_gptoss.md
grep -hE "Summary|speedup" $o/ab.log | head; grep -hE "^\| " $o/ab.log | cut -d'|' -f2-9 | head -30
st ab8 60 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_prefill --model gpt-oss-20b --tokens 8192 --kv-cache-dtype fp8 --json $o/ab_gptoss_fp8.json
grep -hE "^\| " $o/ab8.log | cut -d'|' -f2-9 | head
st tests 120 build/tests/kbn_gpu_tests --gtest_filter='FlashAttnPrefillGpu.*:FlashAttnFeaturesGpu.*:*OpContractGpu*flash_attn_prefill*' --gtest_output=json:$o/gpu_tests.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/tests.log; grep -B2 -A12 "Failure" $o/tests.log | head -30
st sync 60 compute-sanitizer --tool synccheck build/tests/kbn_gpu_tests --gtest_filter='FlashAttnFeaturesGpu.GptOssLikeWindowAndSinks'
tail -1 $o/sync.log
st race 60 compute-sanitizer --tool racecheck build/tests/kbn_gpu_tests --gtest_filter='FlashAttnFeaturesGpu.GptOssLikeWindowAndSinks'
tail -1 $o/race.log
st mlak 60 build/kb_nano kernels --random 0 --seeds 1 --target mla_decode --model deepseek-v3 --tokens 32,128 --json $o/mla.json
grep -hE "^\| " $o/mlak.log | cut -d'|' -f2-9 | head
st mlancu 150 ncu --target-processes all --clock-control none --kernel-name regex:mla_decode_wgmma --launch-skip 8 --launch-count 1 --set full --import-source yes -o $o/mla build/kb_nano kernels --target mla_decode --model deepseek-v3 --tokens 128 --case 'B=128 ctx=8192 heads=128 latent=512+64' --mode hot --seeds 1 --random 0
ls -la $o/
st mlasrc 60 ncu -i $o/mla.ncu-rep --page source --print-source sass --csv --log-file $o/mla_sass.csv
st mladet 60 ncu -i $o/mla.ncu-rep --page details --log-file $o/mla_details.txt
grep -iE "stall|Duration|Throughput|Warp Cycles|Issued" $o/mla_details.txt | head -40
gzip -9 $o/mla_sass.csv; rm -f $o/mla.ncu-rep; pk
