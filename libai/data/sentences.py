"""Splitting a document into sentences, for BERT's sentence-level datasets
(`tools/preprocess_data.py --split-sentences`).

Megatron uses NLTK's trained Punkt model, which is a download; this is a rule-based splitter
with the same contract and no data files: paragraphs (blank lines) always end a sentence; inside
a paragraph a sentence ends after `.`, `!` or `?` (and any closing quotes or brackets) followed by
whitespace and then a character that can start a sentence (a capital, a digit, an opening quote
or bracket), unless the word before the period is a known abbreviation (`Mr.`, `e.g.`, ...), a
single capital (an initial: `J. S. Bach`) or the period belongs to a number. Whitespace inside a
sentence is kept as it is (with `keep_newlines`) or collapsed to single spaces.
"""
import re

__all__ = ["split_sentences", "ABBREVIATIONS"]

ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st vs etc e.g i.e cf al fig figs no nos vol vols ed eds pp p approx
inc ltd co corp dept est jan feb mar apr jun jul aug sep sept oct nov dec mt ft
""".split())

_PARAGRAPH = re.compile(r"\n\s*\n")
# a sentence end: terminal punctuation, closing quotes/brackets, whitespace, a plausible start
_BOUNDARY = re.compile(r"[.!?]+[\"'\u2019\u201d)\]]*(\s+)(?=[\"'\u2018\u201c(\[]*[A-Z0-9\u00c0-\u024f])")
_WORD_BEFORE = re.compile(r"(\S+)$")


def _is_abbreviation(text_before_period):
    match = _WORD_BEFORE.search(text_before_period)
    if match is None:
        return False
    word = match.group(1).lstrip("\"'(\u2018\u201c[").lower()
    if word.rstrip(".") in ABBREVIATIONS or word in ABBREVIATIONS:
        return True
    return len(word) == 1 and word.isalpha()  # an initial: "J. S. Bach"


def _split_paragraph(paragraph):
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(paragraph):
        end = match.start(1)
        punct = match.group(0).rstrip()
        if punct.startswith(".") and not punct.startswith("..") and _is_abbreviation(paragraph[start:match.start()]):
            continue
        sentences.append(paragraph[start:end])
        start = match.end(1)
    sentences.append(paragraph[start:])
    return sentences


def split_sentences(text, keep_newlines=False):
    """The sentences of `text`, in order, stripped, empty ones dropped. With `keep_newlines` a
    sentence keeps its inner line breaks; otherwise every run of whitespace becomes one space."""
    out = []
    for paragraph in _PARAGRAPH.split(text):
        for sentence in _split_paragraph(paragraph):
            sentence = sentence.strip()
            if not keep_newlines:
                sentence = " ".join(sentence.split())
            if sentence:
                out.append(sentence)
    return out
