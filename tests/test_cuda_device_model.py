"""The device model of the CUDA backend, checked on CPU through the strict CuPy double: device
mismatches, per-rank GPU selection, the default device, bfloat16 refusals, the counter-based
device generator (its state saved and restored) and libai's explicit layer device."""
import copy
import json

import numpy as np
import pytest

import engine as flow
from engine import backend
from engine.kernels import philox


def test_a_cpu_cuda_mix_names_both_devices(cuda_double):
    a, b = flow.ones(3, device="cuda"), flow.ones(3)
    with pytest.raises(RuntimeError, match="at least two devices, cuda:0 and cpu"):
        a + b
    with pytest.raises(RuntimeError, match="cuda:0 and cpu"):
        flow.matmul(flow.ones(2, 2, device="cuda"), flow.ones(2, 2))
    # a 0-dim CPU tensor acts as a scalar beside CUDA tensors, as in PyTorch
    c = a * flow.tensor(2.0)
    assert c.device == flow.device("cuda", 0) and c.cpu().numpy().tolist() == [2.0, 2.0, 2.0]


def test_bfloat16_is_refused_on_cuda_with_advice(cuda_double):
    for make in (lambda: flow.zeros(3, dtype=flow.bfloat16, device="cuda"),
                 lambda: flow.ones(2, device="cuda").to(flow.bfloat16),
                 lambda: flow.tensor([1.0], dtype=flow.bfloat16).cuda(),
                 lambda: flow.autocast("cuda", dtype=flow.bfloat16)):
        with pytest.raises(TypeError, match="bfloat16.*float16"):
            make()


def test_numpy_data_goes_to_the_default_device(cuda_double, monkeypatch):
    monkeypatch.setenv("ENGINE_DEVICE", "cuda")
    assert flow.tensor(np.ones(3, np.float32)).device.type == "cuda"
    assert flow.tensor([1, 2]).device.type == "cuda"
    monkeypatch.setenv("ENGINE_DEVICE", "cpu")
    assert flow.tensor(np.ones(3, np.float32)).device.type == "cpu"


