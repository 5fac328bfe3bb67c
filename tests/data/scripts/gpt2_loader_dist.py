"""GPT-2 batches become global tensors on every topology (run on 4 ranks under mpiexec).

    python -m engine.distributed.run gpt2_loader_dist.py DATA_PREFIX

For dp x tp x pp in (4,1,1), (2,2,1), (1,4,1), (2,1,2): each rank builds the train loader,
takes one micro-batch, converts it with Instance.to_model_inputs and checks the global tensor:
logical shape [micro * dp, seq], sbp from get_nd_sbp([S(0), B]), placement of the input (first
stage) / label (last stage) layer, and its content = the micro-batches of all dp ranks in rank
order (recomputed here from samplers of each dp rank).
"""
import sys

import numpy as np

import engine as flow
from engine.distributed import comm
from libai.config import LazyCall
from libai.data import CyclicSampler, GPT2Dataset, build_nlp_train_val_test_loader
from libai.utils import distributed as dist

PREFIX = sys.argv[1]
R = comm.get_rank()
MB, SEQ = 2, 16
B = flow.sbp.broadcast

for dp, tp, pp in ((4, 1, 1), (2, 2, 1), (1, 4, 1), (2, 1, 2)):
    dist._reset_dist_util()
    topo = dist.setup_dist_util({"data_parallel_size": dp, "tensor_parallel_size": tp,
                                 "pipeline_parallel_size": pp, "pipeline_num_layers": 2 * pp})
    train, _, _ = build_nlp_train_val_test_loader(
        dataset=[LazyCall(GPT2Dataset)(name="dist", data_prefix=PREFIX, seq_length=SEQ, seed=99)],
        splits=[[1.0, 0.0, 0.0]], weights=[1.0], train_val_test_num_samples=[64, 0, 0],
        train_batch_size=MB, test_batch_size=MB, seed=5)
    ds = train.dataset
    batch = next(iter(train))
    inputs = batch.to_model_inputs("cpu")
    # the global batch as every dp rank would load it
    want = []
    for r in range(dp):
        idx = next(iter(CyclicSampler(len(ds), MB, seed=5, data_parallel_rank=r, data_parallel_size=dp)))
        want.append(np.stack([ds.get_tokens(i) for i in idx]))
    want = np.concatenate(want)
    for key, layer, sl in (("input_ids", 0, slice(0, -1)), ("labels", -1, slice(1, None))):
        t = inputs[key]
        assert t.is_global and t.placement == dist.get_layer_placement(layer, "cpu"), (key, t.placement)
        assert tuple(t.sbp) == tuple(dist.get_nd_sbp([flow.sbp.split(0), B])), (key, t.sbp)
        full = t.to_global(placement=t.placement, sbp=[B] * t.placement.ndim)
        if t.placement.has_rank(R):  # (other pipeline stages hold no part of it)
            assert tuple(t.shape) == (MB * dp, SEQ), (key, t.shape)
            got = full.to_local().numpy()
            assert np.array_equal(got, want[:, sl]), (key, dp, tp, pp)
    comm.barrier()
    if R == 0:
        print(f"OK dp={dp} tp={tp} pp={pp}", flush=True)
