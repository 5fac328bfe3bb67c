"""Every code block of README.md, docs/*.md and projects/*/README.md runs as written (issue 17).

Each document's ```python and ```bash blocks run in order in a fresh directory
(tests/docs/doc_runner.py): training commands with a couple of iterations, commands that cannot
run on the CI machine listed with their reason (tests/docs/doc_commands.py). A doc snippet that
breaks fails CI. The static checks below keep the machinery honest: no command hides in an
untagged block, no NOT_RUN entry is stale, no annotation is malformed."""
import glob
import os
import re
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests", "distributed")]

import doc_commands  # noqa: E402
from doc_runner import parse, shell_commands  # noqa: E402
from mpi_helper import mpi_env, run_command  # noqa: E402

DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))) + \
    sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "projects", "*", "README.md")))
RUNNABLE = [d for d in DOCS if any(b.lang in ("python", "bash") and b.note("skip") is None and not b.note("same-as")
                                   for b in parse(d))]
LINKED = ("tools", "projects", "tests")  # configs/ is copied: a doc may add a file to it


def _workdir(tmp_path):
    for name in LINKED:
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    shutil.copytree(os.path.join(ROOT, "configs"), tmp_path / "configs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize("doc", RUNNABLE)
def test_doc_runs(doc, tmp_path):
    work = _workdir(tmp_path)
    env = mpi_env(PYTHONHASHSEED="0")
    rc, out, err = run_command([sys.executable, os.path.join(HERE, "doc_runner.py"), doc, str(work)],
                               timeout=900, env=env, check=False)
    assert rc == 0, f"{doc}: a block failed\n--- stdout\n{out[-12000:]}\n--- stderr\n{err[-12000:]}"
    assert "=== all blocks ran" in out


def test_every_block_is_tagged_and_annotated_correctly():
    """A block with commands is a ```bash block (so it runs), a code block is fenced (an
    indented one would escape the test), and every annotation parses."""
    for doc in DOCS:
        blocks = parse(doc)  # raises on a malformed annotation or an unclosed fence
        for b in blocks:
            if b.lang == "":
                assert not re.search(r"^\s*(python|bash|mpiexec|pip) ", b.code, re.M), \
                    f"{b.where}: an untagged block with a command; tag it ```bash"
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        outside = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
        hidden = re.findall(r"^(?: {4}|\t)+(?:python|pip) .*$", outside, re.M)
        assert not hidden, f"{doc}: an indented (unfenced) command escapes the doc test: {hidden[0]!r}"


def test_not_run_list_is_current_and_every_command_is_accounted_for():
    used = set()
    for doc in DOCS:
        for b in parse(doc):
            if b.lang != "bash":
                continue
            for cmd in shell_commands(b.code):
                for pattern in doc_commands.NOT_RUN:
                    if re.search(pattern, cmd):
                        used.add(pattern)
    stale = set(doc_commands.NOT_RUN) - used
    assert not stale, f"NOT_RUN entries that match no documented command: {sorted(stale)}"


def test_shell_command_parsing():
    cmds = shell_commands('CFG=a.py\npython x.py --a 1 \\\n    k=v  # note\n# only a comment\n'
                          'pip install -e . && python t.py "#not a comment"\n')
    assert cmds == ["CFG=a.py", "python x.py --a 1      k=v", "pip install -e .", 'python t.py "#not a comment"']
    assert doc_commands.shorten("python tools/train_net.py --config-file c.py --resume", "x.md").endswith(
        "--resume " + " ".join(doc_commands.SHORT_TRAIN))
    assert doc_commands.not_run_reason("python -m pip install -e .") is not None
    assert doc_commands.not_run_reason("python tools/train_net.py --config-file c.py") is None


def test_readme_lists_every_doc():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = readme[readme.index("## Documentation"):]
    missing = [d for d in DOCS if d.startswith("docs/") and f"`{d}`" not in section]
    assert not missing, f"docs missing from the README's Documentation list: {missing}"


def test_same_as_blocks_are_run_elsewhere():
    """A block marked `same-as DOC...` is skipped only because each of its commands is run,
    verbatim, by a block of one of those documents that the doc test does run."""
    for doc in DOCS:
        for b in parse(doc):
            if not b.note("same-as"):
                continue
            run_elsewhere = {cmd for other in b.note("same-as").split() for ob in parse(other)
                             if ob.lang == "bash" and ob.note("skip") is None and not ob.note("same-as")
                             for cmd in shell_commands(ob.code)}
            for cmd in shell_commands(b.code):
                assert cmd in run_elsewhere, f"{b.where}: {cmd!r} is not run by {b.note('same-as')}"
