#!/usr/bin/env bash
# The H200 runs the open issues need, in as few device calls as possible. Binaries are built on the
# development machine and carried (device `run` with carry=[build, build-cheats]):
#   build/          CUDA build of the main tree (kb_nano, tests/kbn_gpu_tests, tests/kbn_tests)
#   build-cheats/   CUDA build with -DKBN_CANDIDATE_DIR=tests/cheats -DKBN_BUILD_TESTS=OFF (kb_nano only)
# Usage, from the repo root on the GPU machine:  tools/h200_session.sh PART [PART ...]
#   gpu-tests  every GPU test (incl. the engine's CUDA-graph tests) and the main job; the suite outgrew one 10-minute
#              device call (its op contracts at real shapes): GPU_SHARDS=N GPU_SHARD=i runs gtest's shard i of N
#              (one call per shard), the main job with shard 0
#   kernels    kb_nano kernels, every L1 op of $KERNELS_MODEL (default llama-3.1-8b-instruct), baseline alone
#              (JSON + Markdown), one step per op
#   fixtures   tools/hf_reference.py for each of $FIXTURE_CONFIGS (models/ names): transformers' logits and greedy
#              tokens on seeded random weights, into $OUT/session/fixtures/<name> (copy to tests/fixtures/)
#   hf-compare tools/hf_compare.py on $HF_COMPARE_MODEL (default llama-3.1-8b-instruct): full-scale logits and
#              greedy tokens against transformers on the same random weights
#   cheats     the cheat corpus (tests/cheats) on the GPU: each KBN_CHEAT value through kb_nano kernels (rms_norm's,
#              then linear's at Llama-3.1-8B's five 4096-token GEMMs: the address-keyed cache once passed 8 of 15 at 2k-8k)
#   gpu-tests-3  the GPU test binary three times in a row (flakiness), one JSON per run
#   honest     the honest rms_norm candidate vs the baseline (with its L3 composition)
#   eval       kb_nano eval on $EVAL_MODEL (default llama-3.1-8b-instruct): $EVAL_WORKLOADS (default latency-b1
#              latency-b32 balanced) in
#              $EVAL_MODES (default eager graph), with $EVAL_FLAGS added (e.g. --admission optimistic) and
#              $EVAL_SUFFIX appended to the file names; each run under $EVAL_LIMIT seconds (default 300; Gemma-3-12B's
#              1000-request workloads took 150-200 s on an H100 and decode-heavy longer: give it 450 in a call of its own)
#   step-profile  kb_nano eval --step-profile in graph mode on $EVAL_WORKLOADS (default balanced)
#   peer       transformers generate vs kb_nano eval at batch 1 and 32 on the same weights (tools/hf_latency_peer.py)
#   tp         the TP GPU tests, Llama-3.1-8B generate at --tp 2, eval latency-b1/b32 at --tp 1, at --tp 2 and at
#              --tp 2 with NCCL for every all-reduce (run on nvidia-h200-x2)
#   modes      kb_nano kernels in hot and graph timing modes (rms_norm, silu_and_mul, linear, decode attention)
#   smoke-eval a short latency-b32 eval in eager and graph modes (does the engine run; do the graphs capture?)
#   moe        kb_nano kernels for the MoE L1 ops of $MOE_MODELS (default Mixtral-8x7B and Qwen3-30B-A3B), at
#              $MOE_TOKENS (default: the ops' token counts), and tools/torch_bench.py --sections moe beside them
#   mamba      Mamba-2 at Mamba-Codestral-7B's shapes: the Mamba GPU tests, kb_nano kernels for the decode ops and
#              (at 512, 4k, 16k tokens) the SSD scan and conv, tools/torch_bench.py's torch SSD (eager and compiled)
#              in the same call (bench/results/h200/mamba2/); the evals: `EVAL_MODEL=mamba-codestral-7b-v0.1 ... eval`
#   deepseek   issue 18's ops: their GPU tests (tests/gpu/test_deepseek_gpu.cpp; the op contract runs under gpu-tests),
#              kb_nano kernels for the latent decode, the absorption bmm, the prefill's gather and attention, the
#              cache store, router and experts at DeepSeek-V2-Lite's shapes (V3's latent decode and router too),
#              tools/torch_bench.py --sections mla beside them, and transformers' fixture of
#              models/tiny-deepseek-v2.json into $OUT/session/fixtures/tiny-deepseek-v2 (copy to tests/fixtures/)
#   gpt-oss    issue 17's gpt-oss: its GPU tests (fused_experts' swigluoai and bias paths, the attention features,
#              tiny-gpt-oss's op contract, graph mode = eager = transformers' greedy tokens), kb_nano kernels for
#              fused_experts at gpt-oss-20b's shapes and tools/torch_bench.py --sections moe beside them; the evals:
#              `EVAL_MODEL=gpt-oss-20b EVAL_MODES=graph ... eval`
#   gemma3     Gemma-3-12B: the attention GPU tests (head 256 prefill and decode on tensor cores, windows, soft caps;
#              the CUDA-graph engine tests, whose gpt-oss case runs two KV cache groups), kb_nano
#              kernels for its prefill and decode attention and its norms/activation, tools/torch_bench.py --sections
#              window beside them; the evals: `EVAL_MODEL=gemma-3-12b-it EVAL_MODES=graph ... eval`
#   fp8-kv     issue 20's fp8 KV cache: the attention GPU tests (fp8 pages on the tensor-core decode and prefill
#              kernels), kb_nano kernels for decode and prefill attention with 16-bit and fp8 pages side by side at
#              $FP8_MODELS (default Llama-3.1-8B, Gemma-3-12B, gpt-oss-20b), and eval --compare-kv-cache-dtype (16-bit
#              then fp8 pages: both runs, their greedy alignment, the first divergences) on $EVAL_MODEL's
#              $EVAL_WORKLOADS (default balanced), graph mode
#   nano       issue 20 item 3's overlapped nano-batches: their GPU test (eager and graph mode = whole steps' tokens,
#              four families), then eval --compare-nano-batches (whole steps, then 2 nano-batches, aligned; serial floor
#              and floor / duration for each) on $EVAL_MODEL's $EVAL_WORKLOADS (default balanced) in graph mode, with
#              --nano-batch-split balanced and kind; $NANO_FLAGS added (e.g. --kernel-trace, --nano-batch-gemm-sms 100,
#              --nano-batch-stagger)
#   pdl        programmatic dependent launch (kbn/pdl.cuh; on by default on Hopper): the engine's GPU tests with
#              KBN_PDL=0, the engine and attention GPU tests again with KBN_PDL=1, then eval latency-b1 and latency-b32
#              in graph mode with --no-pdl and with --pdl on $EVAL_MODEL
#   torch      tools/torch_bench.py: PyTorch's rms_norm, silu*mul, matmul and SDPA at the same shapes
#   tune       candidates tried for the baseline (build-tune/, a candidate build): baseline vs candidate
#   profile    kb_nano profile for rms_norm and prefill attention (recorded ncu captures for the fixtures)
#   profile-decode  kb_nano profile for paged decode attention at batch 64 x 4k
# Everything lands in $OUT/session/ and is packed into $OUT/session.tar.gz (the device returns at most 8
# files), with a log per part, the exit status of every command in $OUT/session/status.txt and the GPU's clock
# and power over the whole run in $OUT/session/smi_<pid>.csv.
set -uo pipefail
out=${OUT:-out}/session
mkdir -p "$out"
export KBN_FIXTURE_DIR=$PWD/tests/fixtures KBN_MODELS_DIR=$PWD/models
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >"$out/gpu.txt"
# The SM clock, power and throttle reasons every 200 ms for the whole session (smi_<pid>.csv): this H200 runs under
# a software power cap that lowers the clock under sustained tensor-core load (bench/results/h200/
# tune_flash_attn_prefill_tma.md), so a slow row can be told from a slow kernel. Stopped when the script exits.
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv \
  -lms 200 >"$out/smi_$$.csv" 2>/dev/null &
