"""torch.distributed's API on engine.distributed (c10d.py) and nn.parallel.DistributedDataParallel.

Per-rank bodies in scripts/torch_*.py run under mpiexec and check every collective against
numpy, and DDP against single-process training on the whole batch. The in-process tests cover
a world of one: init_process_group's checks and DDP's arguments, and DDP against torch's DDP
(gloo, one process) on shared weights.
"""
import os
import socket
import sys

import numpy as np
import pytest

import engine as flow
import engine.distributed as dist
from engine.nn.parallel import DistributedDataParallel as DDP
from mpi_helper import SCRIPTS, mpi_env, mpiexec, run_command, run_mpi

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_collectives_against_numpy(nprocs):
    rc, out, err = run_mpi(nprocs, "torch_collectives.py", timeout=120)
    assert out.count(f"torch-style collectives OK on {nprocs} ranks") == nprocs


@pytest.mark.parametrize("nprocs", [2, 4])
def test_ddp_matches_single_process_training(nprocs):
    rc, out, err = run_mpi(nprocs, "torch_ddp.py", timeout=120)
    assert out.count(f"torch-style DDP OK on {nprocs} ranks") == nprocs


def _env(**ranks_env):
    env = mpi_env()
    for var in TORCHRUN_VARS:
        env.pop(var, None)
    env.update(ranks_env)
    return env


def _mpmd(rank_envs, mode):
    """mpiexec starting one process per dict of environment variables, each told its own RANK (as
    torchrun would), without engine.distributed.run (which would export MPI's numbers)."""
    script = os.path.join(SCRIPTS, "torch_init_env.py")
    cmd = [mpiexec()]
    for i, env in enumerate(rank_envs):
        if i:
            cmd.append(":")
        cmd += ["-n", "1"]
        for k, v in env.items():
            cmd += ["-env", k, str(v)]
        cmd += [sys.executable, script, mode]
    return run_command(cmd, timeout=120, env=_env())


def test_init_under_torchrun_style_environment():
    told = [dict(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, LOCAL_WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=29500) for r in range(2)]
    rc, out, err = _mpmd(told, "ok")
    assert "init OK rank=0 world=2" in out and "init OK rank=1 world=2" in out
    swapped = [dict(e, RANK=1 - e["RANK"]) for e in told]
    rc, out, err = _mpmd(swapped, "refused")
    assert out.count("REFUSED") == 2 and "RANK=1 (MPI: 0)" in out and "RANK=0 (MPI: 1)" in out, out


def test_init_alone_and_through_the_engine_launcher():
    script = os.path.join(SCRIPTS, "torch_init_env.py")
    env = _env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    rc, out, err = run_command([sys.executable, script, "ok"], timeout=60, env=env)
    assert "init OK rank=0 world=1" in out
    # torchrun would start two independent processes: each is a world of one for MPI, and is told so
    rc, out, err = run_command([sys.executable, script, "refused"], timeout=60, env=dict(env, WORLD_SIZE="2"))
    assert "REFUSED" in out and "WORLD_SIZE=2 (MPI: 1)" in out and "engine.distributed.launch" in out
    # the launcher exports RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE for every rank
    rc, out, err = run_command([sys.executable, "-m", "engine.distributed.launch", "--nproc-per-node", "2",
                                script, "ok"], timeout=120, env=_env())
    assert "init OK rank=0 world=2" in out and "init OK rank=1 world=2" in out


# ------------------------------------------------------------------ in process: a world of one
@pytest.fixture
def clean_env(monkeypatch):
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    dist.destroy_process_group()
    yield monkeypatch
    dist.destroy_process_group()


def test_init_process_group_checks(clean_env):
    with pytest.raises(ValueError, match="has not been initialized"):
        dist.get_backend()
    with pytest.raises(NotImplementedError, match="store="):
        dist.init_process_group("gloo", store=object())
    with pytest.raises(NotImplementedError, match="'ucc' is not available"):
        dist.init_process_group("ucc")
    with pytest.raises(AssertionError, match="Unknown backend type foo"):
        dist.init_process_group("foo")
    with pytest.raises(RuntimeError, match="No rendezvous handler for foo://"):
        dist.init_process_group("gloo", init_method="foo://x")
    with pytest.raises(RuntimeError, match=r"world_size=2 \(MPI: 1\)"):
        dist.init_process_group("gloo", world_size=2, rank=0)
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="processes started by torchrun cannot join one MPI job"):
        dist.init_process_group("gloo")
    clean_env.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not an integer"):
        dist.init_process_group()
    assert not dist.is_initialized()
    for var, val in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="localhost").items():
        clean_env.setenv(var, val)
    dist.init_process_group("cpu:gloo,cuda:nccl" if flow.cuda.is_available() else "GLOO",
                            init_method="tcp://127.0.0.1:23456", timeout=__import__("datetime").timedelta(60))
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    with pytest.raises(ValueError, match="twice"):
        dist.init_process_group()
    dist.destroy_process_group()
    assert not dist.is_initialized()
    dist.init_process_group()  # again after destroy
    assert dist.get_backend() == ("cpu:gloo,cuda:nccl" if flow.cuda.is_available() else "gloo")


