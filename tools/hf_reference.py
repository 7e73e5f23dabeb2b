#!/usr/bin/env python3
"""External truth for kb-nano: Hugging Face transformers' model of a config (Llama, Qwen3, ...) on seeded random
weights.

Runs on the GPU machine (PyTorch + transformers are there). For a config in models/, it builds
transformers' model of the config's family (AutoModelForCausalLM), draws seeded random weights (norm weights
too, so a mixed-up norm is
caught), saves them as safetensors exactly as transformers does (optionally sharded with an index), then
records for a few seeded prompts: the logits of every prompt position and the greedy continuation with
the top-2 logit margin at each step. kb-nano's CPU tests load the same files through its own loader and
must reproduce both.

    python3 tools/hf_reference.py --config models/tiny-llama.json --out tests/fixtures/tiny-llama \
        --max-shard-size 200KB

Mixture-of-experts families (Mixtral, Qwen3-MoE) work the same way:

    python3 tools/hf_reference.py --config models/tiny-mixtral.json --out tests/fixtures/tiny-mixtral
    python3 tools/hf_reference.py --config models/tiny-qwen3-moe.json --out tests/fixtures/tiny-qwen3-moe
    python3 tools/hf_reference.py --config models/tiny-deepseek-v3.json --out tests/fixtures/tiny-deepseek-v3 \
        --hidden-states

kb-nano reads the per-expert checkpoint names the published checkpoints use (Mixtral `experts.{e}.w1/w3/w2`,
Qwen3-MoE `experts.{e}.gate_proj/up_proj/down_proj`), which is what transformers 5.17 saves; a checkpoint saved with
fused expert tensors is refused (check_expert_names). gpt-oss is the exception: its published checkpoints hold fused
expert tensors (`experts.gate_up_proj` [E, H, 2N] with gate and up interleaved, `experts.down_proj` [E, N, H], and
their biases), and that is what kb-nano reads for it. gpt-oss's attention sinks are drawn from N(0, 1) instead of
the initializer's N(0, 0.08) so that they take a visible share of each softmax in the fixture.
"""
import argparse
import json
import os
import platform

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


# Families whose published checkpoints hold fused 3-D expert tensors (kb-nano reads them that way).
FUSED_EXPERT_FAMILIES = {"gpt_oss"}


def check_expert_names(out_dir):
    """Refuses a saved checkpoint whose mixture-of-experts weights are fused 3-D tensors (`experts.gate_up_proj`)
    instead of one tensor per expert and projection (`experts.{e}.<proj>.weight`), the layout the published
    checkpoints hold and kb-nano's loaders read. transformers 5.17 saves the per-expert layout."""
    from safetensors import safe_open
    fused = []
    for f in os.listdir(out_dir):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(out_dir, f), framework="pt") as st:
                fused += [n for n in st.keys() if ".experts." in n and not n.split(".experts.")[1].split(".")[0].isdigit()]
    if fused:
        raise SystemExit(f"transformers {transformers.__version__} saved fused expert tensors {sorted(fused)[:4]}; "
                         "kb-nano reads one tensor per expert and projection (experts.{e}.<proj>.weight), as the "
                         "published checkpoints hold them. Use a transformers version that saves that layout.")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="HF config.json of the model")
    ap.add_argument("--out", required=True, help="output folder (weights + expected.json)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--prompt-lens", default="5,11,1,23", help="comma-separated prompt lengths")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--max-shard-size", default=None, help="e.g. 200KB: save sharded with an index")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden-states", action="store_true",
                    help="also save every layer's hidden states for the first prompt (hidden_states.safetensors)")
    args = ap.parse_args()

    # Full fp32 everywhere: no TF32 in matmuls or convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)

    with open(args.config) as f:
        cfg_json = json.load(f)
    # The config's own family (model_type: llama, qwen3, ...) picks transformers' model class.
    config = AutoConfig.for_model(cfg_json["model_type"], **{k: v for k, v in cfg_json.items() if k != "model_type"})
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(torch.float32)
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=gen))
            elif name.endswith(".sinks"):
                p.copy_(torch.empty(p.shape).normal_(0.0, 1.0, generator=gen))
            else:
                p.copy_(torch.empty(p.shape).normal_(0.0, config.initializer_range, generator=gen))
        # DeepSeek-V3's router score-correction bias is a buffer (zeros at init, so it would test nothing): N(0, 0.1),
        # about the spread of the sigmoid scores it shifts, so it changes which groups and experts win.
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.empty(b.shape).normal_(0.0, 0.1, generator=gen))
    model.eval()

    os.makedirs(args.out, exist_ok=True)
    save_kwargs = {"safe_serialization": True}
    if args.max_shard_size:
        save_kwargs["max_shard_size"] = args.max_shard_size
    model.save_pretrained(args.out, **save_kwargs)
    if cfg_json["model_type"] not in FUSED_EXPERT_FAMILIES:
        check_expert_names(args.out)

    model = model.to(args.device)
    vocab = config.vocab_size
    prompts = []
    for i, n in enumerate(int(x) for x in args.prompt_lens.split(",")):
        g = torch.Generator().manual_seed(args.seed + 100 + i)
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        with torch.no_grad():
            x = torch.tensor([ids], device=args.device)
            logits = model(x).logits[0].float().cpu()
            seq = list(ids)
            greedy, margins = [], []
            for _ in range(args.new_tokens):
                step = model(torch.tensor([seq], device=args.device)).logits[0, -1].float().cpu()
                top2 = torch.topk(step, 2)
                tok = int(top2.indices[0])
                greedy.append(tok)
                margins.append(float(top2.values[0] - top2.values[1]))
                seq.append(tok)
            # Cross-check the manual loop against transformers' own generate().
            out = model.generate(x, max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None,
                                 pad_token_id=0, min_new_tokens=args.new_tokens)
            assert out[0, n:].tolist() == greedy, "generate() disagrees with the step loop"
        if args.hidden_states and i == 0:
            from safetensors.torch import save_file
            with torch.no_grad():
                hs = model(torch.tensor([ids], device=args.device), output_hidden_states=True).hidden_states
            save_file({f"hidden_states.{k}": h[0].float().cpu().contiguous() for k, h in enumerate(hs)},
                      os.path.join(args.out, "hidden_states.safetensors"))
        prompts.append({"prompt_ids": ids, "prompt_logits": logits.tolist(), "greedy_ids": greedy,
                        "greedy_top2_margin": margins})

    expected = {
        "generator": "tools/hf_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        "dtype": "float32",
        "attn_implementation": "eager",
        "seed": args.seed,
        # Non-finite config values (Mamba-2's time_step_limit Infinity) as strings: strict JSON readers take the file.
        "config": json.loads(json.dumps(cfg_json), parse_constant=str),
        "prompts": prompts,
    }
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, allow_nan=False)
    print(f"wrote {args.out}: {len(prompts)} prompts, min greedy margin "
          f"{min(min(p['greedy_top2_margin']) for p in prompts):.3e}")


if __name__ == "__main__":
    main()
