#!/usr/bin/env bash
# session 22, call 3: mla_decode's warpgroup kernel with S in two accumulator chains, the scale folded into the exp2
# fma, masks only on the last tile and lazy rescaling (baseline) vs ef3d716 (candidate): tests, sanitizers, A/B, ncu;
# then Llama-3.1-8B balanced with bf16 and fp8 KV under --kernel-trace (where fp8 runs lose distance to their floor)
build-dev/unpack.sh
gunzip -c build-dev/kb_nano_tune.gz > build/kb_nano_tune && chmod +x build/kb_nano_tune
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
row(){ grep -hE "^(seqs|B)=|Summary" $o/$1.log | cut -c1-140; }
st tests 80 build/tests/kbn_gpu_tests --gtest_filter='MlaDecodeGpu.*:*OpContractGpu*mla_decode*:ConcatAndCacheMlaGpu.*' --gtest_output=json:$o/gpu_tests.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/tests.log; grep -B2 -A12 "Failure" $o/tests.log | head -30
st abmla 90 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --target mla_decode --model deepseek-v3 --tokens 1,8,32,64,128 --json $o/ab_mla_v3.json
row abmla
st sync 50 compute-sanitizer --tool synccheck build/tests/kbn_gpu_tests --gtest_filter='MlaDecodeGpu.*PageSize*'
tail -1 $o/sync.log
st mlancu 50 ncu --target-processes all --clock-control none --kernel-name regex:mla_decode_wgmma --launch-skip 8 --launch-count 1 --set full --import-source yes -o $o/mla build/kb_nano kernels --target mla_decode --model deepseek-v3 --tokens 128 --case 'B=128 ctx=8192 heads=128 latent=512+64' --mode hot --seeds 1 --random 0
st mlasrc 40 ncu -i $o/mla.ncu-rep --page source --print-source sass --csv --log-file $o/mla_sass.csv
gzip -9 $o/mla_sass.csv; rm -f $o/mla.ncu-rep; pk
