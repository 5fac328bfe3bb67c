"""DistributedDataParallel on every rank against single-process training on the whole batch.

Every rank builds the reference itself (it knows the whole batch), so the check needs no
communication beyond what DDP does. float64 throughout: the only differences are rounding.
"""
import numpy as np

import engine as flow
import engine.distributed as dist
import engine.nn.functional as F
from engine.distributed import comm
from engine.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
B = 3  # rows per rank (odd on purpose)
TOL = 1e-12


def raises(exc, fn, *args, match=None, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert match is None or match in str(e), (match, str(e))
        return
    raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")


def mlp(seed):
    flow.manual_seed(seed)
    return flow.nn.Sequential(flow.nn.Linear(5, 7), flow.nn.Tanh(), flow.nn.Linear(7, 6), flow.nn.Tanh(),
                              flow.nn.Linear(6, 3)).double()


def batch(step, rows):
    rng = np.random.default_rng(50 + step)
    return (flow.tensor(rng.standard_normal((rows, 5))), flow.tensor(rng.standard_normal((rows, 3))))


def mine(x):
    return x[r * B:(r + 1) * B]


def params_of(m):
    return [p.detach().numpy().copy() for p in m.parameters()]


def assert_same(a, b, tol=TOL, what=""):
    for i, (u, v) in enumerate(zip(a, b)):
        np.testing.assert_allclose(u, v, rtol=tol, atol=tol, err_msg=f"{what} parameter {i}")


# --------------------------------------------------------------- construction copies rank 0's state
model = mlp(100 + r)  # every rank starts different
# overlap: when the first layer's gradients (the last to arrive) come, the later buckets are in flight
# (this hook is registered before DDP's, so it runs just before DDP's own hook on the same parameter)
seen, holder = [], []
model[0].weight.register_hook(lambda g: seen.append(holder[0]._next))
model[0].bias.register_hook(lambda g: seen.append(holder[0]._next))
ddp = DDP(model, bucket_cap_mb=0.0002)  # ~210 bytes: buckets [b3 W3 b2], [W2], [b1 W1]
holder.append(ddp)
assert_same(params_of(model), params_of(mlp(100)), 0, "after construction")
assert [b.indices for b in ddp._buckets] == [[5, 4, 3], [2], [1, 0]], [b.indices for b in ddp._buckets]
assert ddp.module is model and list(ddp.state_dict())[0] == "module.0.weight"

# --------------------------------------------------------------- training parity, several buckets
ref = mlp(100)
opt = flow.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
ref_opt = flow.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
for step in range(4):
    x, y = batch(step, B * n)
    opt.zero_grad()
    with comm.stats.recording() as rec:
        F.mse_loss(ddp(mine(x)), mine(y)).backward()
    assert sum(1 for name, _ in rec.calls if name == "all_reduce") == (3 if n > 1 else 0), rec.calls
    opt.step()
    ref_opt.zero_grad()
    F.mse_loss(ref(x), y).backward()
    ref_opt.step()
    assert_same(params_of(model), params_of(ref), what=f"step {step}")
assert seen == [2] * 8, seen

# --------------------------------------------------------------- the default (one bucket), float32
model32 = mlp(7 + r).float()
ddp32 = DDP(model32)
assert len(ddp32._buckets) == 1
ref32 = mlp(7).float()
x, y = batch(9, B * n)
x32, y32 = x.float(), y.float()
F.mse_loss(ddp32(mine(x32)), mine(y32)).backward()
F.mse_loss(ref32(x32), y32).backward()
assert_same([p.grad.numpy() for p in model32.parameters()], [p.grad.numpy() for p in ref32.parameters()], 1e-5)

# --------------------------------------------------------------- gradient accumulation: no_sync / nanoGPT's flag


def accumulate(ddp_model, micro, how):
    ddp_model.module.zero_grad()
    for k in range(micro):
        x, y = batch(20 + k, B * n)
        last = k == micro - 1
        if how == "no_sync" and not last:
            with ddp_model.no_sync():
                F.mse_loss(ddp_model(mine(x)), mine(y)).backward()
        else:
            if how == "flag":
                ddp_model.require_backward_grad_sync = last
            F.mse_loss(ddp_model(mine(x)), mine(y)).backward()
    ddp_model.require_backward_grad_sync = True
    return [p.grad.numpy().copy() for p in ddp_model.module.parameters()]


acc = DDP(mlp(3), bucket_cap_mb=0.0002)
synced = accumulate(acc, 3, "every step")
unsynced = accumulate(acc, 3, "no_sync")
flagged = accumulate(acc, 3, "flag")
ref = mlp(3)
for k in range(3):
    x, y = batch(20 + k, B * n)
    F.mse_loss(ref(x), y).backward()
expect = [p.grad.numpy() for p in ref.parameters()]
assert_same(synced, expect, what="synced accumulation")
assert_same(unsynced, expect, what="no_sync accumulation")
assert_same(flagged, expect, what="require_backward_grad_sync accumulation")
with acc.no_sync():  # no all-reduce at all inside no_sync
    with comm.stats.recording() as rec:
        F.mse_loss(acc(mine(batch(0, B * n)[0])), mine(batch(0, B * n)[1])).backward()
    assert not [c for c in rec.calls if c[0] == "all_reduce"], rec.calls


# --------------------------------------------------------------- find_unused_parameters
class TwoHeads(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = flow.nn.Linear(5, 4)
        self.a = flow.nn.Linear(4, 3)
        self.b = flow.nn.Linear(4, 3)
        self.never = flow.nn.Linear(4, 3)

    def forward(self, x, use_b):
        h = self.body(x).tanh()
        return self.a(h) + (self.b(h) if use_b else 0)


def two_heads():
    flow.manual_seed(11)
    return TwoHeads().double()


# Two synced iterations without zero_grad: head b is used by the even ranks, then by the odd ones.
# A rank that does not use b contributes its current .grad (the first average), as torch's reducer.
fu = DDP(two_heads(), find_unused_parameters=True, bucket_cap_mb=0.0001)
ref = two_heads()
for it in range(2):
    uses_b = [q % 2 == it for q in range(n)]
    x, y = batch(30 + it, B * n)
    F.mse_loss(fu(mine(x), uses_b[r]), mine(y)).backward()
    sum(F.mse_loss(ref(x[q * B:(q + 1) * B], uses_b[q]), y[q * B:(q + 1) * B]) for q in range(n)).div(n).backward()
    for p in list(fu.parameters()) + list(ref.parameters()):  # .grad changed in place between backwards
        if p.grad is not None:                                  # (as GradScaler.unscale_ does)
            p.grad.mul_(0.5)
for (name, p), q in zip(fu.module.named_parameters(), ref.parameters()):
    if name.startswith("never"):
        assert p.grad is None and q.grad is None, name  # no rank used it: left as it was
    else:
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=TOL, atol=TOL, err_msg=name)

# without find_unused_parameters an unused parameter leaves the reduction unfinished: the next forward says so
strict = DDP(two_heads())
F.mse_loss(strict(mine(x), True), mine(y)).backward()
raises(RuntimeError, strict, mine(x), True, match="find_unused_parameters=True")

# --------------------------------------------------------------- buffers follow rank 0


class Scaled(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = flow.nn.Linear(2, 2).double()
        self.register_buffer("scale", flow.ones(2, dtype=flow.float64))

    def forward(self, x):
        return self.lin(x) * self.scale


for broadcast_buffers in (True, False):
    m = Scaled()
    d = DDP(m, broadcast_buffers=broadcast_buffers)
    m.scale.fill_(float(r + 1))
    d(flow.ones(1, 2, dtype=flow.float64))
    assert float(m.scale[0]) == (1.0 if broadcast_buffers else r + 1), (broadcast_buffers, m.scale)

# --------------------------------------------------------------- different models on different ranks
if n > 1:
    raises(RuntimeError, DDP, flow.nn.Linear(3 + (r == n - 1), 2), match="same model on every rank")

dist.destroy_process_group()
print(f"torch-style DDP OK on {n} ranks", flush=True)
