"""Issue 17: tools/train_tokenizer.py warns when the trained vocabulary is smaller than --vocab-size
(training stops once no pair occurs --min-frequency times: a small corpus), naming both sizes."""
import json
import re
import warnings

import pytest

from data_helpers import run_tool
from libai.tokenizer import train_bpe_tokenizer
from libai.tokenizer.bpe_training import VocabSizeWarning

TEXT = "the cat sat on the mat. the dog sat on the log. a cat and a dog.\n" * 3


def _sizes(stderr):
    m = re.search(r"WARNING: .*requested vocab size (\d+) \(--vocab-size\), "
                  r"but the trained vocabulary has only (\d+) tokens", stderr)
    assert m, stderr
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_tool_warns_with_requested_and_actual_size(tmp_path, kind):
    (tmp_path / "small.txt").write_text(TEXT, encoding="utf-8")
    out = tmp_path / "tok"
    proc = run_tool("tools/train_tokenizer.py", "--input", str(tmp_path / "small.txt"), "--vocab-size", "5000",
                    "--type", kind, "--output-dir", str(out), "--quiet")
    requested, actual = _sizes(proc.stderr)
    if kind == "bpe":
        written = len(json.load(open(out / "vocab.json", encoding="utf-8")))
    else:
        written = len((out / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert requested == 5000 and actual == written < 5000
    assert "min_frequency=2 times (--min-frequency)" in proc.stderr and "small corpus" in proc.stderr
    assert proc.stderr.count("WARNING:") == 1
    assert "tokenizer_file:" in proc.stdout  # the smaller vocabulary is still written


def test_no_warning_when_the_size_is_reached(tmp_path):
    (tmp_path / "small.txt").write_text(TEXT, encoding="utf-8")
    proc = run_tool("tools/train_tokenizer.py", "--input", str(tmp_path / "small.txt"), "--vocab-size", "260",
                    "--min-frequency", "1", "--output-dir", str(tmp_path / "tok"), "--quiet")
    assert "WARNING" not in proc.stderr
    assert len(json.load(open(tmp_path / "tok" / "vocab.json", encoding="utf-8"))) == 260


def test_library_warning(tmp_path):
    with pytest.warns(VocabSizeWarning, match=r"requested vocab size 4000 .* min_frequency=3"):
        train_bpe_tokenizer([TEXT], 4000, str(tmp_path / "a"), min_frequency=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VocabSizeWarning)
        train_bpe_tokenizer([TEXT], 257, str(tmp_path / "b"), min_frequency=1)
