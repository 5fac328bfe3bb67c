"""Child-side wrapper: `python -m engine.distributed.run script.py args...` (one per MPI rank).

mpiexec starts this module on every rank (the launcher does it for you). It starts MPI, exports
RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE (so code written for torchrun-style
environments works unchanged), installs the abort-on-exception hook, and runs the script as
`__main__`. Any failure on any rank -- an exception, or `sys.exit(nonzero)` -- ends the whole job
through MPI_Abort with the rank-tagged traceback on stderr, instead of leaving the other ranks
blocked in their next collective.

Stopping on a signal is not a failure. The launcher (through mpiexec) sends SIGINT/SIGTERM to
every rank; a trainer that handles it finishes its step, checkpoints together with the other
ranks and exits with 128+signum (130, 143). Aborting there would print noise and, worse, could
SIGKILL a peer still writing its part of the checkpoint. So a rank leaving with 130 or 143 first
waits (a non-blocking barrier on a communicator of its own) for every other rank to leave the
same way, and exits quietly with that status when they do. If some rank does not follow within
ENGINE_KILL_TIMEOUT seconds (the launcher's --kill-timeout, default 30) it was a lone exit
while the others may sit in a collective: then the job is aborted as for any failure. An
uncaught KeyboardInterrupt (a script without a handler) is not coordinated either: it aborts
the job with status 130 and a one-line message instead of a traceback per rank.

A rank started by hydra's proxy dies with it (Linux parent-death signal, SIGKILL): if the proxy
is killed, nothing would otherwise ever stop its ranks. See engine.distributed.launch.

Also accepted: `-m module args...` and `-c code args...`, like the Python interpreter.
"""
import os
import runpy
import signal
import sys

from . import comm
from .launch import die_with_parent
from .waiting import wait_until

USAGE = "usage: python -m engine.distributed.run (script.py | -m module | -c code) [args...]"

STOP_STATUSES = {128 + signal.SIGINT, 128 + signal.SIGTERM}
_exit_comm = None  # a duplicate of COMM_WORLD, used only to agree on stopping


def _die_with_proxy():
    """SIGKILL this rank when its parent, hydra's proxy, dies (not when a wrapper script does)."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm") as f:
            if f.read().strip() != "hydra_pmi_proxy":
                return
    except OSError:  # no /proc: not Linux
        return
    die_with_parent(parent)


def _record_pid(directory):
    """Write this rank's pid where the launcher looks for it (ENGINE_RANK_PIDS_DIR), so that a job
    ending on a killed rank (SIGKILL, the OOM killer: mpiexec names only its pid) names the rank."""
    if not directory:
        return
    try:
        with open(os.path.join(directory, f"rank{os.environ['RANK']}"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:  # another host's directory, or none: the launcher then names no rank
        pass


def _setup():
    comm.init()
    os.environ["RANK"] = str(comm.get_rank())
    os.environ["WORLD_SIZE"] = str(comm.get_world_size())
    os.environ["LOCAL_RANK"] = str(comm.get_local_rank())
    os.environ["LOCAL_WORLD_SIZE"] = str(comm.get_local_world_size())
    _record_pid(os.environ.get("ENGINE_RANK_PIDS_DIR"))
    comm.install_abort_on_exception()
    global _exit_comm
    if comm.get_world_size() > 1:
        _exit_comm = comm.MPI.COMM_WORLD.Dup()


def _everyone_stops(timeout):
    """Whether every other rank also leaves on a signal within `timeout` seconds."""
    if _exit_comm is None:
        return True
    return wait_until(_exit_comm.Ibarrier().Test, timeout)


def _abort_exit(code, why=""):
    """A rank exiting non-zero while others may still be in a collective: abort them all."""
    sys.stdout.flush()
    sys.stderr.write(f"[rank {comm.get_rank()}] exited with status {code}{why}\n")
    sys.stderr.flush()
    if comm.get_world_size() > 1:
        comm.wait_for_output_forwarded()
        comm.MPI.COMM_WORLD.Abort(code if isinstance(code, int) and 0 < code < 256 else 1)
    sys.exit(code)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 2
    _die_with_proxy()
    _setup()
    try:
        if argv[0] == "-m":
            if len(argv) < 2:
                print(USAGE, file=sys.stderr)
                return 2
            sys.argv = [argv[1]] + argv[2:]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            script = argv[0]
            sys.argv = argv
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None or code == 0:
            return 0
        if not isinstance(code, int):  # sys.exit("message")
            sys.stderr.write(f"[rank {comm.get_rank()}] {code}\n")
            code = 1
        if code in STOP_STATUSES:
            timeout = float(os.environ.get("ENGINE_KILL_TIMEOUT", "30"))
            if _everyone_stops(timeout):
                return code
            _abort_exit(code, f" (a stop on a signal), but the other ranks did not stop within "
                              f"{timeout:g}s (ENGINE_KILL_TIMEOUT)")
        _abort_exit(code)
    except KeyboardInterrupt:
        _abort_exit(128 + signal.SIGINT, " (KeyboardInterrupt)")
    except BaseException:
        comm._abort_with_traceback(*sys.exc_info())
    finally:
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
