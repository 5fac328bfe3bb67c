"""tools/train_tokenizer.py and tools/preprocess_data.py refuse unreadable input with an error
naming the file, the line and what is wrong (a wrong --json-key, a JSON line that is not an
object, a value that is not a string, bytes that are not UTF-8, a gzipped file), and a failed
preprocess_data.py run leaves no output files behind (nor damages a previous good pair)."""
import gzip
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from data_helpers import ROOT
from libai.data import MMapIndexedDataset


def _tool(name):
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", os.path.join(ROOT, "tools", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TRAIN = _tool("train_tokenizer")
PREPROCESS = _tool("preprocess_data")


def _write_lines(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs), encoding="utf-8")
    return str(path)


def _fails(tool, args):
    """The message a tool exits with (sys.exit(message): status 1, no traceback)."""
    with pytest.raises(SystemExit) as e:
        tool.main(args)
    assert isinstance(e.value.code, str), e.value.code
    return e.value.code


def _train_args(inp, out, *more):
    return ["--input", inp, "--vocab-size", "300", "--output-dir", str(out), "--quiet", *more]


@pytest.fixture
def prep_args(tiny_tokenizer_dir, tmp_path):
    def args(inp, *more, prefix=None):
        return ["--input", *([inp] if isinstance(inp, str) else inp), "--tokenizer-file",
                str(tiny_tokenizer_dir / "tokenizer.json"), "--output-prefix", prefix or str(tmp_path / "out" / "p"),
                "--no-progress", *more]
    return args


