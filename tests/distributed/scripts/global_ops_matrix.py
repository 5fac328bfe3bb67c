"""Every OpCase of tests/op_cases.py on GLOBAL inputs, against PyTorch on the logical values.

Usage (one launch per configuration, see tests/distributed/test_global_ops.py):
    mpiexec -n N python -m engine.distributed.run global_ops_matrix.py MESH FRACTION [IDS...]
  MESH      "1d" (placement over all ranks) or "2x2" (ranks [[0,1],[2,3]])
  FRACTION  share of the cases to run (a seeded sample, the same on every rank); 1 = all
  IDS       optional case ids (or id prefixes) to run instead of the sample (debugging)

Per case, every rank draws the SAME random inputs (the harness's `Input.draw`), turns each into
a global tensor with a RANDOM SBP (seeded by the case id and the configuration, so identical on
all ranks) chosen among the valid ones for its shape: S(axis) where the extent is at least the
ranks that split it, B, and P for float inputs (built as B.to_global(sbp=P): exact, one rank
keeps the value). The case's unchanged `fn` runs with m=engine on the global tensors and with
m=torch on the logical values; forward outputs (`.numpy()` of a global output gathers the
logical value) and input gradients (backward of the same random upstream gradient, given as a
global B tensor) are compared with harness.assert_close and the case's tolerances.

A failure in one case is recorded and the run goes on (every rank reaches the same verdicts
because the compared values are gathered logical values); the script exits non-zero at the end
when any case failed, after rank 0 printed the list.
"""
import faulthandler
import os
import random
import sys
import time
import traceback
import zlib

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/ (harness, op_cases)

import engine as flow  # noqa: E402
from engine.distributed import comm  # noqa: E402
from engine.distributed import sbp as SBP  # noqa: E402
import harness  # noqa: E402

torch.set_num_threads(1)
from harness import Input, OpCase, _make_pair, _outputs, assert_close  # noqa: E402
from op_cases import ALL_CASES  # noqa: E402

# Cases that cannot run on global inputs, with the reason. Keep this short.
SKIP = {
    # dispatch.py runs an op's backward on shards with local ops, so a backward cannot itself be
    # recorded: create_graph=True on global tensors raises NotImplementedError (documented there)
    "conv2d-double-backward": "create_graph=True (double backward) is not supported on global tensors",
    "max_pool2d-double-backward": "create_graph=True (double backward) is not supported on global tensors",
    "unfold-double-backward": "create_graph=True (double backward) is not supported on global tensors",
    # documented (docs/engine.md, "In-place operations"): a recorded in-place op on a view of a
    # global tensor rebinds the view only, not its base
    "index_fill-inplace-view": "a recorded in-place op through a view does not reach a global base",
    # the case builds its 0-d target inside with m.tensor(...), a local tensor; an op mixing local
    # and global inputs is an error by design (docs/global_tensor.md)
    "cosine_embedding_loss-0d-target": "the case's own target is a local tensor beside global inputs",
}

# Cases whose inputs are never made partial (P), with the reason.
NO_PARTIAL = {
    # x / 0.0 on a P input: the P / B -> P signature (rules/elementwise.py: a partial dividend over a
    # broadcast divisor stays partial) is exact for finite results only; the zero shards of the
    # other ranks give 0/0 = nan
    "isnan-inf": "P / 0.0 turns the other shards' zeros into nan (P/B is exact for finite values)",
    "isinf-inf": "as isnan-inf",
    "isfinite-inf": "as isnan-inf",
}


# Rules the OpCases of tests/ops barely reach (x[key] is a Tensor method, its parity cases live
# in tests/test_indexing_errors.py): extra cases run through the same machinery.
_X = Input((4, 6, 5))
EXTRA_CASES = [
    OpCase("getitem", lambda m, x: x[1], [_X], name="int"),
    OpCase("getitem", lambda m, x: x[:, 1:4], [_X], name="slice"),
    OpCase("getitem", lambda m, x: x[..., None, 0], [_X], name="ellipsis-none-int"),
    OpCase("getitem", lambda m, x: x[None, :, 2], [_X], name="none-int"),
    OpCase("getitem", lambda m, x: x[:, :, ::2], [_X], name="step"),
    OpCase("getitem", lambda m, x: x[1:, ..., :2], [_X], name="slice-ellipsis"),
    OpCase("getitem", lambda m, x, i: x[i], [_X, Input(dtype="int64", value=np.array([3, 0, 3]))], name="int-array"),
    OpCase("getitem", lambda m, x, k: x[k], [Input((4, 6)), Input((4, 6), "bool", "bool")], name="bool-mask"),
    OpCase("transpose", lambda m, x: x.transpose(0, 2).reshape(5, 24), [_X], name="reshape"),
    OpCase("unbind", lambda m, x: x.unbind(1), [_X], name="dim1"),
    OpCase("chunk", lambda m, x: x.chunk(2, dim=2), [_X], name="dim2"),
]


