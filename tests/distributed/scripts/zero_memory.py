"""Per-rank bytes under ZeRO on n data-parallel ranks: a GPT-2 (every parameter divides by n)
trained 2 steps, plain and with stages 1, 2 and 3. With AdamW the optimizer state bytes are 1/n
of the plain run's (stage 3: the parameters too); with SGD + momentum (an update linear in the
gradients, so rounding differences stay rounding-sized: Adam would magnify the noise of the
attention key bias, whose gradient is exactly zero) the parameters end equal to the plain run's."""
import numpy as np

import engine as flow
from engine.distributed.zero import ZeroRedundancy
from libai.models import GPTForPreTraining
from libai.utils import distributed as dist

n = flow.env.get_world_size()
r = flow.env.get_rank()
dist.setup_dist_util({"data_parallel_size": n, "tensor_parallel_size": 1, "pipeline_parallel_size": 1})
ids = np.random.default_rng(0).integers(0, 128, (2 * n, 17))
placement = dist.get_layer_placement(0)
batch = {"input_ids": flow.tensor(ids[:, :-1], placement=placement, sbp=flow.sbp.split(0)),
         "labels": flow.tensor(ids[:, 1:], placement=placement, sbp=flow.sbp.split(0))}


def train(stage, make_optimizer):
    flow.manual_seed(0)
    model = GPTForPreTraining(hidden_layers=2, vocab_size=128, hidden_size=32, num_attention_heads=4,
                              max_seq_length=16)
    opt = make_optimizer(model.parameters())
    zero = ZeroRedundancy(opt, stage, axis=0) if stage else None
    for _ in range(2):
        if zero is not None and zero.defers_grad_sync:
            with flow.distributed.no_grad_sync():
                model(**batch)["lm_loss"].backward()
        else:
            model(**batch)["lm_loss"].backward()
        if zero is not None:
            zero.reduce_gradients()
        flow.distributed.sync_grads([p for g in opt.param_groups for p in g["params"]])
        opt.step()
        if zero is not None:
            zero.gather_parameters()
            zero.zero_grad()
        opt.zero_grad()
    state = sum(v._data.nbytes for st in opt.state.values() for v in st.values() if getattr(v, "ndim", 0) > 0)
    params = sum(p._data.nbytes for p in model.parameters())
    logical = {k: v.detach().to_global(sbp=flow.sbp.broadcast).to_local().numpy()
               for k, v in model.state_dict().items()}
    if zero is not None:
        assert zero.local_bytes() == {"parameters": params, "optimizer_state": state}
    return state, params, logical


def adamw(params):
    return flow.optim.AdamW(params, lr=1e-2)


def sgd(params):
    return flow.optim.SGD(params, lr=0.1, momentum=0.9)


plain_state, plain_params, _ = train(0, adamw)
_, _, plain_values = train(0, sgd)
for stage in (1, 2, 3):
    state, params, _ = train(stage, adamw)
    assert state * n == plain_state, (stage, state, plain_state)
    assert params * n == plain_params if stage == 3 else params == plain_params, (stage, params, plain_params)
    _, _, values = train(stage, sgd)
    for k in plain_values:
        np.testing.assert_allclose(values[k], plain_values[k], rtol=1e-5, atol=1e-7, err_msg=f"stage {stage} {k}")
    if r == 0:
        print(f"ZeRO stage {stage} on {n} ranks: optimizer state {state} of {plain_state} bytes per rank, "
              f"parameters {params} of {plain_params}")