@pytest.mark.skipif(flow.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_nccl_without_gpu_is_a_clear_error(clean_env):
    with pytest.raises(RuntimeError, match="NCCL needs a CUDA GPU"):
        dist.init_process_group("nccl")
    with pytest.raises(RuntimeError, match="NCCL needs a CUDA GPU"):
        dist.init_process_group("cpu:gloo,cuda:nccl")
    assert not dist.is_initialized()


def test_engine_callers_keep_their_forms():
    """The names that existed before keep working as the engine's code calls them."""
    t = flow.tensor([1.0, 2.0])
    assert dist.all_reduce(t, op="sum") is t and dist.broadcast(t, src=0) is t
    assert dist.all_gather(t).numpy().tolist() == [1.0, 2.0]  # the engine's concatenating form
    assert dist.all_gather(t, group=dist.new_group([0])).numpy().tolist() == [1.0, 2.0]
    assert dist.reduce_scatter(t).numpy().tolist() == [1.0, 2.0]
    assert dist.comm.is_initialized()  # MPI's state is still asked through comm


def _mlp():
    return flow.nn.Sequential(flow.nn.Linear(4, 5), flow.nn.Tanh(), flow.nn.Linear(5, 2)).double()


def test_ddp_arguments():
    m = _mlp()
    DDP(m, device_ids=["cpu"], output_device="cpu")
    DDP(m, device_ids=[flow.device("cpu")], check_reduction=True, dim=1)
    with pytest.raises(ValueError, match="device_ids refers to cuda:0"):
        DDP(m, device_ids=[0])
    with pytest.raises(ValueError, match="only be None or contain a single element"):
        DDP(m, device_ids=["cpu", "cpu"])
    with pytest.raises(ValueError, match="output_device"):
        DDP(m, output_device=1)
    for option in [dict(gradient_as_bucket_view=True), dict(static_graph=True), dict(mixed_precision=object()),
                   dict(device_mesh=object()), dict(bucket_cap_mb_list=[1]), dict(forward_sync_buffers=True)]:
        with pytest.raises(NotImplementedError, match=next(iter(option))):
            DDP(m, **option)
    with pytest.raises(TypeError, match="engine.nn.Module"):
        DDP(lambda x: x)
    g = flow.nn.Linear(2, 2)
    g.weight = flow.nn.Parameter(flow.ones(2, 2, placement=flow.placement("cpu", [0]), sbp=flow.sbp.broadcast))
    with pytest.raises(TypeError, match="global tensor"):
        DDP(g)


def test_ddp_matches_torch_ddp_in_one_process(clean_env):
    """Against torch's own DDP (gloo, a world of one) on the same weights: state_dict keys, the
    gradient-accumulation switches, and the trained weights."""
    import torch
    import torch.distributed as tdist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        ours = _mlp()
        theirs = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()
        with torch.no_grad():
            for p, q in zip(ours.parameters(), theirs.parameters()):
                q.copy_(torch.from_numpy(p.detach().numpy()))
        a, b = DDP(ours, bucket_cap_mb=0.0001), torch.nn.parallel.DistributedDataParallel(theirs, bucket_cap_mb=0.0001)
        assert list(a.state_dict()) == list(b.state_dict())
        oa = flow.optim.SGD(a.parameters(), lr=0.05, momentum=0.9)
        ob = torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9)
        rng = np.random.default_rng(0)
        for step in range(3):
            for micro in range(2):
                x = rng.standard_normal((3, 4))
                a.require_backward_grad_sync = b.require_backward_grad_sync = micro == 1
                a(flow.tensor(x)).pow(2).mean().backward()
                b(torch.from_numpy(x)).pow(2).mean().backward()
            with a.no_sync(), b.no_sync():
                assert not a.require_backward_grad_sync and not b.require_backward_grad_sync
            oa.step()
            ob.step()
            oa.zero_grad()
            ob.zero_grad()
        for p, q in zip(a.module.parameters(), b.module.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12, atol=1e-12)
    finally:
        tdist.destroy_process_group()
