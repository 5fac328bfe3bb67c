"""GPT-2 batches as global tensors on 4 ranks (dp, dp x tp, tp, dp x pp). Body:
scripts/gpt2_loader_dist.py."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distributed"))

from mpi_helper import run_mpi  # noqa: E402


def test_batches_to_global_on_4_ranks(corpus):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "gpt2_loader_dist.py")
    # the 4 ranks build the GPT2Dataset index cache concurrently (file lock + atomic rename)
    rc, out, err = run_mpi(4, script, [corpus["data_prefix"]], timeout=240)
    for topo in ("dp=4 tp=1 pp=1", "dp=2 tp=2 pp=1", "dp=1 tp=4 pp=1", "dp=2 tp=1 pp=2"):
        assert f"OK {topo}" in out, out + err
