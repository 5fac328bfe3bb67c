"""`python -m engine.distributed.launch --nproc-per-node N [hosts] script.py args...`

A thin front end over MPICH's `mpiexec` (hydra), which the `mpich` wheel installs next to the
Python interpreter. It builds one mpiexec command line, runs it and passes signals on to it:

    mpiexec -n N*hosts [-hosts h1,h2 | -f hostfile] [-ppn N]
            -genv OMP_NUM_THREADS T -genv OPENBLAS_NUM_THREADS 1 -genv MKL_NUM_THREADS T
            -genv ENGINE_NUM_THREADS T -genv ENGINE_KILL_TIMEOUT S
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

The exit status is mpiexec's: non-zero when any rank failed, 128+N when mpiexec was killed by
signal N (137 after the --kill-timeout below).

Signals and the life of the job
-------------------------------
What hydra does (MPICH 5.0.2; measured, and its source agrees):

* mpiexec passes SIGTERM, SIGQUIT, SIGUSR1 and a *first* SIGINT on to every rank on every host
  (each proxy signals its ranks' process groups; every rank runs in a session of its own) and
  goes on waiting for them. Ranks that handle the signal and exit report it in mpiexec's exit
  status (the OR of the ranks' statuses: 143 when they all exit 143). A *second* SIGINT makes
  mpiexec SIGKILL every rank and exit 1.
* The proxies ignore SIGINT/SIGTERM. A proxy SIGKILLs all its ranks when its connection to
  mpiexec breaks (mpiexec SIGKILLed) and when one of its ranks is killed by a signal (so a rank
  without a handler that dies of SIGTERM takes the others down at once).
* Nothing watches for the death of a parent: a SIGKILLed proxy leaves its ranks running, and a
  launcher that died of SIGTERM (as this one did) left mpiexec and every rank training on.

Hence the launcher:

* starts mpiexec in a session of its own (`start_new_session`), so that a terminal's Ctrl-C
  or `timeout`'s process-group SIGTERM reaches the job once, through the launcher, and not
  twice (hydra would take a second SIGINT as "kill everything now", losing the checkpoint);
* on SIGINT/SIGTERM sends that signal to mpiexec, which hands it to every rank (a trainer
  stops after its step, checkpoints together with the others and exits 128+signum), waits for
  mpiexec and returns its exit status. A signal ignored when the launcher started (nohup, a
  background job of a script) stays ignored;
* if the job is still running `--kill-timeout` seconds (default 30) after the signal, or on a
  second SIGINT/SIGTERM, SIGKILLs mpiexec and all its descendants on this host (found through
  /proc: proxies and ranks sit in sessions of their own, which a process-group kill would
  miss); remote ranks die with their proxies when mpiexec's connection drops;
* sets Linux's parent-death signal on mpiexec (`prctl(PR_SET_PDEATHSIG, SIGKILL)` in the
  forked child before exec, then a getppid() check that closes the race with a launcher that
  died first): a SIGKILLed launcher can forward nothing, so its job dies with it. SIGKILL and
  not SIGTERM: a SIGTERMed mpiexec would forward the signal and wait, without limit, for ranks
  that may never stop, and no one would be left to enforce the grace period.
  engine.distributed.run does the same for each rank against its proxy, since a dead proxy can
  no longer signal its ranks and its peers are being SIGKILLed by theirs.

Why not `exec` into mpiexec, which would receive the signals itself: then nothing would enforce
the grace period, and a second SIGTERM would only be forwarded again.
"""
import argparse
import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time


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
    # ENGINE_KILL_TIMEOUT: how long a rank that stopped on a signal waits for the others (run.py).
    for var, val in (("OMP_NUM_THREADS", threads), ("OPENBLAS_NUM_THREADS", 1),
                     ("MKL_NUM_THREADS", threads), ("ENGINE_NUM_THREADS", threads),
                     ("ENGINE_KILL_TIMEOUT", f"{args.kill_timeout:g}")):
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


