"""Helpers shared by the data tests (a module of its own: tests/models has a conftest too)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY_TEXT = """The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs!
Tokenizers split text into tokens, and tokens into ids. Numbers: 1234 5678, 3.14159.
    Indented code: def f(x): return x ** 2  # comment
Unicode: café naïve résumé, 日本語のテキスト, emoji 😀🎉, Ελληνικά, русский текст.
"""


def run_tool(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def oracle(tok_dir, tmp_path):
    """transformers' GPT2TokenizerFast on the same vocab.json + merges.txt (test-only oracle)."""
    import shutil

    from transformers import GPT2TokenizerFast

    d = tmp_path / "oracle"
    d.mkdir(exist_ok=True)
    shutil.copy(os.path.join(tok_dir, "vocab.json"), d / "vocab.json")
    shutil.copy(os.path.join(tok_dir, "merges.txt"), d / "merges.txt")
    return GPT2TokenizerFast.from_pretrained(str(d))


def write_indexed(prefix, docs, dtype="uint16"):
    """PREFIX.bin / PREFIX.idx holding `docs` (lists of token ids), one sequence per document."""
    import numpy as np

    from libai.data import indexed_dataset as ix

    b = ix.MMapIndexedDatasetBuilder(ix.data_file_path(str(prefix)), dtype=dtype)
    for d in docs:
        b.add_item(np.asarray(d))
        b.end_document()
    b.finalize(ix.index_file_path(str(prefix)))
    return str(prefix)
