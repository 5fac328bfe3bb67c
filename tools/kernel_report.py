"""Registers, spills and the main-loop instruction mix of the engine's CUDA kernels, compiled on a
machine without a GPU: what ptxas decides (occupancy, spills) and what the loop that does the work
costs in instructions, read off the compiled code since the machine has no profiler to ask.

    python tools/kernel_report.py 'engine.kernels.flash_attention:source(64)'
    python tools/kernel_report.py 'engine.kernels.flash_attention:source(64, 1)' --sass
    python tools/kernel_report.py engine.kernels.layer_norm:SOURCE --arch 80
    python tools/kernel_report.py 'engine.kernels.flash_attention:source(64)' --sass \\
        --sub 'const bool edge = edge_tile\\([^;]*\\);=>const bool edge = false;'   # a what-if variant

The source is MODULE:EXPRESSION, the expression evaluated in the module (a source string). It is
compiled as the engine compiles it (engine.kernels._cuda's options, CuPy's -ftz=true) by NVRTC
for sm_ARCH (default 90, the H100/H200); `ptxas -v`'s report gives each kernel's registers,
spill stores and loads, stack frame and static shared memory, and the warps that fit on one
multiprocessor by registers.

`--sass` also disassembles the kernels (NVRTC's PTX through ptxas, then cuobjdump, which calls
nvdisasm) and counts, per kernel, the instructions of its main loop: the longest backward branch,
by opcode (HMMA: tensor-core products, LDSM: ldmatrix, MUFU: ex2 and other special functions,
F2FP: float pairs packed to half, LDL/STL: local memory, i.e. spills). These tools come from pip
(not in the test extra): `pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm`. `--sub REGEX=>TEXT` (repeatable) rewrites the source first, e.g. to count
a steady-state loop without its edge and dropout branches.
"""
import argparse
import collections
import glob
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PIP_TOOLS = "pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"
REGISTERS_PER_SM, MAX_WARPS_PER_SM = 65536, 64  # sm_80 and sm_90
_PTXAS_FUNC = re.compile(r"Function properties for (\w+)\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads\n[^\n]*?Used (\d+) registers[^\n]*?(?:(\d+) bytes smem)?\n")


def load_source(spec):
    """The source string of MODULE:EXPRESSION."""
    module, _, expr = spec.partition(":")
    if not expr:
        raise SystemExit(f"kernel_report.py: {spec!r} is not MODULE:EXPRESSION (e.g. engine.kernels.layer_norm:SOURCE)")
    src = eval(expr, vars(importlib.import_module(module)))  # a developer's command line, as python -c
    if not isinstance(src, str):
        raise SystemExit(f"kernel_report.py: {spec} is a {type(src).__name__}, not a CUDA source string")
    return src


def _nvrtc(source, options):
    """(program log, PTX) of `source` compiled with NVRTC and `options`."""
    import cuda.pathfinder as pathfinder
    from cupy.cuda import nvrtc

    from engine.kernels import _cuda

    include = pathfinder.find_nvidia_header_directory("cudart")
    prog = nvrtc.createProgram(source, "kernel.cu", [], [])
    opts = list(_cuda._OPTIONS) + ["-ftz=true", f"-I{include}"] + list(options)
    try:
        nvrtc.compileProgram(prog, opts)
    except Exception as e:
        raise SystemExit(f"kernel_report.py: NVRTC failed ({e}):\n{nvrtc.getProgramLog(prog)}")
    ptx = nvrtc.getPTX(prog)
    return nvrtc.getProgramLog(prog), ptx if isinstance(ptx, bytes) else ptx.encode()


