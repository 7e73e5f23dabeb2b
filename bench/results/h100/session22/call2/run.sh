#!/usr/bin/env bash
# session 22, call 2: wgmma descriptors as one add per k-step (Sw128Desc) in mla_decode's warpgroup kernel and the
# prefill TMA kernel (baseline) vs e6a6924 (candidate): tests, synccheck, A/B, and the new MLA kernel's SASS under ncu
build-dev/unpack.sh
gunzip -c build-dev/kb_nano_tune.gz > build/kb_nano_tune && chmod +x build/kb_nano_tune
export LD_LIBRARY_PATH=$PWD/build/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH KBN_MODELS_DIR=$PWD/models KBN_FIXTURE_DIR=$PWD/tests/fixtures
o=$OUT/s; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv,noheader > $o/gpu.txt; cat $o/gpu.txt
pk(){ (cd $OUT && tar czf s.tgz s); }
st(){ n=$1; l=$2; shift 2; s=$SECONDS; timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $((SECONDS-s))s: $*" | tee -a $o/status.txt; pk; }
row(){ grep -hE "^(seqs|B)=|Summary" $o/$1.log | cut -c1-140; }
st tests 150 build/tests/kbn_gpu_tests --gtest_filter='MlaDecodeGpu.*:FlashAttnPrefillGpu.*:FlashAttnFeaturesGpu.*:*OpContractGpu*mla_decode*:*OpContractGpu*flash_attn_prefill*' --gtest_output=json:$o/gpu_tests.json
grep -hE "^\[  (PASSED|FAILED) |tests ran" $o/tests.log; grep -B2 -A12 "Failure" $o/tests.log | head -30
st sync 60 compute-sanitizer --tool synccheck build/tests/kbn_gpu_tests --gtest_filter='MlaDecodeGpu.*PageSize*'
tail -1 $o/sync.log
st abmla 120 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --target mla_decode --model deepseek-v3 --tokens 1,8,32,64,128 --json $o/ab_mla_v3.json
row abmla
st abpre 150 build/kb_nano_tune kernels --variant both --no-composition --random 0 --seeds 1 --target flash_attn_prefill --model llama-3.1-8b-instruct --model gpt-oss-20b --model gemma-3-12b-it --tokens 4096,8192,16384 --json $o/ab_prefill.json
row abpre
st mlancu 60 ncu --target-processes all --clock-control none --kernel-name regex:mla_decode_wgmma --launch-skip 8 --launch-count 1 --set full --import-source yes -o $o/mla build/kb_nano kernels --target mla_decode --model deepseek-v3 --tokens 128 --case 'B=128 ctx=8192 heads=128 latent=512+64' --mode hot --seeds 1 --random 0
st mlasrc 60 ncu -i $o/mla.ncu-rep --page source --print-source sass --csv --log-file $o/mla_sass.csv
st mladet 60 ncu -i $o/mla.ncu-rep --page details --log-file $o/mla_details.txt
grep -E "Duration|Issued Instructions  |Compute \(SM\)|DRAM Throughput" $o/mla_details.txt | head
gzip -9 $o/mla_sass.csv; rm -f $o/mla.ncu-rep; pk
