#!/usr/bin/env python3
"""The latency case of `kb_nano eval` side by side with Hugging Face transformers' generate, same weights.

Runs on the GPU machine. Builds transformers' LlamaForCausalLM for a config in models/ on the GPU in bf16,
draws seeded random weights (N(0, initializer_range), norms 1), saves them with save_pretrained, then times:
  - transformers generate, greedy, batch 1 and batch 32, 128 prompt tokens, exactly 128 new tokens
    (min_new_tokens = max_new_tokens, so EOS cannot stop it), eager (transformers' default), after a warm-up;
  - kb_nano eval --workload latency-b1 / latency-b32 on the same folder (--weights), eager and graph modes.
Reports ms per output token (decode step time) and end-to-end latency per request for each, as JSON and a
Markdown table. transformers is the weak, independent peer the issue names (~27 ms per step at batch 1 here);
the bar for speed is vLLM.

    python3 tools/hf_latency_peer.py --config models/llama-3.1-8b-instruct.json --kb-nano build/kb_nano \
        --workdir /tmp/peer8b --json $OUT/latency_peer.json --markdown $OUT/latency_peer.md
"""
import argparse
import json
import os
import subprocess
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def build_weights(config_path, workdir, seed):
    cfg = LlamaConfig.from_json_file(config_path)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, cfg.initializer_range)
    model.eval()
    os.makedirs(workdir, exist_ok=True)
    model.save_pretrained(workdir, safe_serialization=True)
    return model, cfg


def time_hf(model, cfg, batch, prompt_len, new_tokens, reps, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device="cuda", generator=gen)
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, attention_mask=mask,
                  pad_token_id=0)
    model.generate(ids, **kwargs)  # warm-up
    prefill, total = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False, attention_mask=mask,
                       pad_token_id=0)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        out = model.generate(ids, **kwargs)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        assert out.shape[1] == prompt_len + new_tokens
        prefill.append(t1 - t0)
        total.append(t2 - t1)
    prefill_s = sorted(prefill)[len(prefill) // 2]
    total_s = sorted(total)[len(total) // 2]
    # The first new token comes from the prefill; the other new_tokens - 1 are decode steps.
    return {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "reps": reps,
            "ttft_ms": prefill_s * 1e3, "e2e_ms": total_s * 1e3,
            "ms_per_output_token": (total_s - prefill_s) / (new_tokens - 1) * 1e3,
            "output_tokens_per_s": batch * new_tokens / total_s}


def run_kbn(kb_nano, workdir, workload, mode, out_json):
    cmd = [kb_nano, "eval", "--model", os.path.join(workdir, "config.json"), "--weights", workdir,
           "--workload", workload, "--mode", mode, "--variant", "baseline", "--max-model-len", "512",
           "--json", out_json]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"workload": workload, "mode": mode, "error": proc.stderr[-2000:], "command": " ".join(cmd)}
    with open(out_json) as f:
        result = json.load(f)
    return {"workload": workload, "mode": mode, "wall_s": time.perf_counter() - t0, "command": " ".join(cmd),
            "result": result}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--kb-nano", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--markdown", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    model, cfg = build_weights(args.config, args.workdir, args.seed)
    hf = [time_hf(model, cfg, b, 128, 128, args.reps, args.seed) for b in (1, 32)]
    del model
    torch.cuda.empty_cache()
    kbn = [run_kbn(args.kb_nano, args.workdir, w, m, os.path.join(args.workdir, f"eval_{w}_{m}.json"))
           for w in ("latency-b1", "latency-b32") for m in ("eager", "graph")]

    summary = {"provenance": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "transformers": transformers.__version__, "cuda": torch.version.cuda,
                              "config": args.config, "seed": args.seed},
               "transformers_generate": hf, "kb_nano_eval": kbn}
    with open(args.json, "w") as f:
        json.dump(summary, f, indent=2)

    lines = ["| engine | batch | mode | ms / output token | TTFT ms | E2E ms | output tok/s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in hf:
        lines.append(f"| transformers generate | {r['batch']} | eager | {r['ms_per_output_token']:.2f} | "
                     f"{r['ttft_ms']:.1f} | {r['e2e_ms']:.1f} | {r['output_tokens_per_s']:.0f} |")
    for r in kbn:
        batch = 1 if r["workload"] == "latency-b1" else 32
        if "error" in r:
            lines.append(f"| kb-nano | {batch} | {r['mode']} | error: {r['error'].splitlines()[-1]} | | | |")
            continue
        m = r["result"]["results"]["baseline"]
        lines.append(f"| kb-nano | {batch} | {r['mode']} | {m['tpot_s']['p50'] * 1e3:.2f} | "
                     f"{m['ttft_s']['p50'] * 1e3:.1f} | {m['e2e_latency_s']['p50'] * 1e3:.1f} | "
                     f"{m['output_tokens_per_s']:.0f} |")
    with open(args.markdown, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