def _float(dt):
    return dt.startswith("float") or dt == "bfloat16"


def choose_sbp(rng, shape, dtype, placement, partial=True):
    """A random valid nd-SBP for a logical `shape` on `placement` (one entry per mesh axis)."""
    hier = placement.hierarchy
    out = []
    parts = {}
    for k, n in enumerate(hier):
        cands = [SBP.broadcast]
        for a, e in enumerate(shape):
            if e >= parts.get(a, 1) * n:
                cands.append(SBP.split(a))
        if _float(dtype) and partial:
            cands.append(SBP.partial_sum)
        s = rng.choice(cands)
        if s.is_split:
            parts[s.axis] = parts.get(s.axis, 1) * n
        out.append(s)
    return tuple(out)


def make_global_input(inp, array, placement, sbp):
    """The engine leaf for one input: the harness's local tensor (same layout, dtype, noncontig),
    read as B on the placement, then boxed to `sbp`."""
    f, t = _make_pair(inp, array)
    rg = f.requires_grad
    g = f.detach().to_global(placement=placement, sbp=(SBP.broadcast,) * placement.ndim)
    if any(not s.is_broadcast for s in sbp):
        g = g.to_global(sbp=sbp)
    g = g.detach()
    if rg:
        g.requires_grad_(True)
    return g, t


def run_case(case, placement, seed, cfg):
    rng = np.random.default_rng(seed)
    arrays = [inp.draw(rng) for inp in case.inputs]
    srng = random.Random(zlib.crc32(f"{case.id}/{cfg}".encode()))
    fs, ts, sbps = [], [], []
    for inp, a in zip(case.inputs, arrays):
        shape = a.shape  # the logical shape is the drawn one (noncontig only changes the layout)
        sbp = choose_sbp(srng, shape, inp.dtype, placement, case.id not in NO_PARTIAL)
        f, t = make_global_input(inp, a, placement, sbp)
        fs.append(f)
        ts.append(t)
        sbps.append(sbp)
    desc = ", ".join(f"{list(a.shape)}:{'/'.join(map(repr, s))}" for a, s in zip(arrays, sbps))
    if os.environ.get("MATRIX_VERBOSE") and comm.get_rank() == 0:
        print(f"  start {case.id} {desc}", flush=True)
    out_t = case.fn(torch, *ts)
    out_f = case.fn(flow, *fs)
    outs_t = _outputs(out_t)
    outs_f = _outputs(out_f)
    for o in outs_f:
        if isinstance(o, flow.Tensor) and o._global is None:
            raise AssertionError("an output of an op on global inputs is a local tensor")
    assert_close(outs_f, outs_t, case.rtol, case.atol, f"{case.id} forward")
    if not case.backward:
        return desc
    diff_t, diff_f, grads = [], [], []
    for f, t in zip(outs_f, outs_t):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            assert f.requires_grad, f"{case.id}: engine output does not require grad but torch's does"
            g = rng.standard_normal(tuple(t.shape)).astype(np.float32)
            diff_t.append(t)
            diff_f.append(f)
            grads.append(g)
    if not diff_t:
        return desc
    torch.autograd.backward(diff_t, [torch.from_numpy(g).to(t.dtype) for g, t in zip(grads, diff_t)])
    bsbp = (SBP.broadcast,) * placement.ndim
    flow.autograd.backward(diff_f, [flow.tensor(g, placement=placement, sbp=bsbp).to(f.dtype)
                                    for g, f in zip(grads, diff_f)])
    ref = harness._float64_reference_grads(case, arrays, grads) if case.extra.get("float64_reference") else None
    for i, (f, t) in enumerate(zip(fs, ts)):
        if not t.requires_grad:
            continue
        what = f"{case.id} grad of input {i}"
        if t.grad is None:
            assert f.grad is None or not np.any(harness.to_numpy(f.grad)), f"{what}: torch has none, engine nonzero"
            continue
        assert f.grad is not None, f"{what}: engine produced no gradient"
        assert f.grad._global is not None, f"{what}: the gradient of a global leaf is local"
        if ref is None:
            assert_close(f.grad, t.grad, case.rtol, case.atol, what)
        else:
            harness.assert_as_accurate_as_torch(f.grad, t.grad, ref[i], case.rtol, case.atol, what)
    return desc


