"""Module.to_global / Module.to_local (OneFlow's) on n ranks: parameters, gradients and buffers
become global in place with the requested SBP, and forward/backward match the local module.
Also run in a single process (world size 1) by tests/distributed/test_module_to_global.py."""
import numpy as np

import engine as flow
from engine import nn
from engine.distributed import sbp as S

r = flow.env.get_rank()
n = flow.env.get_world_size()
P = flow.placement("cpu", list(range(n)))
rng = np.random.default_rng(11)


def mlp(seed):
    flow.manual_seed(seed)  # the same seed on every rank: B parameters must be equal
    return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))


def grads(model):
    return {k: p.grad.numpy() for k, p in model.named_parameters()}


def broadcast_matches_local():
    ref, model = mlp(3), mlp(3)
    params = dict(model.named_parameters())
    opt = flow.optim.SGD(model.parameters(), lr=0.1)
    assert model.to_global(placement=P, sbp=S.broadcast) is model
    for k, p in model.named_parameters():
        assert p is params[k] and isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf, k
        assert p.is_global and p.placement == P and p.sbp == (S.broadcast,), k
    for k, b in model.named_buffers():
        assert b.is_global and b.sbp == (S.broadcast,), k

    X = rng.standard_normal((4 * n, 6)).astype(np.float32)
    y_ref = ref(flow.tensor(X))
    (y_ref ** 2).sum().backward()
    x = flow.tensor(X, placement=P, sbp=S.split(0))  # data parallel: each rank its rows
    y = model(x)
    assert y.is_global
    (y ** 2).sum().backward()
    out = y.detach().to_global(sbp=S.broadcast).to_local().numpy()
    assert np.allclose(out, y_ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    want = grads(ref)
    for k, p in model.named_parameters():
        assert p.grad.is_global and p.grad.sbp == (S.broadcast,), k  # P gradients all-reduced by leaf boxing
        assert np.allclose(p.grad.to_local().numpy(), want[k], rtol=1e-4, atol=1e-5), k
    bn, bn_ref = model[1], ref[1]
    assert np.allclose(bn.running_mean.to_local().numpy(), bn_ref.running_mean.numpy(), rtol=1e-4, atol=1e-6)

    opt.step()  # the optimizer built before the conversion updates the global parameters
    flow.optim.SGD(ref.parameters(), lr=0.1).step()
    for (k, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.is_global and np.allclose(p.detach().to_local().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-5), k

    assert model.to_local() is model
    for k, p in model.named_parameters():
        assert p is params[k] and not p.is_global and not p.grad.is_global, k


def split_matches_local():
    """Each rank's Linear(6, 4) holds its rows of a Linear(6, 4 n): to_global(S(0)) makes it."""
    flow.manual_seed(5)
    ref = nn.Linear(6, 4 * n)
    shard = nn.Linear(6, 4)
    with flow.no_grad():
        shard.weight.copy_(ref.weight[4 * r:4 * r + 4])
        shard.bias.copy_(ref.bias[4 * r:4 * r + 4])
    shard.to_global(P, [S.split(0)])
    assert tuple(shard.weight.shape) == (4 * n, 6) and shard.weight.sbp == (S.split(0),)
    assert np.allclose(shard.weight.detach().to_global(sbp=S.broadcast).to_local().numpy(), ref.weight.detach().numpy())

    X = rng.standard_normal((3, 6)).astype(np.float32)
    y_ref = ref(flow.tensor(X))
    (y_ref ** 3).sum().backward()
    y = shard(flow.tensor(X, placement=P, sbp=S.broadcast))  # tensor parallel: output S(1)
    (y ** 3).sum().backward()
    out = y.detach().to_global(sbp=S.broadcast).to_local().numpy()
    assert np.allclose(out, y_ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert shard.weight.grad.sbp == (S.split(0),)
    assert np.allclose(shard.weight.grad.to_local().numpy(), ref.weight.grad.numpy()[4 * r:4 * r + 4], rtol=1e-4,
                       atol=1e-5)
    # global -> global: placement None keeps the placement, the parameters are boxed to B
    shard.to_global(sbp=S.broadcast)
    assert shard.weight.sbp == (S.broadcast,) and shard.weight.grad.sbp == (S.broadcast,)
    assert np.allclose(shard.weight.grad.to_local().numpy(), ref.weight.grad.numpy(), rtol=1e-4, atol=1e-5)


def gradients_and_errors():
    model = mlp(7)
    model(flow.tensor(rng.standard_normal((4, 6)).astype(np.float32))).sum().backward()  # same data on every rank
    g = model[0].weight.grad.numpy()
    model.to_global(P, S.broadcast)
    assert model[0].weight.grad.is_global and model[0].weight.grad.sbp == (S.broadcast,)
    assert np.array_equal(model[0].weight.grad.to_local().numpy(), g)
    model.to_local()

    # S(0) of BatchNorm's 0-dim num_batches_tracked is refused, naming it, and nothing changes
    try:
        model.to_global(P, S.split(0))
    except ValueError as e:
        assert "buffer '1.num_batches_tracked'" in str(e), e
    else:
        raise AssertionError("to_global(S(0)) of a 0-dim buffer must fail")
    assert not any(t.is_global for t in list(model.parameters()) + list(model.buffers()))
    try:
        model.to_global(sbp=S.broadcast)  # a local module needs a placement
    except ValueError as e:
        assert "parameter '0.weight'" in str(e) and "placement" in str(e), e
    else:
        raise AssertionError("to_global without a placement must fail on a local module")
    try:
        model.to_local()
    except RuntimeError as e:
        assert "already local" in str(e), e
    else:
        raise AssertionError("to_local of a local module must fail")


def main():
    broadcast_matches_local()
    split_matches_local()
    gradients_and_errors()
    if r == 0:
        print(f"module to_global OK on {n} ranks")


if __name__ == "__main__":
    main()
