#!/usr/bin/env python
"""Train a GPT-2 byte-level BPE or a BERT WordPiece tokenizer.

    python tools/train_tokenizer.py --input a.txt b.jsonl --vocab-size 8192 --output-dir DIR
    python tools/train_tokenizer.py --type wordpiece --input a.txt --vocab-size 8192 --output-dir DIR

Inputs are plain text files (one document each) or JSONL files (the --json-key field of each
line, default "text"), in UTF-8. A JSONL line that is not an object, lacks the key or holds no
string under it (null included) is an error naming the file and the line, as are a gzipped file
and bytes that are not UTF-8; nothing is written then.

BPE writes DIR/vocab.json, DIR/merges.txt and DIR/tokenizer.json with the special token
<|endoftext|> (GPT-2's eos/bos/unk/end-of-document token). WordPiece writes
DIR/vocab.txt and DIR/tokenizer.json with [PAD] [UNK] [CLS] [SEP] [MASK] first, lower-cased
unless --cased.

The vocabulary can come out smaller than --vocab-size: training stops once no pair of pieces
occurs --min-frequency times (default 2), which a small corpus reaches early. The tool then
prints a warning with the requested and the actual size (and writes the smaller vocabulary).
"""
import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from libai.tokenizer import iter_texts, train_bpe_tokenizer, train_wordpiece_tokenizer  # noqa: E402
from libai.tokenizer.bpe_training import BERT_SPECIAL_TOKENS, InputFileError, VocabSizeWarning  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="text or .jsonl files")
    p.add_argument("--json-key", default="text", help="field of each JSONL line holding the text")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--type", choices=("bpe", "wordpiece"), default="bpe",
                   help="bpe: GPT-2 byte-level BPE (default); wordpiece: BERT WordPiece")
    p.add_argument("--special-tokens", nargs="*", default=None,
                   help="default: <|endoftext|> (bpe); [PAD] [UNK] [CLS] [SEP] [MASK] (wordpiece)")
    p.add_argument("--cased", action="store_true", help="wordpiece: keep case and accents (default: lower-case)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.cased and args.type != "wordpiece":
        p.error("--cased applies to --type wordpiece (BPE is byte-level and keeps case)")
    texts = iter_texts(args.input, args.json_key)
    new_dir = not os.path.exists(args.output_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", VocabSizeWarning)
        try:
            if args.type == "wordpiece":
                paths = train_wordpiece_tokenizer(texts, args.vocab_size, args.output_dir,
                                                  min_frequency=args.min_frequency, lowercase=not args.cased,
                                                  special_tokens=args.special_tokens or BERT_SPECIAL_TOKENS,
                                                  show_progress=not args.quiet)
            else:
                paths = train_bpe_tokenizer(texts, args.vocab_size, args.output_dir,
                                            min_frequency=args.min_frequency,
                                            special_tokens=args.special_tokens or ["<|endoftext|>"],
                                            show_progress=not args.quiet)
        except InputFileError as e:  # names the file, the line and what is wrong; raised before any file is written
            if new_dir and os.path.isdir(args.output_dir) and not os.listdir(args.output_dir):
                os.rmdir(args.output_dir)
            sys.exit(f"train_tokenizer.py: error: {e}")
    for w in caught:
        if issubclass(w.category, VocabSizeWarning):
            print(f"WARNING: {w.message}", file=sys.stderr, flush=True)
        else:  # any other warning as Python would show it
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    for k, v in paths.items():
        print(f"{k}: {v}")
    return paths


if __name__ == "__main__":
    main()
