#!/usr/bin/env python3
"""The table of tools/llama_cpp_peer.sh: llama.cpp's llama-bench / llama-batched-bench beside kb_nano eval, with
provenance (llama.cpp tag and commit, kb-nano commit, GPU, driver, CUDA, clocks, commands, every step's status).

Reads the run folder (--dir, $OUT/llama_peer): status.txt, provenance.txt, gpu.csv, nvcc.txt, smi.csv,
LLAMA_CPP_SOURCE.json, gguf.json, llama_bench.json, llama_batched_bench.jsonl, kb_latency_b1.json,
kb_prefill_4096.json, kb_batched_256.json; any of them may be missing (a failed or skipped step): its cells say so.
Writes --markdown and --json. Standard library only.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from pathlib import Path


def load_json(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def load_jsonl(p: Path) -> list[dict]:
    rows = []
    try:
        for line in p.read_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return rows


def kv_file(p: Path) -> dict:
    d = {}
    try:
        for line in p.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                d[k.strip()] = v.strip()
    except OSError:
        pass
    return d


def status_lines(p: Path) -> list[dict]:
    out = []
    try:
        for line in p.read_text().splitlines():
            m = re.match(r"^(\S+) rc=(\S+) (\d+)s(?: \(limit (\d+)s, at \+(\d+)s\))?: (.*)$", line)
            if m:
                out.append({"step": m[1], "rc": m[2], "seconds": int(m[3]),
                            "limit_s": int(m[4]) if m[4] else None, "at_s": int(m[5]) if m[5] else None,
                            "command": m[6]})
    except OSError:
        pass
    return out


def smi_summary(p: Path) -> dict | None:
    try:
        rows = list(csv.reader(p.read_text().splitlines()))
    except OSError:
        return None
    if len(rows) < 2:
        return None
    head = [h.strip() for h in rows[0]]

    def col(prefix: str) -> list[float]:
        idx = next((i for i, h in enumerate(head) if h.startswith(prefix)), None)
        vals = []
        if idx is None:
            return vals
        for r in rows[1:]:
            if idx < len(r):
                m = re.match(r"\s*([0-9.]+)", r[idx])
                if m:
                    vals.append(float(m[1]))
        return vals

    sm, power = col("clocks.current.sm"), col("power.draw")
    if not sm:
        sm = col("clocks.sm")
    busy = [c for c in sm if c > 1000]  # samples under load (idle is ~345 MHz)
    reasons = sorted({r[-1].strip() for r in rows[1:] if r and r[-1].strip() not in ("", "0x0000000000000000")})
    return {"samples": len(rows) - 1,
            "sm_mhz_min": min(sm) if sm else None, "sm_mhz_max": max(sm) if sm else None,
            "sm_mhz_median_under_load": statistics.median(busy) if busy else None,
            "sm_mhz_min_under_load": min(busy) if busy else None,
            "power_w_max": max(power) if power else None,
            "throttle_reasons_seen": reasons[:8]}


def kb_summary(j: dict | None) -> dict | None:
    if not j:
        return None
    res = (j.get("results") or {}).get("baseline") or next(iter((j.get("results") or {}).values()), None)
    if not res:
        return None
    floor = res.get("serial_floor") or {}
    return {"commit": (j.get("provenance") or {}).get("commit"),
            "cuda_version": (j.get("provenance") or {}).get("cuda_version"),
            "device_name": (j.get("provenance") or {}).get("device_name"),
            "command_line": (j.get("provenance") or {}).get("command_line"),
            "dtype": (j.get("config") or {}).get("dtype"),
            "model": (j.get("config") or {}).get("model"),
            "workload": (j.get("config") or {}).get("workload"),
            "num_requests": res.get("num_requests"),
            "prompt_tokens": res.get("prompt_tokens"), "output_tokens": res.get("output_tokens"),
            "duration_s": res.get("duration_s"), "output_tokens_per_s": res.get("output_tokens_per_s"),
            "ttft_s": res.get("ttft_s"), "tpot_s": res.get("tpot_s"),
            "floor_s": floor.get("floor_s"), "floor_fraction": floor.get("achieved_fraction")}


def f(x, fmt="{:.2f}", none="—"):
    return none if x is None else fmt.format(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--markdown", required=True, type=Path)
    ap.add_argument("--json", required=True, type=Path)
    a = ap.parse_args()
    d = a.dir

    prov = kv_file(d / "provenance.txt")
    status = status_lines(d / "status.txt")
    src = load_json(d / "LLAMA_CPP_SOURCE.json") or {}
    gguf = load_json(d / "gguf.json") or {}
    lb = load_json(d / "llama_bench.json")
    lb = lb if isinstance(lb, list) else []
    bb = load_jsonl(d / "llama_batched_bench.jsonl")
    kb = {k: kb_summary(load_json(d / f"kb_{k}.json")) for k in ("latency_b1", "prefill_4096", "batched_256")}
    smi = smi_summary(d / "smi.csv")
    gpu = {}
    try:
        rows = list(csv.reader((d / "gpu.csv").read_text().splitlines()))
        if len(rows) >= 2:
            gpu = {h.strip(): v.strip() for h, v in zip(rows[0], rows[1])}
    except OSError:
        pass
    nvcc = ""
    try:
        nvcc = next((l.strip() for l in (d / "nvcc.txt").read_text().splitlines() if "release" in l), "")
    except OSError:
        pass
    step_rc = {s["step"]: s["rc"] for s in status}

    def why(step: str) -> str:
        rc = step_rc.get(step)
        return "not run" if rc is None else ("skipped" if rc == "skip" else f"rc={rc}")

    def lb_row(n_prompt: int, n_gen: int, n_ubatch: int | None = None) -> dict | None:
        for r in lb:
            if r.get("n_prompt") == n_prompt and r.get("n_gen") == n_gen and r.get("n_depth", 0) == 0 and \
                    (n_ubatch is None or r.get("n_ubatch") == n_ubatch):
                return r
        return None

    def lb_ms(r: dict | None, tokens: int) -> tuple[float | None, float | None]:
        """(ms for `tokens` tokens, relative stddev) from avg_ts / stddev_ts."""
        if not r or not r.get("avg_ts"):
            return None, None
        return 1e3 * tokens / r["avg_ts"], (r.get("stddev_ts") or 0) / r["avg_ts"]

    ubatches = sorted({r.get("n_ubatch") for r in lb if r.get("n_ubatch") is not None})
    rows = []  # the headline table, from what ran (the GPU run's sizes, or the smoke test's)

    def missing(step: str, what: str) -> str:
        rc = step_rc.get(step)
        return why(step) if rc != "0" else f"no {what} in its output"

    # batch-1 decode: llama-bench's tgN (depth 0) against eval latency-b1's TPOT
    k1 = kb["latency_b1"]
    kb_tpot = (k1 or {}).get("tpot_s") or {}
    tg_rows = [r for r in lb if not r.get("n_prompt") and r.get("n_gen") and not r.get("n_depth")]
    tg = min(tg_rows, key=lambda r: r.get("avg_ns", 0) / r["n_gen"], default=None)  # fastest ubatch (all alike)
    tg_ms, tg_rel = lb_ms(tg, 1)
    tg_name = f"tg{tg['n_gen']}" if tg else "tg128"
    rows.append({"what": "batch-1 decode, ms/token",
                 "kb_nano": kb_tpot.get("p50") and 1e3 * kb_tpot["p50"],
                 "kb_nano_note": (f"TPOT p50, eval latency-b1 ({k1['num_requests']} requests, "
                                  f"{k1['prompt_tokens']} / {k1['output_tokens']} tokens in all, one at a time)")
                 if k1 else why("kb_latency_b1" if "kb_latency_b1" in step_rc else "kb_cpu_smoke"),
                 "llama_cpp": tg_ms,
                 "llama_cpp_note": (f"{tg_name} (llama-bench, ±{100 * tg_rel:.1f}%)" if tg_ms
                                    else missing("llama_bench", "tg row"))})
    # one N-token prompt, for each ppN llama-bench ran; kb-nano's TTFT where its prefill run has prompts of N
    kp = kb["prefill_4096"]
    kb_ttft = (kp or {}).get("ttft_s") or {}
    kp_len = (kp["prompt_tokens"] // kp["num_requests"]) if kp and kp.get("num_requests") else None
    pp_sizes = sorted({r["n_prompt"] for r in lb if r.get("n_prompt") and not r.get("n_gen")})
    for n in sorted(set(pp_sizes) | ({kp_len} if kp_len else set()) or {4096}):
        pp = {u: lb_ms(lb_row(n, 0, u), n) for u in ubatches}
        best = min((u for u in pp if pp[u][0]), key=lambda u: pp[u][0], default=None)
        mine = kp is not None and kp_len == n
        rows.append({"what": f"one {n}-token prompt, prefill ms",
                     "kb_nano": (kb_ttft.get("p50") and 1e3 * kb_ttft["p50"]) if mine else None,
                     "kb_nano_note": (f"TTFT p50 of {kp['num_requests']} requests of {n} / "
                                      f"{kp['output_tokens'] // kp['num_requests']} tokens, one at a time (mean "
                                      f"{f(kb_ttft.get('mean') and 1e3 * kb_ttft['mean'], '{:.1f}')} ms)") if mine
                     else ("not run (no eval run of this prompt length)" if n != 4096 else why("kb_prefill_4096")),
                     "llama_cpp": pp[best][0] if best is not None else None,
                     "llama_cpp_note": (f"pp{n} (llama-bench), best of: " + ", ".join(
                         f"ubatch {u}: {f(pp[u][0], '{:.1f}')} ms" for u in ubatches if pp[u][0]))
                     if best is not None else missing("llama_bench", f"pp{n} row")})
    # many requests at once: llama-batched-bench's row against eval's one wave of the same sizes
    kbb = kb["batched_256"]
    bbr = next((r for r in bb if (r.get("pl"), r.get("pp"), r.get("tg")) == (256, 512, 512)), None)
    bbr = bbr or (bb[0] if bb else None)
    pl, ppn, tgn = (bbr["pl"], bbr["pp"], bbr["tg"]) if bbr else (256, 512, 512)
    rows.append({"what": f"{pl} requests x {ppn} in / {tgn} out, total s",
                 "kb_nano": (kbb or {}).get("duration_s"),
                 "kb_nano_note": (f"eval latency-b32 --scale 4 --num-requests 256 --max-num-seqs 256 (one wave): "
                                  f"{f(kbb.get('output_tokens_per_s'), '{:,.0f}')} output tok/s") if kbb
                 else ("not run (GPU runs only)" if prov.get("mode") == "cpu" else why("kb_batched_256")),
                 "llama_cpp": bbr.get("t") if bbr else None,
                 "llama_cpp_note": (f"llama-batched-bench: prefill {bbr['t_pp']:.2f} s ({bbr['speed_pp']:,.0f} tok/s), "
                                    f"decode {bbr['t_tg']:.2f} s ({bbr['speed_tg']:,.0f} tok/s)") if bbr
                 else missing("llama_batched_bench", "row (is -c at least npl x (npp + ntg)?)")})
    for r in rows:
        k, l = r["kb_nano"], r["llama_cpp"]
        # no ratio in a smoke test: its kb-nano run is another model (tiny-llama's own 512-token vocabulary)
        r["llama_cpp_over_kb_nano"] = (l / k) if (k and l and prov.get("mode") != "cpu") else None

    # provenance
    lb_commit = lb[0].get("build_commit") if lb else None
    kb_commits = sorted({v["commit"] for v in kb.values() if v and v.get("commit")})
    provenance = {
        "date_utc": prov.get("date_utc"), "mode": prov.get("mode"),
        "llama_cpp": {"repo": src.get("llama_cpp_repo"), "tag": src.get("tag"), "commit": src.get("commit"),
                      "commit_date": src.get("commit_date"), "source": src.get("npm_package"),
                      "bundle_sha256": src.get("bundle_sha256"), "checked_out": src.get("checked_out"),
                      "build_commit_reported": lb_commit,
                      "gpu_info": lb[0].get("gpu_info") if lb else None,
                      "backends": lb[0].get("backends") if lb else None},
        "kb_nano": {"tree": prov.get("kb_nano_tree"), "tree_commit": prov.get("kb_nano_commit"),
                    "binary_commits": kb_commits, "binary": prov.get("kb_nano_binary")},
        "gpu": gpu, "nvcc": nvcc, "kb_nano_cuda_version": next((v["cuda_version"] for v in kb.values()
                                                                 if v and v.get("cuda_version")), None),
        "clocks_during_run": smi, "host": prov.get("host"), "nproc": prov.get("nproc"),
        "python": prov.get("python"), "cmake": prov.get("cmake"), "tarball_sha256": prov.get("tarball_sha256"),
        "gguf": gguf,
    }
    result = {"rows": rows, "provenance": provenance, "llama_bench": lb, "llama_batched_bench": bb,
              "kb_nano": kb, "status": status}
    a.json.write_text(json.dumps(result, indent=2) + "\n")

    # markdown
    L = []
    smoke = prov.get("mode") == "cpu"
    model = Path(prov.get("config", "?")).stem
    L.append(f"# llama.cpp beside kb-nano: {model}, random weights{' (CPU SMOKE TEST: not a measurement)' if smoke else ''}")
    L.append("")
    kb_dtype = next((v["dtype"] for v in kb.values() if v and v.get("dtype")), "?")
    L.append(f"{provenance['date_utc']}; {gpu.get('name', 'no GPU')}; llama.cpp {src.get('tag', '?')} "
             f"({(src.get('commit') or '?')[:12]}, from {src.get('npm_package', '?')}), kb-nano "
             f"{', '.join(kb_commits) or prov.get('kb_nano_tree', '?')}. llama.cpp: GGUF "
             f"{gguf.get('dtype', '?').upper()}, " +
             ("on the CPU, flash attention on; kb-nano: " + kb_dtype + " weights on the CPU." if smoke else
              "every layer on the GPU (-ngl 99), flash attention ON (-fa 1); kb-nano: " + kb_dtype +
              " weights, graph mode. Times: lower is better; the ratio > 1 when kb-nano is faster."))
    L.append("")
    L.append("| what | kb-nano | llama.cpp | llama.cpp / kb-nano | kb-nano run | llama.cpp run |")
    L.append("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        L.append(f"| {r['what']} | {f(r['kb_nano'])} | {f(r['llama_cpp'])} | {f(r['llama_cpp_over_kb_nano'], '{:.2f}x')} "
                 f"| {r['kb_nano_note']} | {r['llama_cpp_note']} |")
    L.append("")
    if smoke:
        L.append("A test of the script on a CPU with a tiny model (vocabulary widened to Llama 3's 128256 tokens): "
                 "it shows the GGUF loads and both tools run, nothing about speed.")
    else:
        L.append(f"Not the same weights: both are random, llama.cpp's {gguf.get('dtype', '?').upper()} from "
                 "tools/llama_cpp_gguf.py, kb-nano's its own seeded ones; the shapes and bytes per step are the same. "
                 f"llama-bench's {tg_name} decodes from an empty context, kb-nano's latency-b1 TPOT is at contexts of "
                 "128-256. kb-nano's TTFT includes its scheduling of the step; llama-bench times llama_decode of the "
                 "prompt alone. llama-batched-bench's total is its prefill of every prompt then the decode steps; "
                 "kb-nano's duration is the whole run of the wave (scheduling, mixed steps, sampling).")
    if lb:
        L.append("")
        L.append("## llama-bench")
        L.append("")
        L.append("| test | n_batch | n_ubatch | flash_attn | t/s | ± | ms per test |")
        L.append("| --- | --- | --- | --- | --- | --- | --- |")
        for r in lb:
            name = (f"pp{r['n_prompt']}" if r.get("n_prompt") else "") + (f"tg{r['n_gen']}" if r.get("n_gen") else "")
            L.append(f"| {name} | {r.get('n_batch')} | {r.get('n_ubatch')} | {r.get('flash_attn')} | "
                     f"{f(r.get('avg_ts'))} | {f(r.get('stddev_ts'))} | {f(r.get('avg_ns') and r['avg_ns'] / 1e6, '{:.2f}')} |")
        L.append("")
        L.append(f"model: {lb[0].get('model_type')}, {lb[0].get('model_size', 0) / 1e9:.2f} GB, "
                 f"{lb[0].get('model_n_params', 0) / 1e9:.3f} B params; build {lb[0].get('build_commit')} "
                 f"({lb[0].get('backends')}); GPU: {lb[0].get('gpu_info')}; CPU: {lb[0].get('cpu_info')}")
    if bb:
        L.append("")
        L.append("## llama-batched-bench")
        L.append("")
        L.append("| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s | n_batch | n_ubatch | fa |")
        L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in bb:
            L.append(f"| {r['pp']} | {r['tg']} | {r['pl']} | {r['n_kv']} | {r['t_pp']:.3f} | {r['speed_pp']:.1f} | "
                     f"{r['t_tg']:.3f} | {r['speed_tg']:.1f} | {r['t']:.3f} | {r['speed']:.1f} | {r['n_batch']} | "
                     f"{r['n_ubatch']} | {r['flash_attn']} |")
    if any(kb.values()):
        L.append("")
        L.append("## kb_nano eval")
        L.append("")
        L.append("| run | requests | prompt / output tokens | duration s | output tok/s | TTFT p50 ms | TPOT p50 ms | "
                 "serial floor s (share) | commit |")
        L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, v in kb.items():
            if not v:
                continue
            tt, tp = v.get("ttft_s") or {}, v.get("tpot_s") or {}
            L.append(f"| {name} | {v['num_requests']} | {v['prompt_tokens']} / {v['output_tokens']} | "
                     f"{f(v['duration_s'], '{:.3f}')} | {f(v['output_tokens_per_s'], '{:,.1f}')} | "
                     f"{f(tt.get('p50') and 1e3 * tt['p50'])} | {f(tp.get('p50') and 1e3 * tp['p50'], '{:.3f}')} | "
                     f"{f(v.get('floor_s'), '{:.3f}')} ({f(v.get('floor_fraction') and 100 * v['floor_fraction'], '{:.1f}%')}) "
                     f"| {(v.get('commit') or '?')[:12]} |")
    L.append("")
    L.append("## Provenance")
    L.append("")
    L.append(f"- GPU: {gpu.get('name', '—')}, driver {gpu.get('driver_version', '—')}, memory "
             f"{gpu.get('memory.total [MiB]', '—')}; clocks at the start: SM {gpu.get('clocks.current.sm [MHz]', '—')}, "
             f"memory {gpu.get('clocks.current.memory [MHz]', '—')}, max SM {gpu.get('clocks.max.sm [MHz]', '—')}; "
             f"power limit {gpu.get('power.limit [W]', '—')}")
    if smi:
        L.append(f"- during the run ({smi['samples']} samples every 200 ms, smi.csv): SM clock under load median "
                 f"{f(smi['sm_mhz_median_under_load'], '{:.0f}')} MHz, min {f(smi['sm_mhz_min_under_load'], '{:.0f}')} MHz; "
                 f"power max {f(smi['power_w_max'], '{:.0f}')} W; throttle reasons seen: "
                 f"{', '.join(smi['throttle_reasons_seen']) or 'none'}")
    L.append(f"- CUDA: {nvcc or '—'} (llama.cpp built here with it, -DCMAKE_CUDA_ARCHITECTURES=90a); kb_nano's: "
             f"{provenance['kb_nano_cuda_version'] or '—'}")
    L.append(f"- llama.cpp: {src.get('llama_cpp_repo', '?')} tag {src.get('tag', '?')}, commit {src.get('commit', '?')} "
             f"({src.get('commit_date', '?')}), {src.get('checked_out', '')}; from {src.get('npm_package', '?')}'s "
             f"gitRelease.bundle (sha256 {src.get('bundle_sha256', '?')}); build_commit as llama-bench reports it: "
             f"{lb_commit or '—'}")
    L.append(f"- kb-nano: tree {prov.get('kb_nano_tree', '?')} (HEAD {prov.get('kb_nano_commit', '?')}); binaries' "
             f"commits (eval JSON): {', '.join(kb_commits) or '—'}")
    if gguf:
        L.append(f"- GGUF: {gguf.get('bytes', 0) / 1e9:.2f} GB, {gguf.get('parameters', 0) / 1e9:.3f} B parameters, "
                 f"{gguf.get('dtype')}, {gguf.get('layers')} layers, hidden {gguf.get('hidden')}, heads "
                 f"{gguf.get('heads')}/{gguf.get('kv_heads')} x {gguf.get('head_dim')}, ffn {gguf.get('ffn')}, vocab "
                 f"{gguf.get('vocab')}, from {gguf.get('config')}, written in {gguf.get('seconds')} s")
    L.append(f"- host: {prov.get('host', '?')}, {prov.get('nproc', '?')} CPUs; {prov.get('cmake', '')}; python "
             f"{prov.get('python', '?')}")
    L.append("")
    L.append("## Steps (exit status, seconds, command)")
    L.append("")
    L.append("| step | rc | s | command |")
    L.append("| --- | --- | --- | --- |")
    for s in status:
        cmd = s["command"].replace("|", "\\|")
        L.append(f"| {s['step']} | {s['rc']} | {s['seconds']} | `{cmd}` |")
    a.markdown.write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