# ------------------------------------------------------------------------- the job's life
PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _prctl():
    """libc's prctl, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        return None
    prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    return prctl


def die_with_parent(parent, prctl=None):
    """Have the kernel SIGKILL this process when `parent` (its parent now) dies; Linux only.

    The parent may have died before the request took effect (this process then already belongs
    to a reaper): checking getppid() afterwards closes that race, by dying at once.
    """
    prctl = prctl or _prctl()
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def parent_pid(pid):
    """The parent of `pid` from /proc (field 4 of /proc/PID/stat; the name may hold spaces)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def descendants(pid):
    """The pids of all processes below `pid` on this host (Linux /proc); [] elsewhere."""
    children = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # pragma: no cover - no /proc
        return []
    for entry in entries:
        if entry.isdigit():
            try:
                children.setdefault(parent_pid(entry), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


class Job:
    """mpiexec as the launcher's child: SIGINT/SIGTERM forwarded, a grace period, then SIGKILL.

    Signals are taken synchronously: SIGINT, SIGTERM and SIGCHLD are blocked and collected with
    sigtimedwait, so none is lost between starting mpiexec and waiting for it, and the launcher
    sleeps until something happens (mpiexec exits, a signal comes, the grace period ends).
    """

    def __init__(self, cmd, kill_timeout=30.0):
        self.cmd = cmd
        self.kill_timeout = kill_timeout
        self.stop = [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
        self.proc = None
        self.deadline = None  # when the job is SIGKILLed unless it has ended

    def run(self):
        """Start mpiexec, wait for it, return its exit status (128+N when killed by signal N)."""
        if not hasattr(signal, "sigtimedwait"):  # pragma: no cover - not Linux: plain wait
            self.proc = subprocess.Popen(self.cmd)
            return _status(self.proc.wait())
        watch = set(self.stop) | {signal.SIGCHLD}
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watch)
        launcher, prctl = os.getpid(), _prctl()

        def child_setup():  # in the forked child, before exec
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            die_with_parent(launcher, prctl)

        try:
            # preexec_fn is safe here: the launcher runs no other thread.
            self.proc = subprocess.Popen(self.cmd, start_new_session=True,
                                         preexec_fn=child_setup)  # noqa: PLW1509
            while self.proc.poll() is None:
                self._step(watch)
            while signal.sigtimedwait(watch, 0) is not None:  # signals that came too late
                pass
        finally:
            if self.proc is not None and self.proc.returncode is None:  # launcher failing
                self.kill()
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return _status(self.proc.returncode)

    def _step(self, watch):
        """Wait for the next event (a signal, or the grace period ending) and act on it."""
        if self.deadline is None:
            info = signal.sigwaitinfo(watch)
        else:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self._say(f"the job is still running {self.kill_timeout:g}s after the signal "
                          "(--kill-timeout): killing it")
                self.kill()
                return
            info = signal.sigtimedwait(watch, min(left, 3600.0))  # time_t bounds the timeout
            if info is None:
                return
        if info.si_signo == signal.SIGCHLD:
            return
        name = signal.Signals(info.si_signo).name
        if self.deadline is None:
            self._say(f"{name}: passing it to every rank; waiting up to {self.kill_timeout:g}s "
                      "(--kill-timeout) for the job to stop; signal again to kill it now")
            self.deadline = time.monotonic() + self.kill_timeout
            self._send(info.si_signo)
        else:
            self._say(f"second signal ({name}): killing the job")
            self.kill()

    def _send(self, signum, pid=None):
        try:
            os.kill(self.proc.pid if pid is None else pid, signum)
        except ProcessLookupError:
            pass

    def kill(self):
        """SIGKILL mpiexec and everything below it on this host, and reap mpiexec."""
        for pid in [self.proc.pid] + descendants(self.proc.pid):
            self._send(signal.SIGKILL, pid)
        self.proc.wait()

    @staticmethod
    def _say(msg):
        print(f"engine.distributed.launch: {msg}", file=sys.stderr, flush=True)


def _status(returncode):
    """A Popen return code as a shell exit status: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _seconds(text):
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


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
    p.add_argument("--kill-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                   help="after SIGINT/SIGTERM (forwarded to every rank), how long the job may take "
                        "to stop before it is SIGKILLed (default 30; a second signal kills at once)")
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
    pids = tempfile.mkdtemp(prefix="engine-launch-pids-")
    try:
        status = Job(cmd[:1] + ["-genv", "ENGINE_RANK_PIDS_DIR", pids] + cmd[1:], args.kill_timeout).run()
        if status != 0:
            _name_ranks(pids, status)
        return status
    finally:
        shutil.rmtree(pids, ignore_errors=True)


def _name_ranks(directory, status):
    """After a failed job, each local rank's pid (engine.distributed.run wrote them): mpiexec's
    "BAD TERMINATION ... PID n ... EXIT CODE: 9" of a rank killed by a signal names no rank."""
    ranks = []
    for name in os.listdir(directory):
        try:
            with open(os.path.join(directory, name)) as f:
                ranks.append((int(name[len("rank"):]), int(f.read())))
        except (OSError, ValueError):
            continue
    if ranks:
        listing = ", ".join(f"rank {r} pid {pid}" for r, pid in sorted(ranks))
        Job._say(f"the job ended with exit status {status}; the ranks on this host were: {listing} (mpiexec's "
                 "messages above name a failed rank's pid; EXIT CODE 9 is a SIGKILL, e.g. the out-of-memory killer)")


if __name__ == "__main__":
    sys.exit(main())