def test_each_rank_picks_its_local_gpu(monkeypatch):
    monkeypatch.delenv("ENGINE_CUDA_DEVICE", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert backend.local_cuda_index(4) == 3
    assert backend.local_cuda_index(2) == 1
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("MPI_LOCALRANKID", "1")
    assert backend.local_cuda_index(8) == 1
    monkeypatch.setenv("ENGINE_CUDA_DEVICE", "5")
    assert backend.local_cuda_index(8) == 5


def test_global_tensors_of_rank_use_its_gpu(cuda_double, monkeypatch):
    from engine.distributed.global_tensor import device_of_placement
    monkeypatch.setattr(cuda_double._double, "DEVICE_COUNT", 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("ENGINE_CUDA_DEVICE", raising=False)
    assert device_of_placement(flow.placement("cuda", [0])) == flow.device("cuda", 1)


def test_philox_matches_random123_known_answer():
    # Random123's kat_vectors: philox4x32_10, counter 0, key 0
    words = philox.philox_words(0, [0])[:, 0].tolist()
    assert words == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("kind", sorted(philox.PER_GROUP))
def test_philox_kernel_launch_matches_its_reference(cuda_double, kind):
    n, seed, offset = 37, 123456789123, 5
    got = philox.draw(cuda_double, kind, n, seed, offset).get()
    np.testing.assert_array_equal(got, philox.reference(kind, n, seed, offset))
    assert cuda_double._double.stats.launches == 1


def test_philox_distributions_look_right():
    u = philox.reference("uniform_float", 200000, 7, 0)
    z = philox.reference("normal_double", 200000, 7, 0)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    # offsets give disjoint streams: consecutive draws do not repeat
    a = philox.reference("bits", 8, 1, 0)
    b = philox.reference("bits", 8, 1, philox.groups("bits", 8))
    assert not np.array_equal(a, b)


def test_device_rng_state_is_saved_and_restored(cuda_double):
    flow.manual_seed(11)
    flow.rand(5, device="cuda")
    state = flow.get_rng_state()
    assert json.loads(json.dumps(state["cuda"])) == {"0": 2}  # Philox groups of 4 floats drawn
    x = flow.rand(1000, device="cuda").cpu().numpy()
    d = flow.nn.functional.dropout(flow.ones(64, device="cuda"), 0.5).cpu().numpy()
    flow.set_rng_state(copy.deepcopy(state))
    np.testing.assert_array_equal(flow.rand(1000, device="cuda").cpu().numpy(), x)
    np.testing.assert_array_equal(flow.nn.functional.dropout(flow.ones(64, device="cuda"), 0.5).cpu().numpy(), d)
    # the CPU stream is independent of the device one
    flow.set_rng_state(state)
    cpu = flow.rand(3).numpy()
    flow.set_rng_state(state)
    flow.rand(7, device="cuda")
    np.testing.assert_array_equal(flow.rand(3).numpy(), cpu)


def test_random_ops_on_cuda(cuda_double):
    flow.manual_seed(0)
    p = flow.randperm(50, device="cuda").cpu().numpy()
    assert sorted(p.tolist()) == list(range(50))
    r = flow.randint(3, 9, (1000,), device="cuda").cpu().numpy()
    assert r.min() == 3 and r.max() == 8
    n = flow.randn(20000, device="cuda").cpu().numpy()
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
    e = flow.empty(1000, device="cuda").exponential_().cpu().numpy()
    assert e.min() >= 0 and abs(e.mean() - 1) < 0.1
    m = flow.multinomial(flow.tensor([0.0, 1.0, 3.0], device="cuda"), 400, replacement=True).cpu().numpy()
    assert set(m.tolist()) <= {1, 2} and (m == 2).mean() > 0.6
    # the five .cpu() reads, and multinomial's sort (CuPy's Thrust sort waits for the stream)
    assert cuda_double._double.stats.syncs == 6


def test_libai_layers_never_move_to_a_visible_gpu_by_themselves(cuda_double):
    from libai.layers.utils import make_parameter
    from libai.utils import distributed as dist
    assert flow.cuda.is_available()
    assert dist.get_layer_placement(0).type == "cpu"
    dist.set_device_type("cuda")
    try:
        p = make_parameter((4, 3), flow.nn.init.normal_, dist.get_layer_placement(0), [flow.sbp.broadcast])
        assert p.placement.type == "cuda" and p.to_local().device.type == "cuda"
    finally:
        dist.set_device_type("cpu")


def test_cuda_layers_without_a_gpu_is_an_error_at_setup(tmp_path):
    """train.dist.device_type=cuda on a machine without CUDA stops at setup, naming the key (any
    GPU of this machine hidden from the run)."""
    import subprocess
    import sys
    from gpt2.gpt2_helpers import CONFIG, TRAIN_NET, env
    proc = subprocess.run([sys.executable, TRAIN_NET, "--config-file", CONFIG, f"train.output_dir={tmp_path}",
                           "train.dist.device_type=cuda", "train.train_iter=1"],
                          env=dict(env(), CUDA_VISIBLE_DEVICES=""), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "train.dist.device_type='cuda' but CUDA is not available" in proc.stderr


def test_philox_source_compiles_with_nvrtc():
    from nvrtc_helper import nvrtc_compiler
    log = nvrtc_compiler()(philox.SOURCE, [f"engine_philox_{kind}" for kind in philox.PER_GROUP])
    assert "warning" not in log.lower(), log


def test_shard_dropout_on_cuda_draws_from_a_philox_stream(cuda_double):
    """A split global tensor's dropout on CUDA: the generator's device stream draws for every
    shard at once, in parts of the largest shard's size, and each shard takes its own part
    (disjoint numbers, a shard drawn again from the same state is the same, the stream moves
    alike whatever the shard's size); no curand generator."""
    from engine.kernels import philox
    from engine.ops.dropout import ShardDropout
    x = cuda_double.ones((4, 9), dtype=np.float32)  # 36 values: 9 Philox blocks per shard
    gen = flow.Generator().manual_seed(3)
    y0, m0 = ShardDropout.forward(None, x, 0.5, gen, shard=(1,), shard_index=(0, 2, 36))
    after = gen.get_state()["cuda"]
    gen.manual_seed(3)
    x1 = cuda_double.ones((3, 9), dtype=np.float32)  # a balanced split's smaller shard (7 rows over 2)
    y1, m1 = ShardDropout.forward(None, x1, 0.5, gen, shard=(2,), shard_index=(1, 2, 36))
    assert gen.get_state()["cuda"] == after == {"0": 18}  # the same draw on either rank: lockstep
    gen.manual_seed(3)
    y2, _ = ShardDropout.forward(None, x, 0.5, gen, shard=(1,), shard_index=(0, 2, 36))
    assert np.array_equal(y0.get(), y2.get())
    u = philox.reference("uniform_float", 72, gen.device_stream(0).seed, 0)  # the whole draw: shard 1 from 36
    np.testing.assert_array_equal(m0.get().reshape(-1), (u[:36] >= 0.5) * np.float32(2.0))
    np.testing.assert_array_equal(m1.get().reshape(-1), (u[36:63] >= 0.5) * np.float32(2.0))
    assert set(np.unique(y0.get()).tolist()) <= {0.0, 2.0}
    assert "cupy.random.Generator" not in str(cuda_double._double.stats.names)
