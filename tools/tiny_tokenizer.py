#!/usr/bin/env python3
"""The tokenizer of the embedded tiny models (models/tokenizers/tiny-llama.json): a Llama-3-style byte-level BPE that
fits their 512-token vocabulary, so `kb_nano generate --prompt "..."` runs on the CPU default with no download.

Ids 0-255 are the 256 bytes (GPT-2's byte -> character map), 256-499 the merges learned here by plain BPE (most
frequent adjacent pair first, ties to the pair seen first) over the English text below, split into words at spaces
as Llama-3's regex roughly does; 500-504 the Llama-3 special tokens that BOS and the chat format need. Ids 505-511
have no token (a random-weight model can still produce them; kb_nano generate says so). The pre-tokenizer, post
processor and decoder are Llama-3's, so the file exercises the same code as a real Llama-3 tokenizer.json.

Usage: tools/tiny_tokenizer.py --out models/tokenizers/tiny-llama.json   (deterministic: same file every run)
"""
import argparse
import collections
import json
import re

TEXT = """
The quick brown fox jumps over the lazy dog. Once upon a time, there was a small model that ran on a CPU.
It read its prompt, one token at a time, and wrote the next token, and the next, until it was done.
Large language models run on GPUs: the attention kernel reads the keys and values of every token in the cache,
and the matrix multiplications read every weight once per step. The faster the memory, the faster the model.
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris is the capital.
def main(): print("hello") return 0 if x > 1 else -1 for i in range(10): total += i
"""

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    words = collections.Counter()
    for w in re.findall(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+", TEXT):
        words[tuple(b2u[b] for b in w.encode("utf-8"))] += 1
    merges = []
    while len(vocab) < 500:
        pairs = collections.Counter()
        first = {}
        for w, n in words.items():
            for i in range(len(w) - 1):
                pairs[w[i], w[i + 1]] += n
                first.setdefault((w[i], w[i + 1]), len(first))
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], -first[p]))
        merges.append(list(best))
        vocab[best[0] + best[1]] = len(vocab)
        merged = collections.Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    assert len(vocab) == 500, len(vocab)
    added = [{"id": 500 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIAL)]
    bos = SPECIAL[0]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {bos: {"id": bos, "ids": [500], "tokens": [bos]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{args.out}: {len(vocab)} tokens, {len(merges)} merges, {len(added)} special tokens")


if __name__ == "__main__":
    main()
