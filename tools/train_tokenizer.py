#!/usr/bin/env python
"""Train a GPT-2 byte-level BPE tokenizer.

    python tools/train_tokenizer.py --input a.txt b.jsonl --vocab-size 8192 --output-dir DIR

Inputs are plain text files (one document each) or JSONL files (the --json-key field of each
line, default "text"). Writes DIR/vocab.json, DIR/merges.txt and DIR/tokenizer.json; the special
token <|endoftext|> is added (GPT-2's eos/bos/unk/end-of-document token).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from libai.tokenizer import iter_texts, train_bpe_tokenizer  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="text or .jsonl files")
    p.add_argument("--json-key", default="text", help="field of each JSONL line holding the text")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--special-tokens", nargs="*", default=["<|endoftext|>"])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    paths = train_bpe_tokenizer(iter_texts(args.input, args.json_key), args.vocab_size, args.output_dir,
                                min_frequency=args.min_frequency, special_tokens=args.special_tokens,
                                show_progress=not args.quiet)
    for k, v in paths.items():
        print(f"{k}: {v}")
    return paths


if __name__ == "__main__":
    main()
