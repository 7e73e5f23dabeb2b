#!/usr/bin/env python3
"""PyTorch peers for kb-nano's L1 baselines, timed on the GPU machine with the same protocol.

Shapes come from a config in models/ (default Llama-3.1-8B-Instruct, tp 1): rms_norm and fused add+norm
[T, hidden], silu*mul [T, 2*intermediate], the model's GEMMs (x @ W^T), causal prefill attention through
SDPA's flash / cuDNN / efficient backends (GQA), decode attention over a contiguous cache, and (--sections moe) the
expert MLPs of an MoE config through torch._grouped_mm. Timing: CUDA
events around one call, warm-up, repeat to >= 200 ms (max 1000), median with p10/p90, and a 256 MiB buffer
written between calls so L2 is cold (--hot skips it). Writes JSON rows that kb-nano's tables can sit beside.

    python3 tools/torch_bench.py --model models/llama-3.1-8b-instruct.json --json $OUT/torch_bench.json
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


def timeit(fn, flush, min_ms=200.0, max_iters=1000):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times, total = [], 0.0
    while (total < min_ms or len(times) < 10) and len(times) < max_iters:
        if flush is not None:
            # Read, not write, the flush buffer (as kb_nano kernels does, bench/l2_flush.h): a written buffer leaves
            # the L2 full of dirty lines whose write-back the timed op would pay for.
            flush.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        t = a.elapsed_time(b)
        times.append(t)
        total += t
    times.sort()
    q = lambda f: times[min(len(times) - 1, int(f * len(times)))]
    return q(0.5), q(0.1), q(0.9), len(times)


def moe(cfg, tp, tokens, record, dev, dt):
    """The expert MLPs of kb-nano's fused_experts cases (same shapes, uniform and skewed routings, the same bytes and
    FLOPs formulas): out[t] = sum_j w[t, j] * W2[e] (silu(g) * u), [g; u] = W13[e] x[t]. Two peers:
    grouped_mm: the two torch._grouped_mm calls and silu*mul on rows already sorted by expert (routing,
    permutation and the weighted sum not counted, as the MoE issue's table measured it);
    torch: everything fused_experts does (sort the pairs, gather, both grouped GEMMs, scale, sum per token);
    loop: transformers' eager MoE, a matmul chain per touched expert (its host syncs included).
    gpt-oss's experts (a config with swiglu_limit): swigluoai (min(g, limit), clamp(u, +-limit), (u + 1) g
    sigmoid(alpha g)) and per-expert biases after each GEMM, in every peer, labelled as kb-nano labels them."""
    H = cfg["hidden_size"]
    E = cfg.get("num_local_experts", cfg.get("num_experts", cfg.get("n_routed_experts")))
    k = cfg["num_experts_per_tok"]
    N = cfg.get("moe_intermediate_size", cfg["intermediate_size"]) // tp
    w13 = torch.randn(E, 2 * N, H, device=dev, dtype=dt) * 0.02
    w2 = torch.randn(E, H, N, device=dev, dtype=dt) * 0.02
    oai = "swiglu_limit" in cfg
    limit, alpha = float(cfg.get("swiglu_limit", 7.0)), float(cfg.get("swiglu_alpha", 1.702))
    b13 = torch.randn(E, 2 * N, device=dev, dtype=dt) * 0.02 * H ** 0.5 if oai else None
    b2 = torch.randn(E, H, device=dev, dtype=dt) * 0.02 * N ** 0.5 if oai else None

    def act(h):
        if not oai:
            return F.silu(h[:, :N]) * h[:, N:]
        g = h[:, :N].clamp(max=limit)
        u = h[:, N:].clamp(min=-limit, max=limit)
        return (u + 1) * g * torch.sigmoid(alpha * g)

    def bias(y, b, experts):  # the rows' experts' bias (gpt-oss), else y
        return y + b[experts] if oai else y

    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    ranks = torch.randperm(E, device=dev, generator=gen).float()
    popularity = {"uniform": torch.ones(E, device=dev), "skewed": (ranks + 1) ** -1.2}
    for T in tokens:
        x = torch.randn(T, H, device=dev, dtype=dt)
        for route, pop in popularity.items():
            ids = torch.multinomial(pop.expand(T, E), k, replacement=False, generator=gen).to(torch.int32)
            wts = torch.rand(T, k, device=dev, generator=gen) + 0.05
            wts = wts / wts.sum(1, keepdim=True)
            touched = int(torch.unique(ids).numel())
            label = f"T={T} E={E} k={k} H={H} N={N} {route}" + (" swigluoai bias" if oai else "")
            bytes_ = touched * (3 * H * N + (2 * N + H if oai else 0)) * 2 + 2 * T * H * 2 + T * k * 8
            flops = 2 * T * k * 3 * H * N

            def prep(ids=ids):
                flat = ids.flatten()
                order = torch.argsort(flat, stable=True)
                counts = torch.bincount(flat, minlength=E)
                offs = torch.cumsum(counts, 0).to(torch.int32)
                return order, offs

            order, offs = prep()
            xs = x[order // k]
            rows_e = ids.flatten()[order].long()

            def gemms(xs=xs, offs=offs, rows_e=rows_e):
                h = bias(torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs), b13, rows_e)
                a = act(h)
                return bias(torch._grouped_mm(a, w2.transpose(1, 2), offs=offs), b2, rows_e)

            def full(x=x, ids=ids, wts=wts, T=T):
                order, offs = prep(ids)
                re = ids.flatten()[order].long()
                h = bias(torch._grouped_mm(x[order // k], w13.transpose(1, 2), offs=offs), b13, re)
                a = act(h)
                y = bias(torch._grouped_mm(a, w2.transpose(1, 2), offs=offs), b2, re) * wts.flatten()[order, None].to(dt)
                out = torch.zeros(T * k, H, device=dev, dtype=dt)
                out[order] = y
                return out.view(T, k, H).sum(1)

            def loop(x=x, ids=ids, wts=wts):
                # transformers' eager MoE: one matmul chain per expert that some token chose.
                out = torch.zeros_like(x)
                for e in torch.unique(ids).tolist():
                    tok, slot = torch.where(ids == e)
                    h = x[tok] @ w13[e].t() + (b13[e] if oai else 0)
                    y = act(h) @ w2[e].t() + (b2[e] if oai else 0)
                    out.index_add_(0, tok, y * wts[tok, slot, None].to(dt))
                return out

            record("fused_experts", label, "grouped_mm", bytes_, flops, gemms)
            record("fused_experts", label, "torch", bytes_, flops, full)
            record("fused_experts", label, "loop", bytes_, flops, loop)
        del x


def mamba(cfg, tokens, record, dev, dt, scan_flops):
    """Mamba-2's SSD scan (kb-nano's mamba_chunk_scan_combined prefill cases: one sequence of T tokens, no initial
    state) by the chunked algorithm of the Mamba-2 paper written in torch (segment sums, the masked intra-chunk
    product, chunk states, the inter-chunk recurrence as a [chunks x chunks] decay matrix, the state-to-output term),
    bf16 operands with fp32 decays, in eager mode and under torch.compile. Same bytes and FLOPs formulas as the op's
    cases (scan_flops)."""
    nh, P, N, G, L = cfg["num_heads"], cfg["head_dim"], cfg["state_size"], cfg.get("n_groups", 1), cfg["chunk_size"]
    rep = nh // G

    def ssd(x, dt_raw, A, B, C, D, dt_bias):
        T = x.shape[0]
        c = T // L
        dts = F.softplus(dt_raw.float() + dt_bias)                                  # [T, h]
        xs = (x.float() * dts[..., None]).to(dt).view(c, L, nh, P)
        Bh = B.view(c, L, G, 1, N).expand(c, L, G, rep, N).reshape(c, L, nh, N)
        Ch = C.view(c, L, G, 1, N).expand(c, L, G, rep, N).reshape(c, L, nh, N)
        # Cumulative sums as products with a triangle of ones (fp32): torch 2.11's inductor fails to generate
        # its split scan for torch.cumsum here ("list indices must be integers or slices, not None").
        upper = torch.ones(L, L, device=x.device).triu()
        acum = (dts * A).view(c, L, nh).permute(0, 2, 1) @ upper                    # [c, h, L] fp32
        seg = acum[..., :, None] - acum[..., None, :]                               # [c, h, L, L]
        causal = torch.ones(L, L, device=x.device, dtype=torch.bool).tril()
        decay = torch.exp(seg.masked_fill(~causal, -float("inf"))).to(dt)
        scores = torch.einsum("clhn,cshn->chls", Ch, Bh) * decay                   # [c, h, L, L]
        y = torch.einsum("chls,cshp->clhp", scores, xs).float()
        to_end = torch.exp(acum[..., -1:] - acum).to(dt)                            # [c, h, L]
        states = torch.einsum("clhn,clhp->chpn", Bh * to_end.permute(0, 2, 1)[..., None], xs).float()  # [c, h, P, N]
        chunk_sum = acum[..., -1]                                                   # [c, h]
        csum = torch.ones(c, c, device=x.device).tril() @ chunk_sum                # cumsum over chunks
        # state entering chunk z: sum_{k < z} exp(csum[z-1] - csum[k]) states[k]
        inter = csum[:, None, :] - csum[None, :, :]                                 # [z, k, h]: csum[z] - csum[k]
        zk = torch.ones(c, c, device=x.device, dtype=torch.bool).tril(-1)
        shifted = torch.cat([torch.zeros_like(inter[:1]), inter[:-1]], 0)           # csum[z-1] - csum[k]
        w = torch.exp(shifted.masked_fill(~zk[..., None], -float("inf")))           # [z, k, h]
        s_in = torch.einsum("zkh,khpn->zhpn", w, states)
        y = y + torch.einsum("clhn,chpn->clhp", Ch.float() * torch.exp(acum).permute(0, 2, 1)[..., None], s_in)
        return (y.reshape(T, nh, P) + D[:, None] * x.float()).to(dt)

    # The peer must compute the scan: check it against the plain recurrence (fp64) on 3 chunks first.
    with torch.no_grad():
        T0 = 3 * L
        g = torch.Generator(device=dev).manual_seed(0)
        x0 = torch.randn(T0, nh, P, device=dev, generator=g).to(dt)
        dt0 = torch.randn(T0, nh, device=dev, generator=g).to(dt)
        A0, D0, b0 = -torch.rand(nh, device=dev, generator=g) - 0.5, torch.randn(nh, device=dev, generator=g), \
            torch.randn(nh, device=dev, generator=g) * 0.1
        B0 = torch.randn(T0, G, N, device=dev, generator=g).to(dt)
        C0 = torch.randn(T0, G, N, device=dev, generator=g).to(dt)
        S = torch.zeros(nh, P, N, device=dev, dtype=torch.float64)
        ref = torch.empty(T0, nh, P, device=dev, dtype=torch.float64)
        Bd = B0.double().repeat_interleave(rep, 1)
        Cd = C0.double().repeat_interleave(rep, 1)
        d = F.softplus(dt0.double() + b0.double())
        for t in range(T0):
            S = torch.exp(d[t] * A0.double())[:, None, None] * S + (d[t][:, None] * x0[t].double())[..., None] * \
                Bd[t][:, None, :]
            ref[t] = (S * Cd[t][:, None, :]).sum(-1) + D0.double()[:, None] * x0[t].double()
        got = ssd(x0, dt0, A0, B0, C0, D0, b0).double()
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        print(f"torch SSD peer vs recurrence: max error {err:.2e} of the output's range")
        assert err < 3e-2, f"the torch SSD peer disagrees with the recurrence ({err:.2e})"

    compiled = torch.compile(ssd, dynamic=False)
    for T in tokens:
        if T < L or T % L:
            continue
        x = torch.randn(T, nh, P, device=dev, dtype=dt)
        dt_raw = torch.randn(T, nh, device=dev, dtype=dt)
        A = -torch.rand(nh, device=dev) - 0.5
        B = torch.randn(T, G, N, device=dev, dtype=dt)
        C = torch.randn(T, G, N, device=dev, dtype=dt)
        D = torch.randn(nh, device=dev)
        dt_bias = torch.randn(nh, device=dev) * 0.1
        es = 2
        bytes_ = es * (2 * T * nh * P + T * nh + 2 * T * G * N + nh * P * N)  # x, dt, B, C in; y, final state out
        flops = scan_flops(T, L, nh, P, N)
        label = f"T={T} seqs=1 h={nh} P={P} N={N} G={G} L={L}"
        record("mamba_chunk_scan_combined", label, "torch-eager", bytes_, flops,
               lambda: ssd(x, dt_raw, A, B, C, D, dt_bias))
        record("mamba_chunk_scan_combined", label, "torch-compile", bytes_, flops,
               lambda: compiled(x, dt_raw, A, B, C, D, dt_bias))
        del x, B, C


def mla(cfg, record, dev, dt, backends):
    """Multi-head latent attention (DeepSeek): the absorbed decode over a contiguous latent (scores over all 576
    values, values the first 512, one key head shared by every query head) and the decompressed causal prefill
    (qk 192 / v 128), in torch: SDPA backends that take the shapes, and explicit matmuls + softmax."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    H, L, R = cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    P, V = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    W, scale = L + R, (P + R) ** -0.5
    for B, ctx in ((1, 4096), (32, 4096), (64, 4096), (128, 4096), (32, 8192)):
        q = torch.randn(B, H, W, device=dev, dtype=dt)
        lat = torch.randn(B, ctx, W, device=dev, dtype=dt)
        label = f"B={B} ctx={ctx} heads={H} latent={L}+{R}"
        bytes_, flops = B * ctx * W * 2 + B * H * (W + L) * 2, 2 * B * H * ctx * (W + L)

        # The heads are the rows of one MQA product per sequence (no copy of the latent per head).
        def explicit(q=q, lat=lat):
            s = torch.bmm(q, lat.transpose(1, 2)).float() * scale
            return torch.bmm(torch.softmax(s, -1).to(dt), lat[..., :L])
        record("mla_decode", label, "bmm", bytes_, flops, explicit)
        # SDPA's fused kernels want as many K/V heads as query heads: the latent expanded over the heads (a view).
        q4, k4 = q.view(B, H, 1, W), lat.view(B, 1, ctx, W).expand(B, H, ctx, W)
        for bname, be in backends.items():
            def run(be=be, q4=q4, k4=k4):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q4, k4, k4[..., :L], scale=scale)
            record("mla_decode", label, bname, bytes_, flops, run)
        del q, lat, q4, k4
    for T in (4096, 8192):
        q = torch.randn(1, H, T, P + R, device=dev, dtype=dt)
        k = torch.randn(1, H, T, P + R, device=dev, dtype=dt)
        v = torch.randn(1, H, T, V, device=dev, dtype=dt)
        pairs = T * (T + 1) // 2
        label = f"T={T} heads={H} qk{P + R} v{V} causal"
        for bname, be in backends.items():
            def run(be=be, q=q, k=k, v=v):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            record("mla_prefill", label, bname, 2 * T * H * (2 * (P + R) + 2 * V), 2 * H * pairs * (P + R + V), run)
        del q, k, v


