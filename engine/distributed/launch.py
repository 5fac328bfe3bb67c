"""`python -m engine.distributed.launch --nproc-per-node N [hosts] script.py args...`

A thin front end over MPICH's `mpiexec` (hydra), which the `mpich` wheel installs next to the
Python interpreter. It only builds one mpiexec command line:

    mpiexec -n N*hosts [-hosts h1,h2 | -f hostfile] [-ppn N]
            -genv OMP_NUM_THREADS T -genv OPENBLAS_NUM_THREADS 1 -genv MKL_NUM_THREADS T
            -genv ENGINE_NUM_THREADS T
            python -m engine.distributed.run script.py args...

with T = max(1, cores // N): each rank gets its share of the cores for the engine's thread
pool, so N ranks never oversubscribe the machine (OpenBLAS stays at one thread: the engine
splits matrix products itself, engine/backend/parallel.py). The child wrapper
(engine.distributed.run) exports RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE and makes an
error on any rank abort the whole job.

Multi-node is MPI's job, not ours: pass `--hosts h1,h2` (hydra `-hosts`) or `--hostfile F`
(hydra `-f`, lines `host` or `host:slots`); hydra starts the remote ranks over ssh (or the
batch system's launcher) and MPICH carries the data. Every host needs the same Python
environment at the same path. There is no home-made transport. Extra mpiexec options go after
`--mpi-args "..."` (e.g. `--mpi-args "-launcher fork"` on a host without ssh).

The exit status is mpiexec's: non-zero when any rank failed.
"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys


def find_mpiexec(explicit=None):
    """mpiexec next to the interpreter (the mpich wheel's), else on PATH."""
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        found = shutil.which(explicit)
        if found:
            return found
        raise FileNotFoundError(f"--mpiexec {explicit!r} is not an executable")
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(local) and os.access(local, os.X_OK):
        return local
    found = shutil.which("mpiexec")
    if found:
        return found
    raise FileNotFoundError(
        "mpiexec not found next to the Python interpreter or on PATH; install MPICH with "
        "`pip install mpich mpi4py` (the project's dependencies) or pass --mpiexec PATH")


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _hostfile_hosts(path):
    hosts = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                hosts.append(line.split(":", 1)[0].split()[0])
    if not hosts:
        raise ValueError(f"hostfile {path!r} lists no hosts")
    return hosts


def build_command(args):
    """The mpiexec argv for parsed launcher arguments."""
    n = args.nproc_per_node
    if n < 1:
        raise ValueError("--nproc-per-node must be >= 1")
    if args.hosts and args.hostfile:
        raise ValueError("give --hosts or --hostfile, not both")
    hosts = None
    if args.hosts:
        hosts = [h for h in args.hosts.split(",") if h]
    elif args.hostfile:
        hosts = _hostfile_hosts(args.hostfile)
    nnodes = len(hosts) if hosts else 1
    threads = args.threads_per_proc or max(1, _cores() // n)
    cmd = [find_mpiexec(args.mpiexec), "-n", str(n * nnodes)]
    if args.hosts:
        cmd += ["-hosts", ",".join(hosts), "-ppn", str(n)]
    elif args.hostfile:
        cmd += ["-f", args.hostfile, "-ppn", str(n)]
    for var, val in (("OMP_NUM_THREADS", threads), ("OPENBLAS_NUM_THREADS", 1),
                     ("MKL_NUM_THREADS", threads), ("ENGINE_NUM_THREADS", threads)):
        cmd += ["-genv", var, str(val)]
    # Keep freed large buffers in the heap for reuse instead of returning them to the OS (what
    # PyTorch's caching allocator does): a fresh 16 MB all_gather result otherwise costs more in
    # page faults than the transfer itself (measured +60-90% vs. +5% for 16-64 MB on 2 ranks).
    for var, val in _MALLOC_REUSE.items():
        if var not in os.environ:
            cmd += ["-genv", var, val]
    if args.mpi_args:
        cmd += shlex.split(args.mpi_args)
    cmd += [sys.executable, "-m", "engine.distributed.run", args.script] + list(args.script_args)
    return cmd


_MALLOC_REUSE = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}


def parser():
    p = argparse.ArgumentParser(
        prog="python -m engine.distributed.launch",
        description="Run a script on N processes per node under MPICH's mpiexec.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", type=int, default=1,
                   help="processes per host (default 1)")
    p.add_argument("--hosts", help="comma-separated host names (multi-node, hydra -hosts)")
    p.add_argument("--hostfile", help="file with one host per line (multi-node, hydra -f)")
    p.add_argument("--mpiexec", help="mpiexec to use (default: next to python, then PATH)")
    p.add_argument("--threads-per-proc", type=int, default=None,
                   help="engine/OpenMP threads per rank (default: cores // nproc-per-node)")
    p.add_argument("--mpi-args", default="", help="extra mpiexec options, one quoted string")
    p.add_argument("--dry-run", action="store_true", help="print the mpiexec command and exit")
    p.add_argument("script", help="the training script (or -m module)")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        cmd = build_command(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"engine.distributed.launch: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
