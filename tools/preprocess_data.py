#!/usr/bin/env python
"""Tokenize a JSONL or plain-text corpus into Megatron mmap indexed datasets.

    python tools/preprocess_data.py --input data.jsonl --json-keys text \\
        --tokenizer-name GPT2Tokenizer --vocab-file vocab.json --merge-file merges.txt \\
        --output-prefix out/my-gpt2 --append-eod --workers 4 --dataset-impl mmap

writes out/my-gpt2_text_document.bin/.idx (one sequence per JSONL line; `--append-eod` appends
<|endoftext|> to each). Give --data-prefix out/my-gpt2_text_document to the GPT2Dataset.

BERT's sentence-level layout (one sequence per sentence, grouped into documents):

    python tools/preprocess_data.py --input data.jsonl --split-sentences \\
        --tokenizer-name BertWordPieceLowerCase --vocab-file vocab.txt --output-prefix out/my-bert

writes out/my-bert_text_sentence.bin/.idx.

Plain text: an --input ending in .txt is read as text, not JSON: each non-blank line is one
document (blank lines are skipped, so paragraphs must each be on one line), or, with
--txt-document-per-file, each whole .txt file is one document (its line breaks kept). Its
documents are written under the one --json-keys name (default text: PREFIX_text_document):

    python tools/preprocess_data.py --input books/*.txt --txt-document-per-file \\
        --tokenizer-file tokenizer.json --output-prefix out/books --append-eod

Inputs must be UTF-8 text (not gzipped); a JSON line must be an object holding a string under
each --json-keys name (null is refused, as a number is). Such an error names the file and the
line, and the run then writes nothing: the output is renamed into place only at the end, so a
previous PREFIX_..._document.bin/.idx pair stays as it was.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("input data")
    g.add_argument("--input", nargs="+", required=True,
                   help="JSONL file(s), one document per line; a file ending in .txt is plain text: one "
                        "document per non-blank line (or per file with --txt-document-per-file)")
    g.add_argument("--json-keys", nargs="+", default=["text"],
                   help="keys to extract from each JSON line; with .txt inputs, the one key naming the output")
    g.add_argument("--txt-document-per-file", action="store_true",
                   help="each .txt input is one document (line breaks kept) instead of one per line")
    g.add_argument("--split-sentences", action="store_true",
                   help="one sequence per sentence, grouped by document (BERT; libai.data.sentences)")
    g.add_argument("--keep-newlines", action="store_true",
                   help="with --split-sentences: keep line breaks inside sentences (else collapsed to spaces)")
    g = p.add_argument_group("tokenizer")
    g.add_argument("--tokenizer-name", default="GPT2Tokenizer",
                   choices=["GPT2Tokenizer", "GPT2BPETokenizer", "BertTokenizer", "BertWordPieceLowerCase",
                            "BertWordPieceCase"])
    g.add_argument("--vocab-file", default=None)
    g.add_argument("--merge-file", default=None)
    g.add_argument("--tokenizer-file", default=None, help="a tokenizer.json instead of vocab/merges")
    g.add_argument("--do-lower-case", action="store_true")
    g.add_argument("--append-eod", action="store_true",
                   help="append the end-of-document token (<|endoftext|>; [SEP] for BERT) to each document")
    g = p.add_argument_group("output data")
    g.add_argument("--output-prefix", required=True)
    g.add_argument("--dataset-impl", default="mmap", choices=["mmap"])
    g = p.add_argument_group("runtime")
    g.add_argument("--workers", type=int, default=1)
    g.add_argument("--chunk-size", type=int, default=25, help="lines per task sent to a worker")
    g.add_argument("--log-interval", type=int, default=0, help="print throughput every N documents")
    g.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.keep_newlines and not args.split_sentences:
        p.error("--keep-newlines applies to --split-sentences (a document keeps its newlines anyway)")
    from libai.data.preprocess import check_inputs

    try:
        check_inputs(args.input, args.json_keys, args.txt_document_per_file)
    except ValueError as e:
        p.error(str(e))
    bert = args.tokenizer_name.startswith("Bert")
    if args.tokenizer_file is None and (args.vocab_file is None or (args.merge_file is None and not bert)):
        p.error("give --vocab-file (and --merge-file for GPT-2), or --tokenizer-file")
    return args


def main(argv=None):
    args = get_args(argv)
    from libai.data.preprocess import preprocess_jsonl
    from libai.tokenizer.bpe_training import InputFileError

    start = time.time()
    try:
        prefixes = preprocess_jsonl(
            args.input, args.output_prefix,
            tokenizer_args=dict(tokenizer_name=args.tokenizer_name, vocab_file=args.vocab_file,
                                merge_file=args.merge_file, tokenizer_file=args.tokenizer_file,
                                do_lower_case=args.do_lower_case),
            json_keys=args.json_keys, append_eod=args.append_eod, workers=args.workers,
            chunk_size=args.chunk_size, dataset_impl=args.dataset_impl, show_progress=not args.no_progress,
            log_interval=args.log_interval or None, split_sentences=args.split_sentences,
            keep_newlines=args.keep_newlines, txt_document_per_file=args.txt_document_per_file)
    except InputFileError as e:  # names the file, the line and what is wrong; no output was written
        sys.exit(f"preprocess_data.py: error: {e}")
    for key, prefix in prefixes.items():
        print(f"{key}: {prefix}.bin / {prefix}.idx")
    print(f"done in {time.time() - start:.2f}s")
    return prefixes


if __name__ == "__main__":
    main()
