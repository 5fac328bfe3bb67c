"""Child-side wrapper: `python -m engine.distributed.run script.py args...` (one per MPI rank).

mpiexec starts this module on every rank (the launcher does it for you). It starts MPI, exports
RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE (so code written for torchrun-style
environments works unchanged), installs the abort-on-exception hook, and runs the script as
`__main__`. Any failure on any rank -- an exception, or `sys.exit(nonzero)` -- ends the whole job
through MPI_Abort with the rank-tagged traceback on stderr, instead of leaving the other ranks
blocked in their next collective.

Also accepted: `-m module args...` and `-c code args...`, like the Python interpreter.
"""
import os
import runpy
import sys

from . import comm

USAGE = "usage: python -m engine.distributed.run (script.py | -m module | -c code) [args...]"


def _setup():
    comm.init()
    os.environ["RANK"] = str(comm.get_rank())
    os.environ["WORLD_SIZE"] = str(comm.get_world_size())
    os.environ["LOCAL_RANK"] = str(comm.get_local_rank())
    os.environ["LOCAL_WORLD_SIZE"] = str(comm.get_local_world_size())
    comm.install_abort_on_exception()


def _abort_exit(code):
    """A rank exiting non-zero while others may still be in a collective: abort them all."""
    sys.stdout.flush()
    sys.stderr.write(f"[rank {comm.get_rank()}] exited with status {code}\n")
    sys.stderr.flush()
    if comm.get_world_size() > 1:
        comm.MPI.COMM_WORLD.Abort(code if isinstance(code, int) and 0 < code < 256 else 1)
    sys.exit(code)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 2
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
        _abort_exit(code)
    except BaseException:
        comm._abort_with_traceback(*sys.exc_info())
    finally:
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
