#!/usr/bin/env python3
"""Full-scale truth: kb-nano against Hugging Face transformers on the same seeded random weights.

Runs on the GPU machine. Builds transformers' model for a config in models/ on the GPU in bf16, draws
seeded random weights (N(0, initializer_range), norms U(0.5, 1.5)), saves them with save_pretrained, runs
kb_nano generate on that folder, and compares prompt logits and greedy continuations, in bf16 and in f32
(the same weights upcast). transformers bf16 against transformers f32 measures how far bf16 rounding alone
moves this model, the yardstick for kb-nano bf16 against transformers. Writes a JSON summary.

    python3 tools/hf_compare.py --config models/llama-3.1-8b-instruct.json --kb-nano build/kb_nano \
        --workdir /tmp/hf8b --json $OUT/hf_compare_8b.json
"""
import argparse
import json
import os
import subprocess
import time

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM


def cast_parameters(model, dtype):
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--kb-nano", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--prompt-lens", default="16,57,128,200")
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()

    with open(args.config) as f:
        cfg_json = json.load(f)
    # The config's own family (model_type: llama, qwen3, ...) picks transformers' model class.
    config = AutoConfig.for_model(cfg_json["model_type"], **{k: v for k, v in cfg_json.items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5, generator=gen)
            else:
                p.normal_(0.0, config.initializer_range, generator=gen)
    # Cast the parameters only. model.to(bfloat16) would also round the rotary inv_freq buffer to bf16, which
    # shifts transformers' rope angles by ~0.4% of position * frequency (what from_pretrained avoids).
    cast_parameters(model, torch.bfloat16)
    model.eval()
    os.makedirs(args.workdir, exist_ok=True)
    model.save_pretrained(args.workdir, safe_serialization=True)
    t_save = time.time() - t0

    vocab = config.vocab_size
    prompts = []
    for i, n in enumerate(int(x) for x in args.prompt_lens.split(",")):
        g = torch.Generator().manual_seed(args.seed + 100 + i)
        prompts.append(torch.randint(0, vocab, (n,), generator=g).tolist())

    def hf_run():
        logits, tokens = [], []
        with torch.no_grad():
            for ids in prompts:
                x = torch.tensor([ids], device="cuda")
                logits.append(model(x).logits[0].float())
                out = model.generate(x, max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None,
                                     pad_token_id=0, min_new_tokens=args.new_tokens)
                tokens.append(out[0, len(ids):].tolist())
        return logits, tokens

    def kbn_run(dtype):
        logits_path = os.path.join(args.workdir, f"kbn_logits_{dtype}.safetensors")
        json_path = os.path.join(args.workdir, f"kbn_{dtype}.json")
        cmd = [args.kb_nano, "generate", "--model", args.workdir, "--dtype", dtype,
               "--max-new-tokens", str(args.new_tokens), "--save-logits", logits_path, "--json", json_path]
        for ids in prompts:
            cmd += ["--prompt-ids", ",".join(map(str, ids))]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(json_path) as f:
            toks = json.load(f)["tokens"]
        lg = load_file(logits_path)
        return [lg[f"prompt_logits.{i}"].cuda() for i in range(len(prompts))], toks

    # Pure fp32 everywhere for the f32 pair: no TF32 in transformers' matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    runs = {}
    runs["hf_bf16"] = hf_run()
    t1 = time.time()
    runs["kbn_bf16"] = kbn_run("bf16")
    t_kbn = time.time() - t1
    cast_parameters(model, torch.float32)  # the same weights, exactly (bf16 -> f32 is exact)
    runs["hf_f32"] = hf_run()
    runs["kbn_f32"] = kbn_run("f32")

    def compare(a_name, b_name):
        (la, ta), (lb, tb) = runs[a_name], runs[b_name]
        out = []
        for i in range(len(prompts)):
            a, b = la[i], lb[i]
            diff = (a - b).abs()
            prefix = next((j for j in range(len(tb[i])) if ta[i][j] != tb[i][j]), len(tb[i]))
            out.append({"prompt_len": len(prompts[i]), "max_abs_logit_diff": diff.max().item(),
                        "rel_frobenius_logit_diff": (diff.norm() / b.norm()).item(),
                        "logit_scale_max_abs": b.abs().max().item(),
                        "prompt_argmax_agreement": (a.argmax(-1) == b.argmax(-1)).float().mean().item(),
                        "greedy_matching_prefix": prefix, "greedy_steps": len(tb[i])})
        return out

    pairs = {}
    for a_name, b_name in [("kbn_f32", "hf_f32"), ("kbn_bf16", "hf_bf16"), ("hf_bf16", "hf_f32"),
                           ("kbn_bf16", "hf_f32")]:
        rows = compare(a_name, b_name)
        pairs[f"{a_name}_vs_{b_name}"] = rows
        for r in rows:
            print(f"{a_name:>8} vs {b_name:<7} len {r['prompt_len']:>3}: rel {r['rel_frobenius_logit_diff']:.2e} "
                  f"max|d| {r['max_abs_logit_diff']:.3g} (|logit| <= {r['logit_scale_max_abs']:.2f}) "
                  f"argmax {r['prompt_argmax_agreement']:.3f} greedy {r['greedy_matching_prefix']}/{r['greedy_steps']}")

    summary = {"model_config": args.config, "transformers_version": transformers.__version__,
               "torch_version": torch.__version__, "device": torch.cuda.get_device_name(),
               "dtype": "bfloat16", "hf_attention": "sdpa", "seed": args.seed,
               "seconds_build_and_save": t_save, "seconds_kbn_load_and_generate_bf16": t_kbn,
               "prompt_lens": [len(p) for p in prompts], "pairs": pairs,
               "tokens": {k: v[1] for k, v in runs.items()}}
    with open(args.json, "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