def ssd_flops(T, L, nh, P, N):
    """The SSD's matmul work, as kb-nano's mamba_chunk_scan_combined facts count it: per chunk of l tokens and head,
    C B^T and the masked product with x over the causal pairs, (N + P) l (l + 1), plus the chunk state and the
    state-to-output term, 4 l P N."""
    chunks = T // L
    return chunks * nh * ((N + P) * L * (L + 1) + 4 * L * P * N)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/llama-3.1-8b-instruct.json")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", default="1,32,256,1024,4096,16384")
    ap.add_argument("--hot", action="store_true")
    ap.add_argument("--json", required=True)
    ap.add_argument("--sections", default="dense,attention",
                    help="comma list of: dense (norms, silu*mul, GEMMs), attention, moe (the expert MLPs of an MoE "
                         "config, torch._grouped_mm), window (sliding-window prefill at the config's window: "
                         "flex_attention and masked SDPA), mamba (a Mamba-2 config's SSD scan in torch, eager and "
                         "compiled; the only section for such a config), mla (a DeepSeek config's absorbed latent decode and "
                         "decompressed prefill, SDPA and explicit matmuls; chosen for such a config)")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    cfg = json.load(open(args.model))
    if "text_config" in cfg and "hidden_size" not in cfg:  # a multimodal config (Gemma-3): its language model
        cfg = cfg["text_config"]
    dev, dt = "cuda", torch.bfloat16
    if "state_size" in cfg:  # Mamba-2: the SSD scan only
        sections = {"mamba"} | (sections & {"mamba"})
    elif "kv_lora_rank" in cfg:  # DeepSeek (MLA): its attention and experts; no per-head K/V to bench otherwise
        sections = {"mla"} | (sections & {"moe"})
    else:
        H, I, V = cfg["hidden_size"], cfg["intermediate_size"] // args.tp, cfg["vocab_size"] // args.tp
        nh, nkv = cfg["num_attention_heads"] // args.tp, max(1, cfg["num_key_value_heads"] // args.tp)
        D = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        eps = cfg.get("rms_norm_eps", 1e-5)
    torch.backends.cuda.matmul.allow_tf32 = False
    flush = None if args.hot else torch.zeros((256 << 20) // 4, dtype=torch.int32, device=dev)
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = []

    def record(op, label, backend, bytes_, flops, fn):
        try:
            med, p10, p90, n = timeit(fn, flush)
        except Exception as e:  # a backend that does not support the shape (or a compile failure)
            print(f"{op:<22} {label:<28} {backend:<10} n/a ({str(e).splitlines()[0][:60]})")
            return
        row = {"op": op, "label": label, "backend": backend, "median_ms": med, "p10_ms": p10, "p90_ms": p90,
               "iters": n, "bytes": bytes_, "flops": flops, "gb_per_s": bytes_ / med / 1e6,
               "tflop_per_s": flops / med / 1e9}
        rows.append(row)
        print(f"{op:<22} {label:<28} {backend:<10} {med * 1e3:9.1f} us  {row['gb_per_s']:8.0f} GB/s "
              f"{row['tflop_per_s']:7.1f} TFLOP/s")

    # Ceilings, measured the same way kb-nano does: a 2 GiB device copy, and an 8192^3 bf16 matmul.
    src = torch.empty(1 << 31, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    record("ceiling_copy", "2 GiB d2d", "torch", 2 * src.numel(), 0, lambda: dst.copy_(src))
    a = torch.randn(8192, 8192, device=dev, dtype=dt)
    b = torch.randn(8192, 8192, device=dev, dtype=dt)
    record("ceiling_matmul", "8192^3 bf16", "torch", 0, 2 * 8192 ** 3, lambda: a @ b)
    del src, dst, a, b

    from torch.nn.attention import SDPBackend
    if "mla" in sections:
        mla(cfg, record, dev, dt, {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                                   "efficient": SDPBackend.EFFICIENT_ATTENTION})
    if "moe" in sections:
        moe(cfg, args.tp, tokens, record, dev, dt)
    if "mamba" in sections:
        mamba(cfg, tokens, record, dev, dt, ssd_flops)

    w = torch.randn(H, device=dev, dtype=dt) if "dense" in sections else None
    for T in (tokens if "dense" in sections else []):
        x = torch.randn(T, H, device=dev, dtype=dt)
        r = torch.randn(T, H, device=dev, dtype=dt)
        record("rms_norm", f"T={T} H={H}", "torch", 2 * T * H * 2 + H * 2, 0,
               lambda: F.rms_norm(x, (H,), w, eps))
        record("fused_add_rms_norm", f"T={T} H={H}", "torch", 4 * T * H * 2 + H * 2, 0,
               lambda: F.rms_norm(x + r, (H,), w, eps))
        if cfg.get("model_type", "").startswith("qwen3"):
            # Qwen3's per-head q/k norm over views of the fused qkv output (kb-nano's rms_norm "q heads"/"k heads"
            # cases): torch on the strided view, and the unfused pair (a contiguous copy, then the norm).
            width = (nh + 2 * nkv) * D
            qkv = torch.randn(T, width, device=dev, dtype=dt)
            wd = torch.randn(D, device=dev, dtype=dt)
            for tag, heads, off in (("q", nh, 0), ("k", nkv, nh * D)):
                view = qkv[:, off:off + heads * D].view(T, heads, D)
                label = f"{tag} heads T={T} heads={heads} D={D} row={width}"
                record("rms_norm", label, "torch", 2 * T * heads * D * 2 + D * 2, 0,
                       lambda v=view: F.rms_norm(v, (D,), wd, eps))
                record("rms_norm", label, "copy+norm", 2 * T * heads * D * 2 + D * 2, 0,
                       lambda v=view: F.rms_norm(v.contiguous(), (D,), wd, eps))
        g = torch.randn(T, 2 * I, device=dev, dtype=dt)
        record("silu_and_mul", f"T={T} I={I}", "torch", 3 * T * I * 2, 0, lambda: F.silu(g[:, :I]) * g[:, I:])
        for name, K, N in (("qkv", H, (nh + 2 * nkv) * D), ("o", nh * D, H), ("gate_up", H, 2 * I),
                           ("down", I, H), ("lm_head", H, V)):
            xin = torch.randn(T, K, device=dev, dtype=dt)
            W = torch.randn(N, K, device=dev, dtype=dt) * 0.02
            record(f"linear_{name}", f"T={T} K={K} N={N}", "torch", 2 * (T * K + N * K + T * N), 2 * T * N * K,
                   lambda: xin @ W.t())
        del x, r, g

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for T in ((1024, 4096, 8192, 16384) if "attention" in sections else ()):
        q = torch.randn(1, nh, T, D, device=dev, dtype=dt)
        k = torch.randn(1, nkv, T, D, device=dev, dtype=dt)
        v = torch.randn(1, nkv, T, D, device=dev, dtype=dt)
        flops = 4 * nh * D * T * (T + 1) / 2
        for bname, be in backends.items():
            def run(be=be):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            # bytes: q and out [T, nh, D], k and v [T, nkv, D], bf16
            record("flash_attn_prefill", f"T={T} {nh}/{nkv} d{D} causal", bname, 2 * (2 * T * nh * D + 2 * T * nkv * D),
                   flops, run)
    for B, ctx in (((1, 4096), (64, 4096), (128, 8192)) if "attention" in sections else ()):
        q = torch.randn(B, nh, 1, D, device=dev, dtype=dt)
        k = torch.randn(B, nkv, ctx, D, device=dev, dtype=dt)
        v = torch.randn(B, nkv, ctx, D, device=dev, dtype=dt)
        for bname, be in backends.items():
            def run(be=be):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            record("flash_attn_decode", f"B={B} ctx={ctx} {nh}/{nkv} d{D}", bname, 2 * B * nkv * ctx * D * 2,
                   4 * B * nh * ctx * D, run)

    # Sliding-window causal prefill at the config's window (--sections window): flex_attention with a window block
    # mask (compiled; blocks wholly outside the window are skipped), and SDPA with an explicit boolean mask (a dense
    # [T, T] mask: every block computed; 8k tokens only). FLOPs count the visible pairs, as kb-nano's cases do.
    # Neither takes sinks (flex's score_mod cannot add a term to the denominator), so sinks are not compared.
    W = cfg.get("sliding_window") or 0
    if "window" in sections and W > 0:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)

        def pairs(T):
            ramp = min(W, T)
            return ramp * (ramp + 1) // 2 + (T - ramp) * W

        for T in (8192, 32768):
            q = torch.randn(1, nh, T, D, device=dev, dtype=dt)
            k = torch.randn(1, nkv, T, D, device=dev, dtype=dt)
            v = torch.randn(1, nkv, T, D, device=dev, dtype=dt)
            label = f"T={T} {nh}/{nkv} d{D} window={W}"
            flops, bytes_ = 4 * nh * D * pairs(T), 2 * (2 * T * nh * D + 2 * T * nkv * D)

            def window_mod(b, h, q_idx, kv_idx):
                return (q_idx >= kv_idx) & (q_idx - kv_idx < W)
            bm = create_block_mask(window_mod, 1, 1, T, T, device=dev)
            record("flash_attn_prefill", label, "flex", bytes_, flops,
                   lambda q=q, k=k, v=v, bm=bm: flex(q, k, v, block_mask=bm, enable_gqa=True))
            # flex's own full causal rate on the same shape, for the window's "skipped blocks cost nothing" ratio.
            cm = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, 1, 1, T, T, device=dev)
            record("flash_attn_prefill", f"T={T} {nh}/{nkv} d{D} causal", "flex", bytes_,
                   4 * nh * D * T * (T + 1) // 2, lambda q=q, k=k, v=v, cm=cm: flex(q, k, v, block_mask=cm, enable_gqa=True))
            causal = torch.ones(T, T, device=dev, dtype=torch.bool).tril()
            if T <= 8192:
                mask = causal & ~torch.ones(T, T, device=dev, dtype=torch.bool).tril(-W)
                for bname in ("cudnn", "efficient"):
                    def run(be=backends[bname], mask=mask, q=q, k=k, v=v):
                        with sdpa_kernel(be):
                            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                    record("flash_attn_prefill", label, f"sdpa-{bname}", bytes_, flops, run)
            del q, k, v, causal

    meta = {"tool": "tools/torch_bench.py", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "model": args.model, "tp": args.tp, "mode": "hot" if args.hot else "cold",
            "date": time.strftime("%Y-%m-%d")}
    json.dump({"meta": meta, "rows": rows}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