def _install_coverage():
    """MATRIX_COVERAGE=1: count, per op class, the signatures chosen other than all-broadcast
    (evidence that the rules' split/partial signatures are exercised, not just the default); with
    dispatch's decision cache each distinct call counts once."""
    from engine.distributed import dispatch

    counts, current = {}, [None]
    rule_for, choose = dispatch.rule_for, dispatch.choose

    def rule_for_(cls):
        current[0] = cls.name or cls.__name__
        return rule_for(cls)

    def choose_(*a, **k):
        sig = choose(*a, **k)
        c = counts.setdefault(current[0], [0, 0])
        c[0 if sig.all_broadcast else 1] += 1
        return sig

    dispatch.rule_for, dispatch.choose = rule_for_, choose_
    return counts


def main():
    mesh = sys.argv[1] if len(sys.argv) > 1 else "1d"
    fraction = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    only = sys.argv[3:]
    rank, world = comm.get_rank(), comm.get_world_size()
    device = harness.DEVICE  # ENGINE_TEST_DEVICE=cuda: CUDA placements, one GPU per rank
    if mesh == "2x2":
        assert world == 4, "the 2x2 mesh needs 4 ranks"
        placement = flow.placement(device, [[0, 1], [2, 3]])
    else:
        placement = flow.placement(device, list(range(world)))
    cfg = f"{mesh}-{world}"
    cases = [c for c in ALL_CASES + EXTRA_CASES if c.id not in SKIP]
    skipped = [c.id for c in ALL_CASES if c.id in SKIP]
    if only:
        cases = [c for c in cases if any(c.id == o or c.id.startswith(o) for o in only)]
    elif fraction < 1:
        pick = random.Random(f"sample-{cfg}")
        cases = [c for c in cases if pick.random() < fraction]
    counts = _install_coverage() if os.environ.get("MATRIX_COVERAGE") else None
    failures = []
    t0 = time.time()
    verbose = os.environ.get("MATRIX_VERBOSE")
    for idx, case in enumerate(cases):
        tc = time.time()
        if verbose:
            faulthandler.dump_traceback_later(30, exit=True)
        seed = zlib.crc32(case.id.encode()) % 1000
        err = None
        desc = ""
        try:
            with np.errstate(all="ignore"):
                desc = run_case(case, placement, seed, cfg)
        except Exception as e:  # noqa: BLE001 - recorded, reported at the end
            err = f"{type(e).__name__}: {e}".splitlines()
            err = " | ".join(err[:6])
            if verbose:
                err += "\n" + traceback.format_exc()
        # all ranks agree on the verdict (a rank-local failure must not desync the next case)
        flags = comm.all_gather(np.array([0 if err is None else 1], dtype=np.int64))
        if err is None and flags.any():
            err = "failed on another rank"
        if err is not None:
            failures.append((case.id, desc, err))
        if verbose and (rank == 0 or err is not None):
            print(f"[{idx}] {case.id} {'OK' if err is None else 'FAIL'} {desc} {time.time() - tc:.2f}s", flush=True)
            if err is not None:
                print(err, flush=True)
    dt = time.time() - t0
    if rank == 0:
        for cid, desc, err in failures:
            print(f"FAIL {cid} [{desc}]: {err}")
        print(f"MATRIX {cfg}: ran {len(cases)} cases, {len(cases) - len(failures)} passed, "
              f"{len(failures)} failed, {len(skipped)} skipped, {dt:.1f}s", flush=True)
        for cid in skipped:
            print(f"SKIP {cid}: {SKIP[cid]}")
        if counts is not None:
            for name, (b, other) in sorted(counts.items()):
                print(f"COVERAGE {name}: {other} split/partial, {b} all-broadcast")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
