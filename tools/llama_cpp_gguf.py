#!/usr/bin/env python3
"""A GGUF of a Llama model's shapes with random weights, for llama.cpp's benchmarks (tools/llama_cpp_peer.sh).

Written with the gguf-py of the llama.cpp source being benchmarked (--llama-cpp DIR: DIR/gguf-py), as llama.cpp's
own convert_hf_to_gguf.py writes a Llama checkpoint: architecture "llama", its hyperparameters from the HF
config.json (--config), tensors named token_embd / blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,
ffn_gate,ffn_up,ffn_down} / output_norm / output, plus rope_freqs for the "llama3" RoPE scaling (the same factors
convert_hf_to_gguf computes). The tokenizer (tokenizer.* keys) is copied from a vocabulary GGUF (--vocab, default
DIR/models/ggml-vocab-llama-bpe.gguf: Llama 3's 128256 tokens); the model's vocab_size is the tokenizer's (a config
with another vocab_size, e.g. the tiny test configs, is widened to it, with a note).

Weights: matrices in F16 (default) or BF16, norms and rope_freqs in F32 (as the converter writes them). To write
16 GB quickly, one pool of random 16-bit values is drawn (sign and mantissa uniform, magnitude 2^-7..2^-5, i.e.
about the 0.02 standard deviation of the config's initializer_range) and every matrix is a window of that pool at a
random offset: the same shapes and bytes per tensor as a real checkpoint, values not independent across tensors
(nothing a benchmark reads can tell). Norm weights are 1. The values are not kb-nano's random weights.

Usage: llama_cpp_gguf.py --llama-cpp DIR --config models/llama-3.1-8b-instruct.json --out model.gguf
                         [--dtype f16|bf16] [--layers N] [--seed S] [--vocab FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
import types
from pathlib import Path


def die(msg: str) -> None:
    print(f"llama_cpp_gguf: {msg}", file=sys.stderr)
    sys.exit(2)


def import_gguf(llama_cpp: Path):
    gguf_py = llama_cpp / "gguf-py"
    if not (gguf_py / "gguf" / "gguf_writer.py").is_file():
        die(f"no gguf-py in {llama_cpp} (expected {gguf_py}/gguf/gguf_writer.py)")
    try:
        import numpy  # noqa: F401
    except ImportError:
        die(f"{sys.executable} has no numpy (apt-get install python3-numpy, or set PYTHON to one that has it)")
    try:
        import yaml  # noqa: F401
    except ImportError:
        # gguf/metadata.py imports yaml at the top but only uses it to read model cards, which this never does.
        sys.modules["yaml"] = types.ModuleType("yaml")
    sys.path.insert(0, str(gguf_py))
    import gguf
    return gguf


def llama3_rope_factors(cfg: dict, head_dim: int) -> list[float] | None:
    """convert_hf_to_gguf's LlamaModel.generate_extra_tensors for rope_type llama3 (conversion/llama.py)."""
    rs = cfg.get("rope_scaling") or {}
    if str(rs.get("rope_type", rs.get("type", ""))).lower() != "llama3":
        return None
    base = cfg.get("rope_theta", 10000.0)
    factor = rs.get("factor", 8.0)
    low_freq_factor = rs.get("low_freq_factor", 1.0)
    high_freq_factor = rs.get("high_freq_factor", 4.0)
    old_context_len = rs.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    factors = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", required=True, type=Path, help="the llama.cpp source folder (its gguf-py is used)")
    ap.add_argument("--config", required=True, type=Path, help="HF config.json of a LlamaForCausalLM (models/*.json)")
    ap.add_argument("--out", required=True, type=Path, help="the .gguf to write")
    ap.add_argument("--vocab", type=Path, help="GGUF to copy tokenizer.* from (default DIR/models/ggml-vocab-llama-bpe.gguf)")
    ap.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    ap.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (0: the config's)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    gguf = import_gguf(a.llama_cpp)
    import numpy as np

    if not a.config.is_file():
        die(f"config not found: {a.config}")
    cfg = json.loads(a.config.read_text())
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "llama" and "LlamaForCausalLM" not in archs:
        die(f"{a.config} is not a Llama config (model_type {cfg.get('model_type')!r}, architectures {archs})")
    vocab_path = a.vocab or a.llama_cpp / "models" / "ggml-vocab-llama-bpe.gguf"
    if not vocab_path.is_file():
        die(f"vocabulary GGUF not found: {vocab_path}")

    t0 = time.time()
    hidden = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads", n_head))
    head_dim = int(cfg.get("head_dim") or hidden // n_head)
    ff = int(cfg["intermediate_size"])
    n_layers = a.layers or int(cfg["num_hidden_layers"])
    eps = float(cfg.get("rms_norm_eps", 1e-5))
    theta = float(cfg.get("rope_theta", 10000.0))
    n_ctx = int(cfg.get("max_position_embeddings", 4096))
    if cfg.get("tie_word_embeddings"):
        print("llama_cpp_gguf: note: the config ties the embeddings; an output.weight is written anyway (as a "
              "separate LM head: the same bytes per token as kb-nano's untied 8B)")

    reader = gguf.GGUFReader(str(vocab_path))
    tok_fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in tok_fields:
        die(f"{vocab_path} has no tokenizer.ggml.tokens")
    vocab = len(tok_fields["tokenizer.ggml.tokens"].data)
    if int(cfg.get("vocab_size", vocab)) != vocab:
        print(f"llama_cpp_gguf: note: {a.config.name} has vocab_size {cfg.get('vocab_size')}; the tokenizer of "
              f"{vocab_path.name} has {vocab}: the model gets {vocab} (embedding and LM head {vocab} x {hidden})")

    ftype = gguf.LlamaFileType.MOSTLY_F16 if a.dtype == "f16" else gguf.LlamaFileType.MOSTLY_BF16
    qtype = gguf.GGMLQuantizationType.F16 if a.dtype == "f16" else gguf.GGMLQuantizationType.BF16

    w = gguf.GGUFWriter(str(a.out), "llama")
    w.add_name(f"kb-nano random weights, {a.config.stem} shapes" + (f", {n_layers} layers" if a.layers else ""))
    w.add_block_count(n_layers)
    w.add_context_length(n_ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_file_type(ftype)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(head_dim)
    if head_dim != hidden // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    for k, f in tok_fields.items():
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), vtype, sub_type=sub)

    # Shapes as numpy (rows = output features), as convert_hf_to_gguf passes HF's [out, in] tensors.
    mats: list[tuple[str, tuple[int, int]]] = [("token_embd.weight", (vocab, hidden))]
    for i in range(n_layers):
        mats += [
            (f"blk.{i}.attn_q.weight", (n_head * head_dim, hidden)),
            (f"blk.{i}.attn_k.weight", (n_kv * head_dim, hidden)),
            (f"blk.{i}.attn_v.weight", (n_kv * head_dim, hidden)),
            (f"blk.{i}.attn_output.weight", (hidden, n_head * head_dim)),
            (f"blk.{i}.ffn_gate.weight", (ff, hidden)),
            (f"blk.{i}.ffn_up.weight", (ff, hidden)),
            (f"blk.{i}.ffn_down.weight", (hidden, ff)),
        ]
    mats.append(("output.weight", (vocab, hidden)))
    biggest = max(r * c for _, (r, c) in mats)
    need = 2 * sum(r * c for _, (r, c) in mats) + 4 * hidden * (2 * n_layers + 1) + (64 << 20)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(a.out.parent).free
    if free < need:
        die(f"{a.out.parent} has {free / 1e9:.1f} GB free; the GGUF needs {need / 1e9:.1f} GB")

    rng = np.random.default_rng(a.seed)
    pool_n = biggest + (1 << 22)
    bits = rng.integers(0, 1 << 16, size=pool_n, dtype=np.uint16)
    if a.dtype == "f16":  # exponent field 8 or 9 of bias 15: |x| in [2^-7, 2^-5)
        pool = ((bits & np.uint16(0x83FF)) | ((np.uint16(8) + ((bits >> np.uint16(10)) & np.uint16(1))) << np.uint16(10)))
        pool = pool.view(np.float16)
    else:  # bf16: exponent field 120 or 121 of bias 127
        pool = ((bits & np.uint16(0x807F)) | ((np.uint16(120) + ((bits >> np.uint16(7)) & np.uint16(1))) << np.uint16(7)))
    del bits
    t_pool = time.time() - t0

    rope = llama3_rope_factors(cfg, head_dim)
    if rope is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope, dtype=np.float32))
    ones = np.ones(max(hidden, 1), dtype=np.float32)
    n_params = 0
    for name, (r, c) in mats:
        n = r * c
        off = int(rng.integers(0, pool_n - n + 1))
        t = pool[off:off + n].reshape(r, c)
        w.add_tensor(name, t, raw_dtype=qtype if a.dtype == "bf16" else None)
        n_params += n
        if name.endswith("attn_output.weight"):
            i = name.split(".")[1]
            w.add_tensor(f"blk.{i}.attn_norm.weight", ones[:hidden])
        elif name.endswith("ffn_down.weight"):
            i = name.split(".")[1]
            w.add_tensor(f"blk.{i}.ffn_norm.weight", ones[:hidden])
    w.add_tensor("output_norm.weight", ones[:hidden])
    n_params += hidden * (2 * n_layers + 1)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = a.out.stat().st_size
    print(f"llama_cpp_gguf: wrote {a.out}: {size / 1e9:.2f} GB, {n_params / 1e9:.3f} B parameters, {a.dtype}, "
          f"{n_layers} layers, hidden {hidden}, heads {n_head}/{n_kv} x {head_dim}, ffn {ff}, vocab {vocab}, "
          f"rope_freqs {'llama3' if rope is not None else 'none'}; pool {t_pool:.1f} s, total {time.time() - t0:.1f} s")
    summary = {"path": str(a.out), "bytes": size, "parameters": n_params, "dtype": a.dtype, "layers": n_layers,
               "hidden": hidden, "heads": n_head, "kv_heads": n_kv, "head_dim": head_dim, "ffn": ff, "vocab": vocab,
               "context_length": n_ctx, "rope_freqs": rope is not None, "config": str(a.config),
               "vocab_gguf": str(vocab_path), "seed": a.seed, "seconds": round(time.time() - t0, 2)}
    a.out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
