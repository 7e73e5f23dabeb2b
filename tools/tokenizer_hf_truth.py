#!/usr/bin/env python3
"""Hugging Face truth for the tokenizer fixtures (run on the GPU machine, where `tokenizers` and transformers live).

For each fixture folder (tests/fixtures/tokenizers/FAMILY, written by tools/tokenizer_fixture.py):
  1. The pruned tokenizer.json, loaded by Hugging Face `tokenizers`, must give llama.cpp's committed ids (tests.out,
     HF AutoTokenizer's encodings with the published tokenizer) for the whole corpus: this checks the layout the
     fixture script wrote against the published one.
  2. The full vocabulary, turned into a tokenizer by transformers' GGUF integration (AutoTokenizer.from_pretrained
     with gguf_file=, given the gguf-py package of the same llama.cpp source), is the truth for the extra corpus
     (special tokens in text, code, whitespace runs, scripts, emoji): encode with and without special tokens, and
     decode with and without skipping them. Where transformers cannot convert a family's GGUF, the pruned
     tokenizer.json under `tokenizers` gives the truth instead, and hf_truth.json says so.
Writes FAMILY/hf_truth.json; exits non-zero when step 1 fails. Where the two tokenizers of step 2 disagree it prints
the first texts: measured on transformers 5.17, its GGUF conversion matches the pruned files for qwen2 (all texts)
and llama-spm (all, except that it adds no BOS), and not for llama-bpe (no BOS, and other ids for 12 of 23 texts,
e.g. "\n\n" as two tokens where the published Llama-3 tokenizer, and tests.out, have one): it is not the published
tokenizer there, so the pruned file under `tokenizers`, whose layout tests.out ties to the published one, stays
the truth.

Usage: tools/tokenizer_hf_truth.py --fixtures tests/fixtures/tokenizers --gguf-dir <llama.cpp>/models \
           [--gguf-py <llama.cpp>/gguf-py]
"""
import argparse
import json
import os
import sys
import tempfile

SEPARATOR = "\n__ggml_vocab_test__\n"
GGUF_OF = {"llama-bpe": "ggml-vocab-llama-bpe.gguf", "qwen2": "ggml-vocab-qwen2.gguf",
           "llama-spm": "ggml-vocab-llama-spm.gguf", "gemma4": "ggml-vocab-gemma-4.gguf"}


def read_texts(path):
    with open(path, encoding="utf-8", newline="") as f:
        texts = f.read().split(SEPARATOR)
    if texts and texts[-1] == "":
        texts.pop()
    return texts


def make_gguf_importable(gguf_py):
    """gguf-py as an installed distribution: its source on sys.path and a dist-info so importlib.metadata (which
    transformers asks) sees its version."""
    sys.path.insert(0, gguf_py)
    version = "0"
    with open(os.path.join(gguf_py, "pyproject.toml")) as f:
        for line in f:
            if line.startswith("version"):
                version = line.split("=")[1].strip().strip("'\"")
                break
    meta = tempfile.mkdtemp(prefix="gguf-meta-")
    info = os.path.join(meta, f"gguf-{version}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: gguf\nVersion: {version}\n")
    sys.path.insert(0, meta)
    return version


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--gguf-dir", required=True, help="the llama.cpp source's models/ folder")
    ap.add_argument("--gguf-py", help="the llama.cpp source's gguf-py/ folder (for transformers' GGUF integration)")
    args = ap.parse_args()
    import tokenizers
    import transformers
    gguf_version = make_gguf_importable(args.gguf_py) if args.gguf_py else None
    extra = read_texts(os.path.join(args.fixtures, "extra.inp"))
    failed = []
    for family, gguf in GGUF_OF.items():
        folder = os.path.join(args.fixtures, family)
        pruned = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        corpus = read_texts(os.path.join(folder, "tests.inp"))
        with open(os.path.join(folder, "tests.out")) as f:
            want = [[int(x) for x in line.split()] for line in f.read().split("\n")[:len(corpus)]]
        got = [pruned.encode(t, add_special_tokens=False).ids for t in corpus]
        corpus_bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
        full, why = None, None
        try:
            full = transformers.AutoTokenizer.from_pretrained(args.gguf_dir, gguf_file=gguf)
        except Exception as e:  # a family transformers' GGUF integration does not convert
            why = f"{type(e).__name__}: {e}"[:400]
        rows = []
        disagree = []
        for i, text in enumerate(extra):
            ids = pruned.encode(text, add_special_tokens=False).ids
            ids_special = pruned.encode(text, add_special_tokens=True).ids
            row = {"text": text, "ids": ids, "ids_special": ids_special,
                   "decode": pruned.decode(ids_special, skip_special_tokens=False),
                   "decode_skip": pruned.decode(ids_special, skip_special_tokens=True)}
            if full is not None:
                f_ids = full.encode(text, add_special_tokens=False)
                f_special = full.encode(text, add_special_tokens=True)
                if f_ids != ids or f_special != ids_special:
                    disagree.append(i)
                row["full_ids"], row["full_ids_special"] = f_ids, f_special
            rows.append(row)
        out = {
            "family": family,
            "tokenizers_version": tokenizers.__version__,
            "transformers_version": transformers.__version__,
            "gguf_py_version": gguf_version,
            "corpus_matches_tests_out": not corpus_bad, "corpus_mismatches": corpus_bad,
            "full_tokenizer": "transformers AutoTokenizer.from_pretrained(gguf_file=%s)" % gguf if full is not None
            else None,
            "full_tokenizer_unavailable": why,
            "full_disagrees_on": disagree,
            "truth": "ids/ids_special/decode/decode_skip: Hugging Face tokenizers " + tokenizers.__version__ +
                     " on this folder's tokenizer.json" + ("; full_ids*: the full vocabulary converted by "
                                                           "transformers, which must equal them" if full else ""),
            "command": "tools/tokenizer_hf_truth.py --fixtures %s --gguf-dir <llama.cpp>/models --gguf-py "
                       "<llama.cpp>/gguf-py" % args.fixtures,
            "texts": rows,
        }
        with open(os.path.join(folder, "hf_truth.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        for i in disagree[:4]:
            r = rows[i]
            print(f"  {family} extra text {i} {r['text'][:60]!r}: pruned {r['ids_special'][:24]} full "
                  f"{r['full_ids_special'][:24]}")
        print(f"{family}: corpus {len(corpus) - len(corpus_bad)}/{len(corpus)} match tests.out; full tokenizer "
              f"{'converted' if full is not None else 'unavailable (' + str(why)[:160] + ')'}; "
              f"extra texts where full and pruned disagree: {disagree}")
        if corpus_bad:
            failed.append(family)
    if failed:
        sys.exit(f"tokenizer_hf_truth: failed for {failed}")


if __name__ == "__main__":
    main()