def registers(source, arch="90"):
    """{kernel: dict(registers, spill_stores, spill_loads, stack, smem, warps_per_sm)} from ptxas -v
    (through NVRTC, down to sm_`arch` machine code); warps_per_sm: the warps that fit on one
    multiprocessor by registers (allocated 8 per thread at a time)."""
    log, _ = _nvrtc(source, [f"-arch=sm_{arch}", "-Xptxas", "-v"])
    out = {}
    for name, stack, stores, loads, regs, smem in _PTXAS_FUNC.findall(log):
        regs = int(regs)
        out[name] = dict(registers=regs, spill_stores=int(stores), spill_loads=int(loads), stack=int(stack),
                         smem=int(smem or 0), warps_per_sm=min(MAX_WARPS_PER_SM, REGISTERS_PER_SM // (32 * ((regs + 7) // 8 * 8))))
    if not out:
        raise SystemExit(f"kernel_report.py: no kernel in ptxas's report:\n{log}")
    return out


def _tool(name):
    """A CUDA binary from PATH or from the nvidia-* wheels of this environment."""
    found = shutil.which(name)
    if found:
        return found
    for site in sys.path:
        for path in glob.glob(os.path.join(site, "nvidia", "*", "bin", name)):
            if os.access(path, os.X_OK):
                return path
    raise SystemExit(f"kernel_report.py: --sass needs {name}, not found on PATH or in the nvidia wheels: {PIP_TOOLS}")


def sass(source, arch="90"):
    """The SASS text of `source` for sm_`arch`: NVRTC's PTX through ptxas, then cuobjdump."""
    ptxas, cuobjdump, nvdisasm = _tool("ptxas"), _tool("cuobjdump"), _tool("nvdisasm")
    _, ptx = _nvrtc(source, [f"-arch=compute_{arch}"])
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx_path, "wb") as f:
            f.write(ptx.rstrip(b"\0"))
        subprocess.run([ptxas, f"-arch=sm_{arch}", "-O3", ptx_path, "-o", cubin], check=True, capture_output=True)
        env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
        return subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True, text=True,
                              env=env).stdout


_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(?:\S+\s+)?0x([0-9a-f]+)")


def _opcode(text):
    text = re.sub(r"^@!?U?P\w+\s+", "", text)  # the predicate guard
    return text.split()[0].split(".")[0] if text else "?"


def main_loops(sass_text):
    """{kernel: (instructions, Counter of opcodes)} of each kernel's longest backward branch (its
    main loop); a kernel without a loop is left out."""
    functions, current = {}, None
    for line in sass_text.splitlines():
        m = re.search(r"Function : (\w+)", line)
        if m:
            current = functions.setdefault(m.group(1), [])
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2)))
    out = {}
    for name, instrs in functions.items():
        spans = [(at - int(m.group(1), 16), int(m.group(1), 16), at) for at, text in instrs
                 for m in [_BRANCH.search(text)] if m and int(m.group(1), 16) < at]
        if spans:
            _, lo, hi = max(spans)
            body = [_opcode(text) for at, text in instrs if lo <= at <= hi]
            out[name] = (len(body), collections.Counter(body))
    return out


def substitute(source, subs):
    for sub in subs:
        pattern, sep, repl = sub.partition("=>")
        if not sep:
            raise SystemExit(f"kernel_report.py: --sub {sub!r} is not REGEX=>TEXT")
        source, n = re.subn(pattern, lambda _m: repl, source)
        if n == 0:
            raise SystemExit(f"kernel_report.py: --sub pattern {pattern!r} matches nothing in the source")
    return source


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="MODULE:EXPRESSION giving a CUDA source string")
    ap.add_argument("--arch", default="90", help="the sm_ architecture (default 90)")
    ap.add_argument("--sass", action="store_true", help="also count each kernel's main-loop instructions")
    ap.add_argument("--sub", action="append", default=[], metavar="REGEX=>TEXT", help="rewrite the source first")
    a = ap.parse_args(argv)
    src = substitute(load_source(a.source), a.sub)
    regs = registers(src, a.arch)
    loops = main_loops(sass(src, a.arch)) if a.sass else {}
    print(f"{a.source} on sm_{a.arch}" + (f" (rewritten by {len(a.sub)} --sub)" if a.sub else ""))
    for name, r in sorted(regs.items()):
        print(f"  {name}: {r['registers']} registers (room for {r['warps_per_sm']} warps per SM), spill "
              f"stores {r['spill_stores']} B, loads {r['spill_loads']} B, stack {r['stack']} B, smem {r['smem']} B")
        if name in loops:
            n, ops = loops[name]
            print(f"    main loop: {n} instructions: " + " ".join(f"{k}={v}" for k, v in ops.most_common(16)))
    return regs, loops


if __name__ == "__main__":
    main()
