#!/usr/bin/env python3
"""Tokenizer fixtures for kb-nano's CPU tests, from the vocabularies llama.cpp ships.

llama.cpp keeps, next to each vocabulary-only GGUF (models/ggml-vocab-NAME.gguf), a test corpus (.gguf.inp:
multilingual text, emoji, whitespace runs, digits, code-like text) and the token ids Hugging Face's AutoTokenizer
gave for it (.gguf.out, written by llama.cpp's convert_hf_to_gguf_update.py with add_special_tokens=False). Those
ids are the truth here: an implementation nobody here wrote.

This script turns one such GGUF into a Hugging Face tokenizer.json of that family's layout (the pre-tokenizer
regex, normalizer and BPE options of the published tokenizer.json), pruned to what the corpus can reach, and copies
the corpus and ids beside it. Pruning keeps every token and merge whose text is a substring of some test text
(after the family's normalisation and byte mapping), all byte tokens and all special tokens, with their original
ids and merge order. It cannot change any encoding of the corpus: a BPE merge joins two adjacent symbols of one
word, so its result is a substring of the text; merges never adjacent never fire, and their relative order is kept.

Families (the GGUF's tokenizer.ggml.pre, else its tokenizer.ggml.model):
  llama-bpe  Llama-3 byte-level BPE (digits in runs of up to 3, ignore_merges)
  qwen2      Qwen2/Qwen3 byte-level BPE (single digits, NFC normaliser)
  llama-spm  Llama-2 SentencePiece BPE (prepend and replace by U+2581, byte fallback), its merges rebuilt from the
             piece scores as transformers' SentencePieceExtractor does
  gemma4     Gemma's SentencePiece-style BPE (spaces replaced by U+2581 with no prefix, no pre-tokenizer: BPE over
             the whole text, byte fallback), merges as the GGUF lists them

Usage: tools/tokenizer_fixture.py --gguf <llama.cpp>/models/ggml-vocab-llama-bpe.gguf \
           --out tests/fixtures/tokenizers/llama-bpe [--provenance build-llamacpp/llama.cpp-src.json]
(<llama.cpp>: the source tools/llama_cpp_fetch.sh unpacks from node-llama-cpp's bundle; its pruned tarball keeps only
the llama-bpe vocabulary, so clone the bundle itself for the others.)
Pure Python 3 (no numpy, no gguf-py): the GGUF key/value header is read with struct.
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import unicodedata

SEPARATOR = "\n__ggml_vocab_test__\n"

# ---- GGUF key/value reader (spec: ggml/docs/gguf.md) ----
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_kv(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        sys.exit(f"tokenizer_fixture: '{path}' is not a GGUF file (magic {data[:4]!r})")
    version, _tensors, kv_count = struct.unpack_from("<IQQ", data, 4)
    if version < 2:
        sys.exit(f"tokenizer_fixture: '{path}': GGUF version {version} is not supported (expected 2 or 3)")
    pos = 24

    def string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        s = data[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        nonlocal pos
        if t == 8:
            return string()
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if et in _SCALARS:
                fmt = _SCALARS[et]
                size = struct.calcsize(fmt)
                out = [v[0] for v in struct.iter_unpack(fmt, data[pos:pos + size * n])]
                pos += size * n
                return out
            return [value(et) for _ in range(n)]
        fmt = _SCALARS[t]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    kv = {}
    for _ in range(kv_count):
        key = string()
        (t,) = struct.unpack_from("<I", data, pos)
        pos += 4
        kv[key] = value(t)
    return kv


# ---- GPT-2's byte <-> printable character map ----
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


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, TOKEN_TYPE_BYTE = 3, 4, 6


class Everything:
    """Stands for the set of all substrings when nothing is pruned (--full)."""

    def __contains__(self, _):
        return True


FULL = False


def substrings_of(texts, max_len):
    if FULL:
        return Everything()
    subs = set()
    for t in texts:
        for i in range(len(t)):
            for j in range(i + 1, min(len(t), i + max_len) + 1):
                subs.add(t[i:j])
    return subs


def added_token(tid, content):
    return {"id": tid, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def bos_template(kv, tokens):
    """The TemplateProcessing post-processor of a family whose encode(add_special_tokens=True) puts BOS first."""
    bos = kv["tokenizer.ggml.bos_token_id"]
    name = tokens[bos]
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": name, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {name: {"id": name, "ids": [bos], "tokens": [name]}}}


def byte_level(kv, family, texts):
    tokens = kv["tokenizer.ggml.tokens"]
    types = kv.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = kv["tokenizer.ggml.merges"]
    b2u = bytes_to_unicode()
    norm = (lambda s: unicodedata.normalize("NFC", s)) if family == "qwen2" else (lambda s: s)
    mapped = ["".join(b2u[b] for b in norm(t).encode("utf-8")) for t in texts]
    longest = max(len(t) for t in tokens)
    subs = substrings_of(mapped, longest)
    byte_chars = set(b2u.values())
    vocab, added = {}, []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):
            added.append(added_token(i, t))
            vocab[t] = i
        elif t in subs or t in byte_chars:
            vocab[t] = i
    kept = []
    for m in merges:
        a, b = m.split(" ")
        if a + b in subs:
            kept.append([a, b])
    regex = LLAMA3_REGEX if family == "llama-bpe" else QWEN2_REGEX
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if family == "qwen2" else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            bos_template(kv, tokens)]} if family == "llama-bpe" else
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": family == "llama-bpe", "vocab": vocab, "merges": kept},
    }, len(tokens), len(merges)


def spm(kv, texts):
    tokens = kv["tokenizer.ggml.tokens"]
    scores = kv["tokenizer.ggml.scores"]
    types = kv["tokenizer.ggml.token_type"]
    full = {t: i for i, t in enumerate(tokens)}
    normalized = ["\u2581" + t.replace(" ", "\u2581") for t in texts]
    subs = substrings_of(normalized, max(len(t) for t in tokens))
    # transformers' SentencePieceExtractor: for each piece (in id order), its splits into two pieces both in the
    # vocabulary, ordered by the ids of the halves; then all of them stably sorted by the piece's score, highest first.
    merges = []
    for piece, score in zip(tokens, scores):
        if piece not in subs:
            continue
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in full and piece[k:] in full]
        local.sort(key=lambda m: (full[m[0]], full[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2], reverse=True)
    vocab, added = {}, []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (2, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):  # 2: unknown
            vocab[t] = i
            added.append(added_token(i, t))
        elif ty == TOKEN_TYPE_BYTE or t in subs:
            vocab[t] = i
    unk = next(t for t, ty in zip(tokens, types) if ty == 2)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": bos_template(kv, tokens),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b, _ in merges]},
    }, len(tokens), None


def gemma(kv, texts):
    tokens = kv["tokenizer.ggml.tokens"]
    types = kv["tokenizer.ggml.token_type"]
    merges = kv["tokenizer.ggml.merges"]
    normalized = [t.replace(" ", "\u2581") for t in texts]
    subs = substrings_of(normalized, max(len(t) for t in tokens))
    vocab, added = {}, []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):
            vocab[t] = i
            tok = added_token(i, t)
            tok["special"] = ty == TOKEN_TYPE_CONTROL
            added.append(tok)
        elif ty == TOKEN_TYPE_BYTE or t in subs:
            vocab[t] = i
    kept = []
    for m in merges:
        a, b = m.split(" ")
        if a + b in subs:
            kept.append([a, b])
    unk = tokens[kv["tokenizer.ggml.unknown_token_id"]]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "post_processor": bos_template(kv, tokens),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": kept},
    }, len(tokens), len(merges)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="models/ggml-vocab-NAME.gguf of the llama.cpp source")
    ap.add_argument("--out", required=True, help="fixture folder to write")
    ap.add_argument("--provenance", help="llama.cpp-src.json of tools/llama_cpp_fetch.sh (package, tag, commit)")
    ap.add_argument("--full", action="store_true",
                    help="keep the whole vocabulary and every merge (a usable tokenizer.json for the family's models, "
                         "e.g. Llama-3-8B with random weights on the GPU machine); writes tokenizer.json only")
    ap.add_argument("--extra", help="more texts (same separator as .inp) the pruned tokenizer must encode exactly: "
                    "tests/fixtures/tokenizers/extra.inp, whose truth tools/tokenizer_hf_truth.py writes")
    args = ap.parse_args()
    global FULL
    FULL = args.full
    for suffix in ("", ".inp", ".out"):
        if not os.path.isfile(args.gguf + suffix):
            sys.exit(f"tokenizer_fixture: '{args.gguf + suffix}' is missing")
    kv = read_gguf_kv(args.gguf)
    with open(args.gguf + ".inp", encoding="utf-8", newline="") as f:
        texts = f.read().split(SEPARATOR)
    if texts and texts[-1] == "":
        texts.pop()
    extra = []
    if args.extra:
        with open(args.extra, encoding="utf-8", newline="") as f:
            extra = [t for t in f.read().split(SEPARATOR) if t]
    corpus, texts = texts, texts + extra
    family = kv.get("tokenizer.ggml.pre") or kv.get("tokenizer.ggml.model")
    model = kv.get("tokenizer.ggml.model")
    if model == "gpt2" and family in ("llama-bpe", "qwen2"):
        tok, n_tokens, n_merges = byte_level(kv, family, texts)
    elif model == "llama" and family in ("llama", "default", None):
        family = "llama-spm"
        tok, n_tokens, n_merges = spm(kv, texts)
    elif model == "gemma4":
        family = "gemma4"
        tok, n_tokens, n_merges = gemma(kv, texts)
    else:
        sys.exit(f"tokenizer_fixture: family '{family}' (model '{model}') is not one this script writes "
                 "(expected llama-bpe, qwen2, gemma4 or a SentencePiece 'llama' vocabulary)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    if FULL:
        print(f"{args.out}/tokenizer.json: {family}, {len(tok['model']['vocab'])} tokens, "
              f"{len(tok['model']['merges'])} merges (not pruned)")
        return
    shutil.copyfile(args.gguf + ".inp", os.path.join(args.out, "tests.inp"))
    shutil.copyfile(args.gguf + ".out", os.path.join(args.out, "tests.out"))
    with open(args.gguf, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    source = {
        "family": family,
        "gguf": os.path.basename(args.gguf),
        "gguf_sha256": sha,
        "truth": "tests.out: Hugging Face AutoTokenizer(...).encode(text, add_special_tokens=False), one line per "
                 "test of tests.inp, as written by llama.cpp's convert_hf_to_gguf_update.py",
        "tokens": {"full": n_tokens, "kept": len(tok["model"]["vocab"])},
        "merges": {"full": n_merges, "kept": len(tok["model"]["merges"])},
        "tests": len(corpus),
        "command": "tools/tokenizer_fixture.py --gguf <llama.cpp>/models/" + os.path.basename(args.gguf) +
                   " --out " + args.out,
    }
    if args.extra:
        with open(args.extra, "rb") as f:
            source["extra"] = {"file": os.path.basename(args.extra), "texts": len(extra),
                               "sha256": hashlib.sha256(f.read()).hexdigest()}
        source["command"] += " --extra " + args.extra
    if args.provenance:
        with open(args.provenance) as f:
            p = json.load(f)
        source["llama_cpp"] = {k: p[k] for k in ("npm_package", "bundle_sha256", "llama_cpp_repo", "tag", "commit",
                                                   "commit_date") if k in p}
    with open(os.path.join(args.out, "SOURCE.json"), "w") as f:
        json.dump(source, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(source))


if __name__ == "__main__":
    main()