# ---------------------------------------------------------------- 1. a wrong --json-key, non-objects
def test_train_tokenizer_wrong_json_key_is_an_error_not_a_small_vocabulary(tmp_path):
    inp = _write_lines(tmp_path / "b.jsonl", [{"content": f"some text number {i}", "id": i} for i in range(50)])
    out = tmp_path / "tok"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_tokenizer.py"),
                           *_train_args(inp, out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert f"{inp}:1: JSON line has no key 'text' (keys: ['content', 'id'])" in proc.stderr
    assert "--json-key" in proc.stderr and "Traceback" not in proc.stderr and "small corpus" not in proc.stderr
    assert not out.exists()  # nothing written, not even the directory


def test_train_tokenizer_names_the_first_line_without_the_key(tmp_path):
    from libai.tokenizer import iter_texts

    inp = _write_lines(tmp_path / "b.jsonl", [{"text": "a"}, {"text": "b"}, {"body": "c"}])
    assert "b.jsonl:3: JSON line has no key 'text' (keys: ['body'])" in _fails(TRAIN, _train_args(inp, tmp_path / "t"))
    with pytest.raises(KeyError, match=r"b\.jsonl:3: JSON line has no key 'text'"):  # a KeyError, as before
        list(iter_texts([inp]))
    with pytest.raises(KeyError, match=r"b\.jsonl:1: JSON line has no key 'body' \(keys: \['text'\]\)"):
        list(iter_texts([inp], "body"))


@pytest.mark.parametrize("line", ['["text"]', '"just a string"', "5"])
def test_a_json_line_that_is_not_an_object(tmp_path, prep_args, line):
    inp = tmp_path / "b.jsonl"
    inp.write_text(json.dumps({"text": "fine"}) + "\n" + line + "\n", encoding="utf-8")
    for msg in (_fails(TRAIN, _train_args(str(inp), tmp_path / "t")), _fails(PREPROCESS, prep_args(str(inp)))):
        assert f"{inp}:2: a JSON line must be an object" in msg and "'text'" in msg, msg
        assert "AttributeError" not in msg


# ------------------------------------------------------------------ 2. values that are not strings
@pytest.mark.parametrize("value, kind", [(5, "a number (5)"), (None, "null"), (["a"], "an array"),
                                         (True, "a boolean (true)"), ({"a": "b"}, "an object")])
def test_a_value_that_is_not_a_string(tmp_path, prep_args, value, kind):
    inp = _write_lines(tmp_path / "b.jsonl", [{"text": "fine"}, {"text": "fine too"}, {"text": value}])
    for msg in (_fails(TRAIN, _train_args(inp, tmp_path / "t")), _fails(PREPROCESS, prep_args(inp))):
        assert f"{inp}:3: key 'text' holds {kind}, not a string" in msg, msg


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_json_key_holding_an_int(tmp_path, prep_args, workers):
    inp = _write_lines(tmp_path / "b.jsonl", [{"content": f"text {i}", "id": i} for i in range(40)])
    msg = _fails(PREPROCESS, prep_args(inp, "--json-keys", "content", "id", "--workers", str(workers),
                                       "--chunk-size", "3"))
    assert f"{inp}:1: key 'id' holds a number (0), not a string" in msg
    assert "TextInputSequence" not in msg


# ------------------------------------------------------------------- 3. not UTF-8, gzipped input
@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
@pytest.mark.parametrize("workers", [1, 2])
def test_latin1_input_names_the_file_line_and_offset(tmp_path, prep_args, suffix, workers):
    inp = tmp_path / f"latin1{suffix}"
    first = json.dumps({"text": "plain ascii"}) if suffix == ".jsonl" else "plain ascii"
    second = json.dumps({"text": "café"}, ensure_ascii=False) if suffix == ".jsonl" else "café"
    inp.write_bytes((first + "\n" + second + "\n").encode("latin-1"))
    offset = len(first) + 1 + second.index("é")
    msgs = [_fails(PREPROCESS, prep_args(str(inp), "--workers", str(workers)))]
    if workers == 1:  # train_tokenizer reads a .txt whole, and names the line all the same
        msgs.append(_fails(TRAIN, _train_args(str(inp), tmp_path / "t")))
    for msg in msgs:
        assert f"{inp}:2: not UTF-8 text" in msg and f"byte 0xe9 at byte offset {offset}" in msg, msg
        assert "must be UTF-8 text" in msg


@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.txt", "corpus.jsonl.gz"])
def test_a_gzipped_input_is_named_as_such(tmp_path, prep_args, name):
    inp = tmp_path / name
    inp.write_bytes(gzip.compress((json.dumps({"text": "hello world"}) + "\n").encode()))
    for msg in (_fails(TRAIN, _train_args(str(inp), tmp_path / "t")), _fails(PREPROCESS, prep_args(str(inp)))):
        assert f"{inp}: gzip-compressed" in msg and "must be UTF-8 text" in msg and "gunzip" in msg, msg


# --------------------------------------------------------------- 4. a failed run writes no files
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_preprocess_run_leaves_no_files(tmp_path, prep_args, workers):
    inp = _write_lines(tmp_path / "b.jsonl", [{"text": f"document {i}", "title": "t"} for i in range(30)]
                       + [{"title": "no text"}])
    out = tmp_path / "out"
    msg = _fails(PREPROCESS, prep_args(inp, "--json-keys", "text", "title", "--workers", str(workers),
                                       "--chunk-size", "4"))
    assert f"{inp}:31: JSON line has no key 'text'" in msg
    assert sorted(os.listdir(out)) == []
    good = _write_lines(tmp_path / "good.jsonl", [{"text": f"document {i}", "title": "t"} for i in range(30)])
    missing = str(tmp_path / "missing.jsonl")  # an error of another kind (a traceback) cleans up too
    with pytest.raises(FileNotFoundError):
        PREPROCESS.main(prep_args([good, missing], "--json-keys", "text", "title", "--workers", str(workers)))
    assert sorted(os.listdir(out)) == []


def test_a_failed_preprocess_run_keeps_the_previous_pair(tmp_path, prep_args):
    good = _write_lines(tmp_path / "good.jsonl", [{"text": f"document {i}"} for i in range(5)])
    bad = _write_lines(tmp_path / "bad.jsonl", [{"text": "x" * 200}] * 20 + [{"text": 7}])
    prefix = str(tmp_path / "out" / "p")
    PREPROCESS.main(prep_args(good, prefix=prefix))
    files = sorted(os.listdir(tmp_path / "out"))
    assert files == ["p_text_document.bin", "p_text_document.idx"]
    before = {f: (tmp_path / "out" / f).read_bytes() for f in files}
    assert "bad.jsonl:21: key 'text' holds a number (7)" in _fails(PREPROCESS, prep_args(bad, prefix=prefix))
    assert {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")} == before
    assert len(MMapIndexedDataset(prefix + "_text_document")) == 5
    bigger = _write_lines(tmp_path / "bigger.jsonl", [{"text": f"document {i}"} for i in range(9)])
    PREPROCESS.main(prep_args(bigger, prefix=prefix))  # a successful run replaces the pair
    assert sorted(os.listdir(tmp_path / "out")) == files
    assert len(MMapIndexedDataset(prefix + "_text_document")) == 9


def test_preprocess_cli_error_has_no_traceback(tmp_path, tiny_tokenizer_dir):
    inp = _write_lines(tmp_path / "b.jsonl", [{"content": "x"}])
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"), "--input", inp,
                           "--tokenizer-file", str(tiny_tokenizer_dir / "tokenizer.json"), "--output-prefix",
                           str(tmp_path / "o"), "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert f"preprocess_data.py: error: {inp}:1: JSON line has no key 'text' (keys: ['content'])" in proc.stderr
    assert "Traceback" not in proc.stderr and "--json-keys" in proc.stderr
    assert [f for f in os.listdir(tmp_path) if f.startswith("o")] == []