smi_pid=$!
trap 'kill "$smi_pid" 2>/dev/null' EXIT
git rev-parse --short=12 HEAD >"$out/commit.txt" 2>/dev/null || true

step() {  # name, seconds, command...: runs it under a time limit, logs it, records the status; never stops the session
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - start))s: $*" | tee -a "$out/status.txt"
}

for part in "$@"; do
  case "$part" in
    gpu-tests)
      shards=${GPU_SHARDS:-1} shard=${GPU_SHARD:-0}
      tag=$([[ $shards -gt 1 ]] && echo "_shard${shard}of$shards" || true)
      step "gpu_tests$tag" 540 env GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="$shard" build/tests/kbn_gpu_tests \
        --gtest_output=json:"$out/gpu_tests$tag.json"
      [[ $shard -eq 0 ]] && step generate_8b 90 build/kb_nano generate --max-new-tokens 64 --json "$out/generate_8b.json"
      ;;
    kernels)
      # One step per op so that a time limit loses one op's rows, not the run's.
      km=${KERNELS_MODEL:-llama-3.1-8b-instruct}
      tag=$([[ $km == llama-3.1-8b-instruct ]] && echo 8b || echo "$km")
      for op in rms_norm fused_add_rms_norm silu_and_mul rotary_embedding store_kvcache embedding argmax linear \
                flash_attn_decode flash_attn_prefill; do
        step "kernels_${tag}_$op" 240 build/kb_nano kernels --model "$km" --variant baseline --target "$op" \
          --json "$out/kernels_${tag}_$op.json" --markdown "$out/kernels_${tag}_$op.md"
      done
      ;;
    fixtures)
      for name in ${FIXTURE_CONFIGS:-tiny-qwen3}; do
        step "fixture_$name" 180 python3 tools/hf_reference.py --config "models/$name.json" \
          --out "$out/fixtures/$name"
      done
      ;;
    hf-compare)
      hm=${HF_COMPARE_MODEL:-llama-3.1-8b-instruct}
      step "hf_compare_$hm" 480 python3 tools/hf_compare.py --config "models/$hm.json" --kb-nano build/kb_nano \
        --workdir "/tmp/hf_$hm" --json "$out/hf_compare_$hm.json"
      ;;
    cheats)
      for c in cached_output side_stream zero_skip shape_specialised stale_output low_precision partial_write \
               mutate_input; do
        step "cheat_$c" 45 env KBN_CHEAT=$c build-cheats/kb_nano kernels --target rms_norm --tokens 1,4096 \
          --random 1 --seeds 1 --no-composition --json "$out/cheat_$c.json"
      done
      for c in honest address_cache peek_baseline prefetch_next exit_zero hang; do
        limit=60 tokens=4096; [[ $c == hang ]] && limit=10  # a hang costs the limit per case (5 cases)
        step "cheat_linear_$c" 150 env KBN_CHEAT=$c build-cheats/kb_nano kernels --target linear --tokens $tokens \
          --random 0 --seeds 1 --no-composition --worker-timeout $limit --json "$out/cheat_linear_$c.json"
      done
      ;;
    gpu-tests-3)
      for i in 1 2 3; do
        step "gpu_tests_run$i" 280 build/tests/kbn_gpu_tests --gtest_output=json:"$out/gpu_tests_run$i.json"
      done
      ;;
    honest)
      step honest_rms_norm 150 env KBN_CHEAT=honest build-cheats/kb_nano kernels --target rms_norm \
        --json "$out/honest_rms_norm.json" --markdown "$out/honest_rms_norm.md"
      ;;
    step-profile)  # where each step's time goes (kb_nano eval --step-profile) on $EVAL_WORKLOADS (default balanced), graph mode
      for w in ${EVAL_WORKLOADS:-balanced}; do
        step "step_profile_$w" 300 build/kb_nano eval --workload "$w" --mode graph --variant baseline \
          --max-model-len 4096 --step-profile --json "$out/eval_${w}_graph_step_profile.json"
      done
      ;;
    eval)
      for mode in ${EVAL_MODES:-eager graph}; do
        for w in ${EVAL_WORKLOADS:-latency-b1 latency-b32 balanced}; do
          len=4096
          [[ $w == long-context ]] && len=33024  # prompts up to 32k + 320 output tokens
          # shellcheck disable=SC2086  # EVAL_FLAGS is a list of flags
          step "eval_${w}_$mode${EVAL_SUFFIX:-}" ${EVAL_LIMIT:-300} build/kb_nano eval --model "${EVAL_MODEL:-llama-3.1-8b-instruct}" \
            --workload "$w" --mode "$mode" --variant baseline --max-model-len "$len" ${EVAL_FLAGS:-} \
            --json "$out/eval_${w}_$mode${EVAL_SUFFIX:-}.json"
        done
      done
      ;;
    peer)
      step latency_peer 480 python3 tools/hf_latency_peer.py --config models/llama-3.1-8b-instruct.json \
        --kb-nano build/kb_nano --workdir /tmp/peer8b --json "$out/latency_peer.json" --markdown "$out/latency_peer.md"
      ;;
    profile)
      mkdir -p "$out/ncu"
      step profile_rms_norm 120 build/kb_nano profile --target rms_norm --case 'T=4096 H=4096' --variant baseline \
        --save-csv "$out/ncu" --json "$out/profile_rms_norm.json" --markdown "$out/profile_rms_norm.md"
      step profile_prefill 120 build/kb_nano profile --target flash_attn_prefill \
        --case 'seqs=1x4096 heads=32 kv=8 D=128' --variant baseline --save-csv "$out/ncu" \
        --json "$out/profile_prefill.json" --markdown "$out/profile_prefill.md"
      ;;
    profile-decode)  # ncu on paged decode attention at the issue's 64 x 4k shape
      mkdir -p "$out/ncu"
      step profile_decode 120 build/kb_nano profile --target flash_attn_decode \
        --case 'B=64 ctx=4096 heads=32 kv=8 D=128' --variant baseline --save-csv "$out/ncu" \
        --json "$out/profile_decode.json" --markdown "$out/profile_decode.md"
      ;;
    moe)  # the MoE L1 ops of Mixtral-8x7B and Qwen3-30B-A3B, then PyTorch's grouped GEMMs at the same shapes
      for km in ${MOE_MODELS:-mixtral-8x7b-instruct-v0.1 qwen3-30b-a3b}; do
        for op in fused_experts topk_softmax moe_align_block_size moe_sum; do
          step "kernels_${km}_$op" 300 build/kb_nano kernels --model "$km" --variant baseline --target "$op" \
            ${MOE_TOKENS:+--tokens $MOE_TOKENS} --json "$out/kernels_${km}_$op.json" --markdown "$out/kernels_${km}_$op.md"
        done
        step "torch_moe_$km" 300 python3 tools/torch_bench.py --model "models/$km.json" --sections moe \
          ${MOE_TOKENS:+--tokens $MOE_TOKENS} --json "$out/torch_moe_$km.json"
      done
      ;;
    gpt-oss)
      step gpu_tests_gpt_oss 300 build/tests/kbn_gpu_tests \
        --gtest_filter='FusedExpertsGpu.*:MoeSumGpu.*:TopkSoftmaxGpu.*:*tiny_gpt_oss*:*GptOss*:FlashAttnFeaturesGpu.*' \
        --gtest_output=json:"$out/gpu_tests_gpt_oss.json"
      step kernels_gpt-oss-20b_fused_experts 300 build/kb_nano kernels --model gpt-oss-20b --variant baseline \
        --target fused_experts --tokens "${MOE_TOKENS:-1,16,64,256,4096,16384}" --random 0 --seeds 1 \
        --json "$out/kernels_gpt-oss-20b_fused_experts.json" --markdown "$out/kernels_gpt-oss-20b_fused_experts.md"
      step torch_moe_gpt-oss-20b 300 python3 tools/torch_bench.py --model models/gpt-oss-20b.json --sections moe \
        --tokens "${MOE_TOKENS:-1,16,64,256,4096,16384}" --json "$out/torch_moe_gpt-oss-20b.json"
      ;;
    gemma3)
      step gpu_tests_gemma3 200 build/tests/kbn_gpu_tests \
        --gtest_filter='FlashAttnPrefillGpu.*:FlashAttnDecodeGpu.*:FlashAttnFeaturesGpu.*:*tiny_gemma3*:GemmaRmsNorm*:GeluAndMul*:EngineGraphGpu.*' \
        --gtest_output=json:"$out/gpu_tests_gemma3.json"
      for op in flash_attn_prefill flash_attn_decode gemma_rms_norm gemma_fused_add_rms_norm gelu_and_mul; do
        step "kernels_gemma-3-12b-it_$op" 240 build/kb_nano kernels --model gemma-3-12b-it --variant baseline \
          --target "$op" --random 0 --seeds 1 --json "$out/kernels_gemma-3-12b-it_$op.json" \
          --markdown "$out/kernels_gemma-3-12b-it_$op.md"
      done
      step torch_window_gemma3 240 python3 tools/torch_bench.py --model models/gemma-3-12b-it.json --sections window \
        --json "$out/torch_window_gemma-3-12b-it.json"
      ;;
    fp8-kv)
      step gpu_tests_fp8_kv 240 build/tests/kbn_gpu_tests \
        --gtest_filter='FlashAttnPrefillGpu.*:FlashAttnDecodeGpu.*:FlashAttnFeaturesGpu.*:StoreKVCacheGpu.*' \
        --gtest_output=json:"$out/gpu_tests_fp8_kv.json"
      for m in ${FP8_MODELS:-llama-3.1-8b-instruct gemma-3-12b-it gpt-oss-20b}; do
        for kv in auto fp8; do  # decode: --tokens are batch sizes; prefill: tokens of one sequence
          for op_tokens in flash_attn_decode:1,8,64,128 flash_attn_prefill:4096,8192; do
            op=${op_tokens%%:*}
            step "kernels_${m}_${op}_kv_$kv" 180 build/kb_nano kernels --model "$m" --variant baseline --target "$op" \
              --tokens "${op_tokens#*:}" --kv-cache-dtype "$kv" --random 0 --seeds 1 \
              --json "$out/kernels_${m}_${op}_kv_$kv.json" --markdown "$out/kernels_${m}_${op}_kv_$kv.md"
          done
        done
      done
      for w in ${EVAL_WORKLOADS:-balanced}; do
        step "eval_${w}_compare_kv_fp8" "${EVAL_LIMIT:-300}" build/kb_nano eval --model "${EVAL_MODEL:-llama-3.1-8b-instruct}" \
          --workload "$w" --mode graph --variant baseline --kv-cache-dtype fp8 --compare-kv-cache-dtype \
          --max-model-len 4096 --json "$out/eval_${w}_compare_kv_fp8.json"
      done
      ;;
    pdl)
      step gpu_tests_pdl 240 env KBN_PDL=0 build/tests/kbn_gpu_tests --gtest_filter='EngineGraphGpu.*' \
        --gtest_output=json:"$out/gpu_tests_pdl.json"
      step gpu_tests_with_pdl 300 env KBN_PDL=1 build/tests/kbn_gpu_tests \
        --gtest_filter='EngineGraphGpu.*:FlashAttnDecodeGpu.*:LinearGpu.*:*RmsNorm*:StoreKVCacheGpu.*' \
        --gtest_output=json:"$out/gpu_tests_with_pdl.json"
      for w in latency-b1 latency-b32; do
        for pdl in off on; do
          flag=(--no-pdl); [ "$pdl" = on ] && flag=(--pdl)
          step "eval_${w}_pdl_$pdl" "${EVAL_LIMIT:-300}" build/kb_nano eval --model "${EVAL_MODEL:-llama-3.1-8b-instruct}" \
            --workload "$w" --mode graph --variant baseline "${flag[@]}" --json "$out/eval_${w}_pdl_$pdl.json"
        done
      done
      ;;
    nano)
      step gpu_tests_nano 240 build/tests/kbn_gpu_tests --gtest_filter='*NanoBatchGpu*' \
        --gtest_output=json:"$out/gpu_tests_nano.json"
      for w in ${EVAL_WORKLOADS:-balanced}; do
        for split in balanced kind; do
          # shellcheck disable=SC2086  # NANO_FLAGS is a list of flags
          step "eval_${w}_nano2_$split" "${EVAL_LIMIT:-300}" build/kb_nano eval --model "${EVAL_MODEL:-llama-3.1-8b-instruct}" \
            --workload "$w" --mode graph --variant baseline --nano-batches 2 --nano-batch-split "$split" \
            --compare-nano-batches ${NANO_FLAGS:-} --json "$out/eval_${w}_nano2_$split.json"
        done
      done
      ;;
    mamba)
      step gpu_tests_mamba 150 build/tests/kbn_gpu_tests \
        --gtest_filter='*amba*:*Conv1d*:*SelectiveState*:*Mixer2*:*rms_norm*:EngineGraphGpu.*' \
        --gtest_output=json:"$out/gpu_tests_mamba.json"
      step kernels_mamba_decode 120 build/kb_nano kernels --model mamba-codestral-7b-v0.1 --variant baseline \
        --target selective_state_update --target causal_conv1d_update --target mixer2_rms_norm_gated --random 0 \
        --seeds 1 --json "$out/kernels_decode.json" --markdown "$out/kernels_decode.md"
      step kernels_mamba_prefill 120 build/kb_nano kernels --model mamba-codestral-7b-v0.1 --variant baseline \
        --target mamba_chunk_scan_combined --target causal_conv1d_fn --tokens 512,4096,16384 --random 0 --seeds 1 \
        --json "$out/kernels_prefill.json" --markdown "$out/kernels_prefill.md"
      step torch_ssd 120 python3 tools/torch_bench.py --model models/mamba-codestral-7b-v0.1.json --tokens 4096,16384 \
        --json "$out/torch_ssd.json"
      ;;
    deepseek)
      step gpu_tests_deepseek 300 build/tests/kbn_gpu_tests \
        --gtest_filter='*deepseek*:*ConcatAndCacheMla*:*GroupedTopk*:*MlaDecode*:*GatherCache*' \
        --gtest_output=json:"$out/gpu_tests_deepseek.json"
      for op in mla_decode bmm gather_cache flash_attn_prefill concat_and_cache_mla grouped_topk fused_experts; do
        step "kernels_deepseek-v2-lite_$op" 240 build/kb_nano kernels --model deepseek-v2-lite --variant baseline \
          --target "$op" --json "$out/kernels_deepseek-v2-lite_$op.json" --markdown "$out/kernels_deepseek-v2-lite_$op.md"
      done
      for op in mla_decode grouped_topk; do
        step "kernels_deepseek-v3_$op" 240 build/kb_nano kernels --model deepseek-v3 --variant baseline \
          --target "$op" --json "$out/kernels_deepseek-v3_$op.json" --markdown "$out/kernels_deepseek-v3_$op.md"
      done
      step torch_mla 300 python3 tools/torch_bench.py --model models/deepseek-v2-lite.json --sections mla \
        --json "$out/torch_deepseek-v2-lite_mla.json"
      step torch_mla_v3 300 python3 tools/torch_bench.py --model models/deepseek-v3.json --sections mla \
        --json "$out/torch_deepseek-v3_mla.json"
      mkdir -p "$out/fixtures"
      step fixture_tiny-deepseek-v2 300 python3 tools/hf_reference.py --config models/tiny-deepseek-v2.json \
        --out "$out/fixtures/tiny-deepseek-v2" --hidden-states
      ;;
    torch)  # PyTorch's own ops at the same shapes, same protocol (the side-by-side table of issue 3)
      step torch_bench 300 python3 tools/torch_bench.py --model models/llama-3.1-8b-instruct.json \
        --json "$out/torch_bench.json"
      ;;
    tune)  # candidates being tried for the baseline (a build with -DKBN_CANDIDATE_DIR=<them>, carried in build-tune/)
      step tune 240 build-tune/kb_nano kernels --variant both ${TUNE_TARGETS:---target store_kvcache --target embedding} \
        --no-composition --json "$out/tune.json" --markdown "$out/tune.md"
      ;;
    tp)  # tensor parallelism over NCCL: needs the nvidia-h200-x2 kind (2 GPUs)
      # PyTorch's NCCL (pip's nvidia-nccl) when the system has none on the loader path.
      if [[ -z ${KBN_NCCL_LIBRARY:-} ]]; then
        KBN_NCCL_LIBRARY=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null) || true
        export KBN_NCCL_LIBRARY
      fi
      step tp_gpu_tests 120 build/tests/kbn_gpu_tests --gtest_filter='Nccl*:AllReduce*:PeerAllReduce*' \
        --gtest_output=json:"$out/tp_gpu_tests.json"
      step tp_generate_8b_tp2 180 build/kb_nano generate --tp 2 --max-new-tokens 64 --json "$out/tp_generate_8b_tp2.json"
      # Batch 1 and 32 at TP 1 and 2; TP 2 also with every all-reduce on NCCL (KBN_PEER_ALL_REDUCE=0), the A/B of
      # the one-shot peer-memory all-reduce.
      for w in latency-b1 latency-b32; do
        step "tp_eval_${w}_tp1" 240 build/kb_nano eval --workload "$w" --mode graph --variant baseline \
          --max-model-len 4096 --json "$out/tp_eval_${w}_tp1.json"
        step "tp_eval_${w}_tp2" 240 build/kb_nano eval --tp 2 --workload "$w" --mode graph --variant baseline \
          --max-model-len 4096 --json "$out/tp_eval_${w}_tp2.json"
        step "tp_eval_${w}_tp2_nccl" 240 env KBN_PEER_ALL_REDUCE=0 build/kb_nano eval --tp 2 --workload "$w" \
          --mode graph --variant baseline --max-model-len 4096 --json "$out/tp_eval_${w}_tp2_nccl.json"
      done
      ;;
    modes)  # the hot and graph timing modes of kb_nano kernels on a few ops (cold is every other part's default)
      for mode in hot graph; do
        step "kernels_$mode" 120 build/kb_nano kernels --mode "$mode" --variant baseline --target rms_norm \
          --target silu_and_mul --target linear --target flash_attn_decode --tokens 1,64,4096 \
          --json "$out/kernels_$mode.json" --markdown "$out/kernels_$mode.md"
      done
      ;;
    smoke-eval)  # a short eval in each mode: does the engine run on the GPU, and do CUDA graphs capture?
      for mode in eager graph; do
        step "smoke_eval_$mode" 120 build/kb_nano eval --workload latency-b32 --num-requests 32 --mode "$mode" \
          --variant baseline --max-model-len 4096 --json "$out/smoke_eval_$mode.json"
      done
      ;;
    *)
      echo "h200_session: unknown part '$part' (gpu-tests kernels fixtures hf-compare cheats honest eval step-profile peer mamba deepseek gpt-oss gemma3 torch tune modes tp profile profile-decode smoke-eval)" >&2
      exit 2
      ;;
  esac
done
tar -czf "${OUT:-out}/session.tar.gz" -C "$(dirname "$out")" session
cat "$out/status.txt"
