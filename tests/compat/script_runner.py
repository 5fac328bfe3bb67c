"""Run a script written for torch on the engine by changing only its import lines.

`port_imports` is the whole porting step: `import torch` becomes `import engine as torch`,
`import torch.X as Y` becomes `import engine.X as Y` and `from torch[.X] import ...` becomes
`from engine[.X] import ...`. Every other line is left byte for byte as it was, and an import of
torch that cannot be rewritten that way (`import torch.nn` binding the name `torch`, an import
inside a string of code) raises instead of being left to run against the real torch.

The scripts run in subprocesses, in a directory of their own (they read `data/` and write
`out*/` relative to it, as nanoGPT does), with one BLAS thread and the repository on PYTHONPATH
(mpi_helper.mpi_env), killed as a session on timeout like mpi_helper.run_command.
"""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

_DIST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distributed")
if _DIST not in sys.path:
    sys.path.insert(0, _DIST)
from mpi_helper import mpi_env, mpiexec  # noqa: E402,F401  (re-exported for the tests)

_RULES = [
    (re.compile(r"^(\s*)import torch$"), r"\1import engine as torch"),
    (re.compile(r"^(\s*)import torch\.([\w.]+) as (\w+)$"), r"\1import engine.\2 as \3"),
    (re.compile(r"^(\s*)from torch((?:\.[\w.]+)?) import "), r"\1from engine\2 import "),
]
_ANY_TORCH_IMPORT = re.compile(r"^\s*(import|from)\s+torch\b")


def port_imports(source):
    """`source` with its torch import lines pointed at the engine; nothing else changes."""
    out = []
    for line in source.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        for pattern, repl in _RULES:
            new, n = pattern.subn(repl, body)
            if n:
                line = new + line[len(body):]
                break
        else:
            if _ANY_TORCH_IMPORT.match(body):
                raise ValueError(f"cannot port this import line to the engine: {body!r}")
        out.append(line)
    return "".join(out)


def copy_scripts(src_dir, dst_dir, port):
    """Copy the .py files of `src_dir` into `dst_dir`, with `port_imports` applied when `port`."""
    os.makedirs(dst_dir, exist_ok=True)
    for name in sorted(os.listdir(src_dir)):
        if not name.endswith(".py"):
            continue
        src = os.path.join(src_dir, name)
        if port:
            with open(src, encoding="utf-8") as f:
                text = port_imports(f.read())
            with open(os.path.join(dst_dir, name), "w", encoding="utf-8") as f:
                f.write(text)
        else:
            shutil.copy(src, dst_dir)


def run(cmd, cwd, timeout=120):
    """Run `cmd` in `cwd`; (stdout, stderr). Fails the test with both on a non-zero exit or a timeout."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)} (in {cwd})\n--- stdout\n{out}\n--- stderr\n{err}")
    if proc.returncode != 0:
        pytest.fail(f"exit status {proc.returncode}: {' '.join(cmd)} (in {cwd})\n--- stdout\n{out}\n--- stderr\n{err}")
    return out, err


def python(script, *args, cwd, timeout=120):
    """`python script args...` in `cwd` (this interpreter: the venv with both torch and engine)."""
    return run([sys.executable, script, *args], cwd, timeout)[0]
