"""Run the code of one Markdown document the way a reader would, in a fresh working directory.

    python tests/docs/doc_runner.py DOC WORKDIR

The steps are the document's fenced ```python and ```bash blocks, in order, in WORKDIR (which
holds links to the repository's tools/, projects/, tests/ and a copy of configs/, so relative
paths in the docs resolve as in a checkout):

* a ```python block runs in one namespace shared by the document's python blocks (later blocks
  build on earlier ones, as the reader's session would);
* a ```bash block runs as one `bash -e` script (variables set in it carry to its later lines).
  Each command in it is first matched against `doc_commands.NOT_RUN` (commands that cannot run here,
  each with its reason) and dropped if listed; a `tools/train_net.py` or `tools/generate.py`
  command gets `doc_commands.SHORT` appended (a few iterations, a few tokens); the document's
  `doc_commands.REWRITE` pairs are applied (a tiny stand-in for a 124M-parameter model).

A block may carry an annotation on the line before its fence:

    <!-- test: skip REASON -->      not run (a reason is required)
    <!-- test: setup NAME ... -->   call doc_fixtures.NAME(workdir) first (files the block reads)
    <!-- test: config PATH -->      write the block to PATH and load it with LazyConfig.load
    <!-- test: mpi N -->            run the python block alone on N processes (the launcher)
    <!-- test: same-as DOC ... -->  not run here: each of its commands is run, verbatim, by a
                                    block of one of these documents (test_doc_snippets checks it)
"""
import os
import re
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, ROOT]

import doc_commands as commands  # noqa: E402

ANNOTATION = re.compile(r"^<!--\s*test:\s*([\w-]+)\s*(.*?)\s*-->\s*$")
KINDS = ("skip", "setup", "config", "mpi", "same-as")


class Block:
    def __init__(self, doc, line, lang, code, notes):
        self.doc, self.line, self.lang, self.code, self.notes = doc, line, lang, code, notes

    @property
    def where(self):
        return f"{self.doc}:{self.line}"

    def note(self, kind):
        return self.notes.get(kind)


def parse(doc):
    """The fenced blocks of `doc` (a path relative to the repository) with their annotations.
    Raises ValueError on an unknown annotation, a skip without a reason or an unclosed fence."""
    lines = open(os.path.join(ROOT, doc), encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, indent, lang = i, m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"{doc}:{start + 1}: unclosed code fence")
        notes, k = {}, start - 1
        while k >= 0 and ANNOTATION.match(lines[k].strip()):
            kind, arg = ANNOTATION.match(lines[k].strip()).groups()
            if kind not in KINDS:
                raise ValueError(f"{doc}:{k + 1}: unknown annotation 'test: {kind}' (known: {', '.join(KINDS)})")
            if kind in ("skip", "same-as") and not arg:
                raise ValueError(f"{doc}:{k + 1}: 'test: {kind}' needs " + ("a reason" if kind == "skip" else
                                                                            "the documents that run its commands"))
            notes[kind] = arg
            k -= 1
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip()
                         for line in lines[start + 1:j])  # a block inside a list item is indented
        blocks.append(Block(doc, start + 1, lang, code + "\n", notes))
        i = j + 1
    return blocks


def shell_commands(code):
    """The commands of a bash block: continuation lines joined, comments dropped, `a && b` split."""
    out = []
    for line in code.replace("\\\n", " ").split("\n"):
        line = _strip_comment(line).strip()
        if line:
            out += [part.strip() for part in line.split(" && ")]
    return out


def _strip_comment(line):
    """`line` without a trailing `# comment` (a # inside quotes is kept)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def runnable_script(block):
    """The bash script the test runs for `block`: listed commands dropped, the rest shortened."""
    kept = []
    for cmd in shell_commands(block.code):
        if commands.not_run_reason(cmd) is not None:
            continue
        kept.append(commands.shorten(cmd, block.doc))
    return "\n".join(kept)


def main(doc, workdir):
    import doc_fixtures

    os.chdir(workdir)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    # `python`, `pip` and `mpiexec` in the commands are this interpreter's (its virtual environment)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    namespace = {"__name__": "__main__"}
    for block in parse(doc):
        if block.lang not in ("python", "bash") or block.note("skip") is not None or block.note("same-as"):
            continue
        print(f"=== {block.where} [{block.lang}]", flush=True)
        for name in (block.note("setup") or "").split():
            getattr(doc_fixtures, name)(workdir)
        if block.lang == "bash":
            script = runnable_script(block)
            print(script, flush=True)
            if script and subprocess.run(["bash", "-e", "-c", script], env=env).returncode:
                sys.exit(f"FAILED: the bash block at {block.where}")
        elif block.note("config"):
            path = block.note("config")
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(block.code)
            from libai.config import LazyConfig
            LazyConfig.load(path)
        elif block.note("mpi"):
            path = f"snippet_{block.line}.py"
            with open(path, "w", encoding="utf-8") as f:
                f.write(block.code)
            cmd = [sys.executable, "-m", "engine.distributed.launch", "--nproc-per-node", block.note("mpi"), path]
            if subprocess.run(cmd, env=env).returncode:
                sys.exit(f"FAILED: the python block at {block.where} on {block.note('mpi')} processes")
        else:
            try:
                exec(compile(block.code, block.where, "exec"), namespace)
            except BaseException:
                traceback.print_exc()
                sys.exit(f"FAILED: the python block at {block.where}")
    print("=== all blocks ran", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
