#!/usr/bin/env python3
"""Side-by-side table of kb-nano's fused_experts (`kb_nano kernels --json`) and PyTorch's grouped GEMMs
(tools/torch_bench.py --sections moe --json) measured in the same device run, one Markdown table per model.

    python3 tools/moe_table.py --kernels out/kernels_*_fused_experts.json --torch out/torch_moe_*.json \
        --out bench/results/h200/moe/fused_experts.md

Rows match on the case label (T, E, k, H, N and the routing); PyTorch has no "router" routing (kb-nano's third
routing, the random-weight model's own router), so those rows show kb-nano alone. grouped_mm times the two
torch._grouped_mm calls and silu*mul on rows already sorted by expert; torch times everything fused_experts does; loop is transformers' eager per-expert matmuls.
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", nargs="+", required=True)
    ap.add_argument("--torch", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    peers = {}
    for f in args.torch:
        d = json.load(open(f))
        for r in d["rows"]:
            if r["op"] == "fused_experts":
                peers[(d["meta"]["model"].split("/")[-1].removesuffix(".json"), r["label"], r["backend"])] = r
    lines = []
    for f in args.kernels:
        d = json.load(open(f))
        prov = d["provenance"]
        c = prov["ceilings"]
        rows = [r for r in d["rows"] if r["op"] == "fused_experts" and not r["case"].startswith("random")]
        if not rows:
            continue
        model = rows[0]["model"]
        lines += [f"## {model} (tp {rows[0]['tp']}, {prov['mode']} L2, bf16)", "",
                  f"{prov['device']['name']}, CUDA {prov['cuda_version']}, commit {prov['commit']}, {prov['date']}; "
                  f"ceilings measured in the run: copy {c['copy_gb_per_s']:.0f} GB/s, bf16 GEMM "
                  f"{c['bf16_tflop_per_s']:.0f} TFLOP/s. kb-nano: the whole fused_experts (align, permute, both "
                  f"GEMMs, sum); bytes = touched experts' weights + activations.", "",
                  "| case | experts touched | kb-nano us | GB/s | TFLOP/s | % copy BW | % bf16 | torch grouped_mm us "
                  "| torch full us | torch per-expert loop us | kb-nano vs grouped_mm | check |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            us = r["baseline"]["median_ms"] * 1e3
            gm = peers.get((model, r["case"], "grouped_mm"))
            full = peers.get((model, r["case"], "torch"))
            lp = peers.get((model, r["case"], "loop"))
            loop_us = lp["median_ms"] * 1e3 if lp else None
            gm_us = gm["median_ms"] * 1e3 if gm else None
            full_us = full["median_ms"] * 1e3 if full else None
            lines.append(
                f"| {r['case']} | {r['note'].split(' of ')[0]} | {us:.1f} | {r['gb_per_s']:.0f} | {r['tflop_per_s']:.1f} | "
                f"{r['pct_copy_bandwidth']:.1f} | {r['pct_bf16_rate']:.1f} | "
                f"{'' if gm_us is None else f'{gm_us:.1f}'} | {'' if full_us is None else f'{full_us:.1f}'} | "
                f"{'' if loop_us is None else f'{loop_us:.1f}'} | "
                f"{'' if gm_us is None else f'{gm_us / us:.2f}x'} | {r['verdict']} |")
        lines.append("")
    open(args.out, "w").write("\n".join(lines))


if __name__ == "__main__":
    main()
