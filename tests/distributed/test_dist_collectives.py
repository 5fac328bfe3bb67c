"""Collectives of engine.distributed.comm, run for real on 2, 4 and 8 MPI processes."""
import numpy as np
import pytest

from mpi_helper import run_mpi


@pytest.mark.parametrize("nprocs", [2, 3, 4, 8])
def test_collectives_multiprocess(nprocs):
    rc, out, err = run_mpi(nprocs, "collectives.py")
    assert f"collectives OK on {nprocs} ranks" in out


def test_collectives_single_process_in_process():
    """Without mpiexec the same script runs in this very process: world size 1, identity collectives."""
    import runpy
    import os

    from engine.distributed import comm

    here = os.path.join(os.path.dirname(__file__), "scripts", "collectives.py")
    runpy.run_path(here, run_name="not_main")["main"]()
    assert comm.get_world_size() == 1 and comm.get_rank() == 0 and comm.get_local_rank() == 0


def test_single_process_api():
    import engine as flow
    import engine.distributed as dist

    assert dist.get_world_size() == 1 and dist.get_rank() == 0
    assert dist.get_local_world_size() == 1
    t = flow.tensor([1.0, 2.0])
    assert dist.all_reduce(t) is t
    g = dist.all_gather(t)
    assert g is not t and g.numpy().tolist() == [1.0, 2.0]
    assert dist.reduce_scatter(t).numpy().tolist() == [1.0, 2.0]
    assert dist.all_to_all(flow.ones(2, 3), split_axis=1, concat_axis=0).shape == (2, 3)
    dist.broadcast(t, src=0)
    dist.barrier()
    grp = dist.new_group([0])
    assert grp.size == 1 and grp.rank == 0 and grp.contains(0)
    assert dist.comm.mesh_axis_groups(np.zeros((1, 1), dtype=int), 0).ranks == (0,)
    with pytest.raises(ValueError):
        dist.new_group([0, 1])
    assert dist.comm.split_sizes(5, 4) == [2, 1, 1, 1]
    assert dist.comm.split_sizes(3, 8) == [1, 1, 1, 0, 0, 0, 0, 0]
